"""One prepared GPU check (issue 14): the CUDA paths proven and the cost side of 7B-class models measured.

Sections, most important first, so a run cut short still leaves what matters most:
1. `tests`: `pytest -m gpu` — greedy SSD == autoregressive on CUDA in bf16 for several masks (exact,
   or parted only at a numerical near-tie), CUDA-graph tiers lossless, sampling runs, host syncs;
2. `profiles`: weight-free LatencyProfiles (bf16) of the SmolLM2-135M, Qwen2.5-0.5B and Mistral-7B
   architectures at three context lengths — draft cost `c` vs `E/L`, `f(γ)` for γ + 1 = 2..9
   positions, the LM head's share of a step;
3. `engine_vs_hf`: at Mistral-7B shape with random weights, our SSD vs HF `assistant_early_exit`
   and our autoregressive path vs HF greedy `generate` (random weights give both the same
   rounds, so the speed ratio is meaningful; acceptance itself is not);
4. `estimator`: masks evaluated per second at Mistral-7B shape, both estimator modes, with the
   memory the reference cache takes;
5. `predictions`: the SmolLM2 and Qwen masks already measured on CPU (their acceptance, committed
   in `results/compare/xeon-amx/`) priced with the GPU profiles, next to the CPU verdict.

Writes `results/gpu/`: `gpu_check.json` (every section: status, seconds, data or traceback),
`README.md` (tables, rewritten after each section) and `pytest.log`. A section that fails records
its traceback and the next one runs; `--budget-s` skips sections that would start too late.

On the device (PyTorch 2.11 CUDA, transformers 5.17, no optuna/gguf/ray): `make gpu-wheels` here
puts the pinned transformers wheel in `.whl/`; `make gpu-check` there installs it with `--no-index`
and runs this script. Nothing here imports optuna, gguf or ray.
`--tiny` runs every section end to end on this CPU with tiny configs (a test does), so the script
cannot rot between GPU sessions; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import ESTIMATOR_MODES
from skipsearch.acceptance.prompts import EncodedPrompt
from skipsearch.acceptance.reference import build_reference
from skipsearch.bench.decode import DecodeSettings, measure
from skipsearch.bench.decoders import AR, EARLY_EXIT, HF, SSD, make_decoders
from skipsearch.bench.graphed_profile import measure_graphed_latency
from skipsearch.bench.lossless import check_runs
from skipsearch.bench.processes import profile_processes
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profile_summary import summary
from skipsearch.engine import GammaPolicy, Summary
from skipsearch.engine.sampling import GREEDY
from skipsearch.masks import SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.loading import load_model
from skipsearch.models.random_weights import RandomWeights, random_prompts
from skipsearch.models.runner import LayerwiseRunner

ROOT = Path(__file__).resolve().parents[1]
GAMMAS = tuple(range(1, 9))
CPU_MODELS = {"SmolLM2-135M": "smollm2-135m", "Qwen2.5-0.5B": "qwen2.5-coder-0.5b"}
CPU_COMPARISON = ROOT / "results" / "compare" / "xeon-amx"  # the CPU searches whose masks it prices


@dataclass(frozen=True)
class Plan:
    """The sizes of every section: the GPU plan fits 8 minutes on one H200, `tiny` a CPU test."""

    device: str
    dtype: str
    models: dict[str, str]  # label -> alias or config directory
    big: str  # the label of the 7B-shape model
    contexts: tuple[int, ...]
    positions: tuple[int, ...]
    repeats: int
    prompts: int
    prompt_tokens: int
    new_tokens: int
    decode_repeats: int
    exit_layer: int
    gamma: int
    ref_prompts: int
    ref_prompt_tokens: int
    ref_new_tokens: int
    masks: int
    test_timeout_s: int
    graph_context: int
    graph_gammas: tuple[int, ...]
    graph_repeats: int


GPU_PLAN = Plan(
    device="cuda",
    dtype="bfloat16",
    models={**CPU_MODELS, "Mistral-7B": "mistral-7b"},
    big="Mistral-7B",
    contexts=(128, 512, 2048),
    positions=tuple(range(1, 10)),
    repeats=10,
    prompts=2,
    prompt_tokens=128,
    new_tokens=64,
    decode_repeats=2,
    exit_layer=16,
    gamma=3,
    ref_prompts=16,
    ref_prompt_tokens=300,
    ref_new_tokens=64,
    masks=12,
    test_timeout_s=240,
    graph_context=512,
    graph_gammas=(1, 2, 3, 4),
    graph_repeats=20,
)

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_CONFIGS = {
    "tiny-llama": {"model_type": "llama", "vocab_size": 97, "tie_word_embeddings": True},
    "tiny-qwen2": {"model_type": "qwen2", "vocab_size": 89, "tie_word_embeddings": True},
    "tiny-mistral": {"model_type": "mistral", "vocab_size": 101, "sliding_window": 64},
}


def tiny_plan(folder: Path) -> Plan:
    """Every section on this CPU in seconds: tiny configs written to `folder`, tiny sizes."""
    models = {}
    for name, config in TINY_CONFIGS.items():
        directory = folder / name
        directory.mkdir(parents=True, exist_ok=True)
        data = {**TINY, **config, "num_hidden_layers": 4, "max_position_embeddings": 256, "eos_token_id": 0}
        (directory / "config.json").write_text(json.dumps(data))
        models[name] = str(directory)
    labels = list(models)
    return replace(
        GPU_PLAN,
        device="cpu",
        dtype="float32",
        models=dict(
            zip(["SmolLM2-135M", "Qwen2.5-0.5B", "Mistral-7B"], [models[n] for n in labels], strict=True)
        ),
        contexts=(8, 16),
        positions=(1, 2, 3),
        repeats=2,
        prompts=1,
        prompt_tokens=8,
        new_tokens=8,
        decode_repeats=1,
        exit_layer=2,
        ref_prompts=2,
        ref_prompt_tokens=8,
        ref_new_tokens=8,
        masks=2,
        graph_context=16,
        graph_gammas=(1, 2),
        graph_repeats=2,
    )


# -- 1. the CUDA tests ------------------------------------------------------------------------------
def run_tests(plan: Plan, out: Path) -> dict[str, Any]:
    """`pytest -m gpu` in a subprocess; its log goes to `pytest.log`, its counts into the report."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"]
    began = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=plan.test_timeout_s, check=False
    )
    log = done.stdout + done.stderr
    (out / "pytest.log").write_text(log)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", log)}
    return {"exit_code": done.returncode, "counts": counts, "seconds": time.perf_counter() - began}


# -- 2. weight-free profiles ------------------------------------------------------------------------
def run_profiles(plan: Plan, out: Path) -> dict[str, Any]:
    data = {}
    for label, model in plan.models.items():
        began = time.perf_counter()
        profile = profile_processes(
            model,
            plan.device,
            plan.dtype,
            plan.contexts,
            plan.positions,
            repeats=plan.repeats,
            processes=1,
            random_weights=RandomWeights(),
        )
        profile.save(out / f"profile-{label}.json")
        data[label] = {**describe_profile(profile), "seconds": time.perf_counter() - began}
        release()
    return data


def describe_profile(profile: LatencyProfile) -> dict[str, Any]:
    """What the report shows of one profile: c vs E/L at the quarters, f(γ), the head's share."""
    digest = summary(profile, GAMMAS)
    layers = profile.num_layers
    exits = sorted({max(1, round(layers * q / 4)) for q in (1, 2, 3)})
    return {
        "meta": dict(profile.meta),
        "num_layers": layers,
        "contexts": {
            str(context): {
                "step_ms": 1e3 * profile.step_time(context),
                "head_share": profile.weights(context).head / profile.step_time(context),
                "draft_cost": {str(e): digest.draft_cost[i][e - 1] for e in exits},
                "verify_cost": dict(zip(map(str, GAMMAS), digest.verify_cost[i], strict=True)),
            }
            for i, context in enumerate(profile.context_lengths)
        },
        "exits_naive": {str(e): e / layers for e in exits},
    }


# -- 3. our engine vs HF at 7B shape ----------------------------------------------------------------
def run_engine_vs_hf(plan: Plan, out: Path) -> dict[str, Any]:
    loaded = load_model(plan.models[plan.big], plan.device, plan.dtype, RandomWeights())
    runner = LayerwiseRunner(loaded.model)
    mask = SkipMask.prefix(runner.num_layers, plan.exit_layer)
    policy = GammaPolicy.fixed(plan.gamma)
    prompts = random_prompts(plan.prompts, plan.prompt_tokens, runner.config.vocab_size, seed=0)
    settings = DecodeSettings(GREEDY, plan.new_tokens, plan.decode_repeats, seed=0)
    measured = measure(
        partial(make_decoders, runner, loaded, mask, policy, max_new_tokens=plan.new_tokens),
        runner,
        prompts,
        settings,
        SSD,
        widest=None,
    )
    runs, summaries, lossless = measured.runs, measured.summaries(), measured.lossless
    hf_vs_ar = check_runs(runner, prompts, runs[AR], runs[HF])
    del loaded, runner, measured
    release()
    return {
        "mask": str(mask),
        "gamma": plan.gamma,
        "prompts": plan.prompts,
        "prompt_tokens": plan.prompt_tokens,
        "new_tokens": plan.new_tokens,
        "repeats": plan.decode_repeats,
        "summaries": {name: s.to_dict(summaries[HF], "hf") for name, s in summaries.items()},
        "ratios": {
            "ssd / hf-early-exit": ratio(summaries[SSD], summaries[EARLY_EXIT]),
            "autoregressive / hf-generate": ratio(summaries[AR], summaries[HF]),
            "ssd / autoregressive": ratio(summaries[SSD], summaries[AR]),
        },
        "lossless": lossless.to_dict(),
        "hf_vs_autoregressive": hf_vs_ar.to_dict(),
    }


def ratio(a: Summary, b: Summary) -> float:
    return a.tokens_per_second / b.tokens_per_second


# -- 4. estimator throughput at 7B shape ------------------------------------------------------------
def run_estimator(plan: Plan, out: Path) -> dict[str, Any]:
    loaded = load_model(plan.models[plan.big], plan.device, plan.dtype, RandomWeights())
    runner = LayerwiseRunner(loaded.model)
    ids = random_prompts(plan.ref_prompts, plan.ref_prompt_tokens, runner.config.vocab_size, seed=1)
    prompts = [EncodedPrompt(str(i), p) for i, p in enumerate(ids)]
    began = time.perf_counter()
    reference = build_reference(runner, prompts, plan.ref_new_tokens, with_kv=True)
    build_seconds = time.perf_counter() - began
    kv = (reference.keys.numel() + reference.values.numel()) * reference.keys.element_size()
    memory = {
        "reference_hidden_gib": reference.hidden.numel() * reference.hidden.element_size() / 2**30,
        "reference_kv_gib": kv / 2**30,
        "reference_build_seconds": build_seconds,
    }
    masks = random_masks(runner.num_layers, plan.masks)
    modes = {}
    for mode in ESTIMATOR_MODES:
        estimator = Estimator(runner, reference, mode)
        estimator.evaluate(masks[0])  # warm-up
        device_sync(plan.device)()
        began = time.perf_counter()
        for mask in masks:
            estimator.evaluate(mask)
        device_sync(plan.device)()
        seconds = time.perf_counter() - began
        modes[mode] = {"masks": len(masks), "seconds": seconds, "masks_per_second": len(masks) / seconds}
    if plan.device.startswith("cuda"):
        memory["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    positions = int((reference.lengths - reference.prompt_lengths).sum())
    del loaded, runner, reference
    release()
    return {"positions": positions, "prompts": plan.ref_prompts, "modes": modes, "memory": memory}


def random_masks(layers: int, count: int) -> list[SkipMask]:
    """Seeded sparse masks skipping a quarter to a half of the layers, first and last kept."""
    rng = random.Random(0)
    middle = range(1, layers - 1)
    return [
        SkipMask.from_layers(
            layers, sorted(rng.sample(middle, rng.randint(max(1, layers // 4), layers // 2)))
        )
        for _ in range(count)
    ]


# -- 5. CPU-measured masks priced on the GPU ---------------------------------------------------------
def run_predictions(plan: Plan, out: Path) -> dict[str, Any]:
    data = {}
    for label, alias in CPU_MODELS.items():
        profile = LatencyProfile.load(out / f"profile-{label}.json")
        rows = []
        for candidate in cpu_masks(CPU_COMPARISON / alias):
            mask = SkipMask.parse(candidate["mask"], candidate["num_layers"])
            scaled = scale_to_depth(profile, mask.num_layers)  # a no-op on the GPU plan
            curves = {
                str(context): [
                    tokens / Calibrated(scaled, mask, context).round_cost(gamma)
                    for gamma, tokens in zip(GAMMAS, candidate["tokens_per_round"], strict=True)
                ]
                for context in scaled.context_lengths
            }
            rows.append({**candidate, "gpu_speedup": curves})
        data[label] = rows
    return data


def cpu_masks(folder: Path) -> list[dict[str, Any]]:
    """The best mask of each strategy and seed in a committed comparison, with its CPU verdict and
    its tokens per round for γ = 1..8 (from the trial that measured it)."""
    with (folder / "comparison.csv").open() as handle:
        best = list(csv.DictReader(handle))
    found: dict[str, dict[str, Any]] = {}
    for row in best:
        if row["best_mask"] in found:
            continue
        with (folder / f"{row['strategy'].replace('@', '-')}-s{row['seed']}.csv").open() as handle:
            trial = next(t for t in csv.DictReader(handle) if t["mask"] == row["best_mask"])
        found[row["best_mask"]] = {
            "mask": row["best_mask"],
            "strategy": f"{row['strategy']} (seed {row['seed']})",
            "num_layers": int(trial["num_layers"]),
            "alpha": float(row["best_alpha"]),
            "cpu_speedup": float(row["best_score"]),
            "cpu_gamma": int(row["gamma_best"]),
            "tokens_per_round": [float(trial[f"tokens_per_round_{g}"]) for g in GAMMAS],
        }
    return list(found.values())


# -- 6. a graphed profile per model, and the CPU masks priced with it ---------------------------------
def run_graphed(plan: Plan, out: Path) -> dict[str, Any]:
    """Each model's graphed LatencyProfile at one context (`bench.graphed_profile`: every part of a
    pass replayed from its own CUDA graph, the per-round settle cost from real graphed rounds), and
    early exits at E/L = 1/4, 1/2, 3/4 and the CPU-measured masks of that shape priced with it by
    the library's calibrated form (`cost.calibrated.Calibrated`). A CPU mask's speedup at γ is its
    measured tokens per round over that round cost; the best γ is reported."""
    data = {}
    candidates = {label: cpu_masks(CPU_COMPARISON / alias) for label, alias in CPU_MODELS.items()}
    context, gammas = plan.graph_context, plan.graph_gammas
    for label, model in plan.models.items():
        loaded = load_model(model, plan.device, plan.dtype, RandomWeights())
        runner = LayerwiseRunner(loaded.model)
        layers = runner.num_layers
        latency = measure_graphed_latency(
            runner, (context,), range(1, max(gammas) + 2), plan.graph_repeats, model=label
        )
        step = latency.step_time(context)
        exits = sorted({max(1, round(layers * q / 4)) for q in (1, 2, 3)})
        named = {f"exit {e}": SkipMask.prefix(layers, e) for e in exits}
        measured = [c for c in candidates.get(label, []) if c["num_layers"] == layers]
        named |= {c["mask"]: SkipMask.parse(c["mask"], layers) for c in measured}
        forms = {name: Calibrated(latency, mask, context) for name, mask in named.items()}
        rows = {
            name: {
                "draft_cost": form.round_time(1).draft / step,
                "verify_cost": {str(g): form.round_time(g).verify / step for g in gammas},
                "overhead_cost": {str(g): latency.overhead(g) / step for g in gammas},
            }
            for name, form in forms.items()
        }
        for candidate in measured:
            form = forms[candidate["mask"]]
            speedups = {g: candidate["tokens_per_round"][g - 1] / form.round_cost(g) for g in gammas}
            gamma = max(speedups, key=speedups.__getitem__)
            row = rows[candidate["mask"]]
            row |= {k: candidate[k] for k in ("strategy", "alpha", "cpu_speedup", "cpu_gamma")}
            row |= {"graphed_speedup": speedups[gamma], "graphed_gamma": gamma}
        data[label] = {"full_step_ms": 1e3 * step, "layers": layers, "masks": rows}
        del loaded, runner
        release()
    return {"context": context, "repeats": plan.graph_repeats, "models": data}


# -- running and reporting --------------------------------------------------------------------------
SECTIONS: dict[str, Callable[[Plan, Path], dict[str, Any]]] = {
    "tests": run_tests,
    "profiles": run_profiles,
    "engine_vs_hf": run_engine_vs_hf,
    "estimator": run_estimator,
    "predictions": run_predictions,
    "graphed": run_graphed,
}


def release() -> None:
    """Hand freed device memory back between sections, so the next model's load fits."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment(plan: Plan) -> dict[str, Any]:
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda and plan.device == "cuda" else plan.device,
        "dtype": plan.dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "tiny": plan.device == "cpu",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def run(plan: Plan, out: Path, budget_s: float, only: list[str]) -> dict[str, Any]:
    """Run the sections in order; with `only`, the other sections of an earlier report in `out`
    are kept, so a second GPU session can redo or add sections without losing the first's."""
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "gpu_check.json"
    kept = json.loads(earlier.read_text())["sections"] if only and earlier.exists() else {}
    report: dict[str, Any] = {"environment": environment(plan), "plan": asdict(plan), "sections": {}}
    began = time.perf_counter()
    for name, section in SECTIONS.items():
        if only and name not in only:
            if name in kept:
                report["sections"][name] = kept[name]
            continue
        spent = time.perf_counter() - began
        if spent > budget_s:
            report["sections"][name] = {"status": "skipped", "reason": f"budget of {budget_s:.0f} s spent"}
        else:
            start = time.perf_counter()
            try:
                data = section(plan, out)
                report["sections"][name] = {"status": "ok", "data": data}
            except Exception:  # a broken section must not cost the ones after it
                report["sections"][name] = {"status": "failed", "traceback": traceback.format_exc()}
                release()
            report["sections"][name]["seconds"] = time.perf_counter() - start
        report["sections"][name]["started"] = report["environment"]["started"]
        write(report, out)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "README.md").write_text("\n".join(readme(report)) + "\n")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; a mask's `|` is escaped, so it stays inside its cell."""
    return [
        "| " + " | ".join(header) + " |",
        "|:---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
        "",
    ]


def readme(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    lines = [
        "# GPU check (issue 14)",
        "",
        f"Generated by `experiments/gpu_check.py` on {env['device']} ({env['dtype']}), torch {env['torch']} "
        f"(CUDA {env['cuda']}), transformers {env['transformers']}, started {env['started']}."
        + (" **Tiny CPU run: the numbers mean nothing.**" if env["tiny"] else ""),
        "",
    ]
    for name, section in report["sections"].items():
        started = f", run {section['started']}" if "started" in section else ""
        lines += section_lines(name, section, RENDER[name], started)
    return lines


def section_lines(
    name: str, section: dict[str, Any], render: Callable[[dict[str, Any]], list[str]], note: str = ""
) -> list[str]:
    """One section of a report: its heading with status and seconds, then its tables, its traceback
    (the last 2,000 characters) or why it was skipped."""
    lines = [f"## {name} — {section['status']} ({section.get('seconds', 0):.0f} s{note})", ""]
    if section["status"] == "failed":
        return [*lines, "```", section["traceback"].strip()[-2000:], "```", ""]
    if section["status"] == "ok":
        return [*lines, *render(section["data"])]
    return [*lines, section["reason"], ""]


def render_tests(data: dict[str, Any]) -> list[str]:
    counts = ", ".join(f"{n} {word}" for word, n in data["counts"].items()) or "nothing collected"
    return [f"`pytest -m gpu`: {counts} (exit code {data['exit_code']}); the log is `pytest.log`.", ""]


def render_profiles(data: dict[str, Any]) -> list[str]:
    lines = []
    for label, item in data.items():
        meta = item["meta"]
        exits = list(item["exits_naive"])
        header = [
            "context",
            "step ms",
            "head share",
            *(f"c E={e} (E/L {item['exits_naive'][e]:.2f})" for e in exits),
        ]
        header += [f"f({g})" for g in (1, 3, 8)]
        rows = [
            [
                context,
                f"{entry['step_ms']:.3f}",
                f"{entry['head_share']:.3f}",
                *(f"{entry['draft_cost'][e]:.3f}" for e in exits),
                *(f"{entry['verify_cost'][str(g)]:.3f}" for g in (1, 3, 8)),
            ]
            for context, entry in item["contexts"].items()
        ]
        lines += [
            f"### {label} ({item['num_layers']} layers, {meta.get('hidden_size')} wide, "
            f"{meta.get('device_name')})",
            "",
        ]
        lines += table(header, rows)
    return lines


def render_engine(data: dict[str, Any]) -> list[str]:
    header = ["decoder", "tokens", "tok/s", "vs HF", "tok/round"]
    rows = [
        [
            name,
            str(s["tokens"]),
            f"{s['tokens_per_second']:.1f}",
            f"{s['speedup_vs_hf']:.3f}",
            str(s.get("tokens_per_round")),
        ]
        for name, s in data["summaries"].items()
    ]
    lines = [
        f"Mask {data['mask']}, γ = {data['gamma']}, {data['prompts']} random prompts of "
        f"{data['prompt_tokens']} tokens, {data['new_tokens']} new tokens, {data['repeats']} repeats; "
        "random weights.",
        "",
        *table(header, rows),
    ]
    lines += table(["ratio (tokens/s)", "value"], [[k, f"{v:.3f}"] for k, v in data["ratios"].items()])
    for title, check in (
        ("SSD vs our AR", data["lossless"]),
        ("HF generate vs our AR", data["hf_vs_autoregressive"]),
    ):
        lines += [
            f"Lossless, {title}: passed {check['passed']}, identical {check['identical']}, "
            f"numerical near-tie flips {check['near_ties']}.",
            "",
        ]
        parted = [d for d in check["divergences"] if d]
        lines += (
            table(
                ["output index", "AR token", "other token", "gap to top logit", "epsilon", "numerical"],
                [
                    [
                        str(d["index"]),
                        str(d["ar_token"]),
                        str(d["ssd_token"]),
                        f"{d['margin']:.4f}",
                        f"{d['epsilon']:.4f}",
                        str(d["numerical"]),
                    ]
                    for d in parted
                ],
            )
            if parted
            else []
        )
    return lines


def render_estimator(data: dict[str, Any]) -> list[str]:
    rows = [
        [mode, str(m["masks"]), f"{m['seconds']:.2f}", f"{m['masks_per_second']:.2f}"]
        for mode, m in data["modes"].items()
    ]
    memory = ", ".join(f"{k} {v:.2f}" for k, v in data["memory"].items())
    return [
        f"{data['prompts']} prompts, {data['positions']} scored positions. Memory: {memory}.",
        "",
        *table(["mode", "masks", "seconds", "masks/s"], rows),
    ]


def render_predictions(data: dict[str, Any]) -> list[str]:
    lines = []
    for label, rows in data.items():
        contexts = list(rows[0]["gpu_speedup"]) if rows else []
        header = ["mask", "found by", "alpha", "CPU speedup (γ)", *(f"GPU best @ {c} (γ)" for c in contexts)]
        body = []
        for row in rows:
            best = []
            for context in contexts:
                curve = row["gpu_speedup"][context]
                gamma = max(range(len(curve)), key=curve.__getitem__)
                best.append(f"{curve[gamma]:.3f} ({gamma + 1})")
            body.append(
                [
                    row["mask"],
                    row["strategy"],
                    f"{row['alpha']:.3f}",
                    f"{row['cpu_speedup']:.3f} ({row['cpu_gamma']})",
                    *best,
                ]
            )
        lines += [f"### {label}", "", *table(header, body)]
    return lines


def render_graphed(data: dict[str, Any]) -> list[str]:
    lines = [
        f"A graphed profile at context {data['context']} (`bench.graphed_profile`, median of "
        f"{data['repeats']} interleaved rounds); costs are the calibrated form's shares of the graphed "
        "full step, the overhead that of real graphed rounds.",
        "",
    ]
    for label, item in data["models"].items():
        masks = item["masks"]
        gammas = list(next(iter(masks.values()))["verify_cost"])
        header = [
            "mask",
            "c (draft step)",
            *(f"f({g})" for g in gammas),
            "alpha",
            "CPU speedup (γ)",
            "graphed GPU speedup (γ)",
        ]
        body = []
        for name, row in masks.items():
            measured = "graphed_speedup" in row
            body.append(
                [
                    name,
                    f"{row['draft_cost']:.3f}",
                    *(f"{row['verify_cost'][g]:.3f}" for g in gammas),
                    f"{row['alpha']:.3f}" if measured else "",
                    f"{row['cpu_speedup']:.3f} ({row['cpu_gamma']})" if measured else "",
                    f"{row['graphed_speedup']:.3f} ({row['graphed_gamma']})" if measured else "",
                ]
            )
        step = f"graphed full step {item['full_step_ms']:.3f} ms"
        lines += [f"### {label} ({item['layers']} layers): {step}", ""]
        lines += table(header, body)
    return lines


RENDER = {
    "tests": render_tests,
    "profiles": render_profiles,
    "engine_vs_hf": render_engine,
    "estimator": render_estimator,
    "predictions": render_predictions,
    "graphed": render_graphed,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="every section on this CPU with tiny configs")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu", help="output folder")
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="start no section after this many seconds"
    )
    parser.add_argument(
        "--only", nargs="*", default=[], choices=list(SECTIONS), help="run only these sections"
    )
    args = parser.parse_args()
    if args.tiny:
        with tempfile.TemporaryDirectory() as folder:
            report = run(tiny_plan(Path(folder)), args.out, args.budget_s, args.only)
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --tiny on a CPU")
        report = run(GPU_PLAN, args.out, args.budget_s, args.only)
    failed = [name for name, s in report["sections"].items() if s["status"] == "failed"]
    print(f"wrote {args.out}: " + ", ".join(f"{n} {s['status']}" for n, s in report["sections"].items()))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
