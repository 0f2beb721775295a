"""What a search costs by model size (issue 60, "the mission's own model on one machine"): the load,
the reference states, one trial in each estimator mode, the peak memory, and the wall time a budget
will take, for SmolLM2-135M, Qwen2.5-Coder-0.5B and the Mistral-7B shape with random weights.

Each case runs in a fresh process (`--child`) on the plan `--dtype auto` picks, through the code
`skipsearch run` runs: `models.loading.load_model`; the reference states for the run's prompts
(`acceptance.reference.build_reference` and the `Estimator` over it, what `acceptance.worker.prepare`
builds when no cache holds them: built here every time, so their seconds are a measurement, never a
cache read); then one draft (`--draft`) scored as a search's trial is
(`executors.base.local_executor(...).measure_one`), in `shared-kv` mode (a run's default) and in
`rounds` mode, twice each: the first trial pays for the draft's int8/int4 copies (quantized, or read
from the cache, once per run), the second is a trial's steady time. The Mistral-7B shape has no
tokenizer: its prompts are seeded random ids, `--max-prompt-tokens` long (an upper bound on the real
prompts' lengths). A depth whose weights, draft copies and reference states would not fit the
memory available is skipped, with a line.

The budget's wall time is `run.cost_estimate.SearchClock`'s own total, fed the measured clock
readings: ready after the load and the reference (plus the first trial's one-off copies), then one
trial at the steady time; it prices the finalists' re-score as `run` does. So the prediction is the
one `skipsearch run` prints after its first trials, for a search whose every trial costs the draft's.
A draft of every layer at int8 (the default) starts its estimate at layer 0, the dearest trial a
space scores; a skip set starting later costs less.

    .venv/bin/python experiments/search_cost.py --out search-cost-<cpu>     # alone; runtime to be measured

Run it alone (it refuses a busy machine unless `--busy-ok`); the load average is recorded before and
after. `--out NAME` writes `results/search_cost/NAME.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "search_cost"
REAL_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")
RANDOM_MODEL = "mistral-7b"
MODES = ("shared-kv", "rounds")
DRAFT = "w8:0-{last}"
HEADROOM = 2e9  # the process, activations and the estimator's logits beyond what `case_bytes` counts


def parser() -> argparse.ArgumentParser:
    from skipsearch.acceptance.prompts import PromptSpec

    defaults = PromptSpec()
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--models", nargs="*", default=list(REAL_MODELS), help="real-weight models")
    options.add_argument(
        "--mistral-layers", default="2,8,32", help="depths of the Mistral-7B shape (comma list; '' for none)"
    )
    options.add_argument("--n-prompts", type=int, default=defaults.n_prompts)
    options.add_argument("--max-prompt-tokens", type=int, default=defaults.max_prompt_tokens)
    options.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    options.add_argument(
        "--draft",
        default=DRAFT,
        help="the trial's mask; {last} is the last layer's index (default %(default)s)",
    )
    options.add_argument("--budget", type=int, default=200, help="the budget whose wall time is predicted")
    options.add_argument("--out", help="write results/search_cost/OUT.md and .json")
    options.add_argument("--busy-ok", action="store_true", help="time on a busy machine anyway")
    options.add_argument("--child", help=argparse.SUPPRESS)
    options.add_argument("--num-layers", type=int, help=argparse.SUPPRESS)
    return options


# -- one case, in its own process --------------------------------------------------------------------


def encoded_prompts(loaded: Any, spec: Any) -> list[Any]:
    """The run's prompts encoded as `prepare` encodes them; seeded random ids for a weight-free model."""
    from skipsearch.acceptance.prompts import EncodedPrompt, encode_prompts
    from skipsearch.models.random_weights import random_prompts

    config = loaded.model.config
    if loaded.tokenizer is None:
        ids = random_prompts(spec.n_prompts, spec.max_prompt_tokens, int(config.vocab_size), spec.seed)
        return [EncodedPrompt(f"random-{i}", p) for i, p in enumerate(ids)]
    return encode_prompts(spec, loaded.tokenizer, getattr(config, "max_position_embeddings", None))


def predicted(record: dict[str, Any], mode: str, budget: int) -> dict[str, Any]:
    """`SearchClock`'s total for `budget` trials at the mode's steady time, and the line `run` prints
    after its first trial (this process's peak memory in it), from the measured readings (module
    docstring)."""
    from skipsearch.run.cost_estimate import SearchClock

    trial = record[mode]
    ready = record["load_s"] + record["reference_s"] + max(trial["first_s"] - trial["steady_s"], 0.0)
    readings = [0.0, ready, ready + trial["steady_s"]]
    clock = SearchClock(budget, clock=lambda: readings.pop(0) if len(readings) > 1 else readings[0])
    clock.loaded()
    line = clock.trial(1, budget)
    return {"seconds": clock.total_seconds(1), "line": line}


def child(model: str, layers: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Load, build the reference, score the draft twice in each mode; the clock readings and memory."""
    from skipsearch.acceptance.estimator import Estimator
    from skipsearch.acceptance.measure_config import MeasureConfig
    from skipsearch.acceptance.prompts import PromptSpec
    from skipsearch.acceptance.reference import build_reference
    from skipsearch.acceptance.worker import Measurement
    from skipsearch.config import RunConfig
    from skipsearch.executors.base import local_executor
    from skipsearch.masks import SkipMask
    from skipsearch.models.loading import load_model
    from skipsearch.models.random_weights import RandomWeights
    from skipsearch.models.runner import LayerwiseRunner
    from skipsearch.run.cost_estimate import peak_memory

    temperature = next(f.default for f in fields(RunConfig) if f.name == "temperature")
    spec = PromptSpec(
        n_prompts=args.n_prompts, max_prompt_tokens=args.max_prompt_tokens, new_tokens=args.new_tokens
    )
    began = time.perf_counter()
    weights = RandomWeights(num_layers=layers) if layers else None
    loaded = load_model(model, "cpu", "auto", weights, announce=False)
    runner = LayerwiseRunner(loaded.model)
    record: dict[str, Any] = {
        "plan": loaded.plan.line,
        "layers": runner.num_layers,
        "load_s": time.perf_counter() - began,
        "loaded_peak": peak_memory(),
    }
    began = time.perf_counter()
    prompts = encoded_prompts(loaded, spec)
    reference = build_reference(runner, prompts, spec.new_tokens, with_kv=True)
    estimator = Estimator(runner, reference, "shared-kv")  # what `prepare` makes for a run's default
    record |= {
        "reference_s": time.perf_counter() - began,
        "prompts": len(prompts),
        "positions": int(reference.lengths.sum()),
        "continuation_tokens": int((reference.lengths - reference.prompt_lengths).sum()),
        "reference_peak": peak_memory(),
    }
    mask = SkipMask.parse(args.draft.format(last=runner.num_layers - 1), runner.num_layers)
    record["draft"] = str(mask)
    for mode in MODES:
        measure = MeasureConfig(model=model, prompts=spec, mode=mode)
        if estimator.mode != mode:
            estimator = measurement = executor = None  # one at a time, as a run holds (its logits
            # are vocabulary-wide: 0.6 GB for Qwen's 151,936 ids over the default prompts)
            estimator = Estimator(
                runner, reference, mode, round_gamma=measure.round_gamma, round_stop=measure.round_stop
            )
        measurement = Measurement(loaded, runner, estimator, "(built here, not saved)", spec)
        executor = local_executor(measure, temperature, measurement)
        seconds = [executor.measure_one(mask)[1] for _ in range(2)]
        record[mode] = {"first_s": seconds[0], "steady_s": seconds[1], "passes": list(estimator.passes)}
    record["peak_rss"] = peak_memory()
    record["predicted"] = {mode: predicted(record, mode, args.budget) for mode in MODES}
    return record


# -- the parent: cases and the report ---------------------------------------------------------------


def case(model: str, layers: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """One case in a fresh process: its record, or the error's last line."""
    passed = [
        *("--n-prompts", str(args.n_prompts), "--max-prompt-tokens", str(args.max_prompt_tokens)),
        *("--new-tokens", str(args.new_tokens), "--draft", args.draft, "--budget", str(args.budget)),
        *("--child", model),
        *(["--num-layers", str(layers)] if layers else []),
    ]
    done = subprocess.run([sys.executable, __file__, *passed], capture_output=True, text=True, check=False)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def case_bytes(layers: int, args: argparse.Namespace) -> int:
    """What the Mistral-7B shape at `layers` needs: its weights under the plan (`memory_fit`), the
    draft's copies (`DraftWeights.nbytes`) and the reference states (hidden states of every layer and
    the K/V, in the activations' dtype, over prompts and continuations)."""
    import torch

    from skipsearch.masks import SkipMask
    from skipsearch.models.draft_weights import DraftWeights
    from skipsearch.models.loading import weight_dtypes
    from skipsearch.models.memory_fit import empty_model, model_bytes
    from skipsearch.models.random_weights import RandomWeights, random_config

    config = random_config(RANDOM_MODEL, RandomWeights(num_layers=layers))
    layout = weight_dtypes("cpu", "auto")
    mask = SkipMask.parse(args.draft.format(last=layers - 1), layers)
    draft = DraftWeights(empty_model(config)).nbytes(mask)
    width = getattr(torch, layout.activations).itemsize
    positions = args.n_prompts * (args.max_prompt_tokens + args.new_tokens)
    kv = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    reference = positions * width * ((layers + 1) * config.hidden_size + 2 * layers * kv)
    return model_bytes(config, layout).total() + draft + reference


def cases(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    from skipsearch.models.memory_fit import available_bytes
    from skipsearch.models.registry import REGISTRY, available_offline

    rows: list[tuple[str, dict[str, Any]]] = []
    for model in args.models:
        if model in REGISTRY and not available_offline(REGISTRY[model]):
            rows.append((model, {"skipped": f"skipped: {model} is not installed (`make qwen`)"}))
        else:
            rows.append((model, case(model, None, args)))
        print(f"{model}: {rows[-1][1].get('error') or rows[-1][1].get('skipped') or 'done'}", file=sys.stderr)
    for layers in (int(n) for n in args.mistral_layers.split(",") if n.strip()):
        name = f"{RANDOM_MODEL}, random weights, {layers} layers"
        need, free = case_bytes(layers, args) + HEADROOM, available_bytes() or 0
        if free < need:
            rows.append(
                (name, {"skipped": f"skipped: {free / 1e9:.1f} GB available, ~{need / 1e9:.1f} needed"})
            )
        else:
            rows.append((name, case(RANDOM_MODEL, layers, args)))
        print(f"{name}: {rows[-1][1].get('error') or rows[-1][1].get('skipped') or 'done'}", file=sys.stderr)
    return rows


def cpu_line() -> str:
    """The CPU's model name and the flags the plan is chosen by, as /proc/cpuinfo states them."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line), "?")
    flags = next(
        (set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set()
    )
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    return f"{model}; flags: {', '.join(f for f in wanted if f in flags) or 'none of ' + ', '.join(wanted)}"


def gigabytes(size: float) -> str:
    return "-" if math.isnan(size) else f"{size / 1e9:.2f}"


def table(rows: list[tuple[str, dict[str, Any]]], budget: int) -> list[str]:
    lines = [
        f"| model | load s | reference s | shared-kv trial s (first / steady) | rounds trial s (first / "
        f"steady, passes) | peak RSS GB | budget {budget}, shared-kv | budget {budget}, rounds |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, record in rows:
        if "error" in record or "skipped" in record:
            lines.append(f"| {name} | {record.get('error') or record['skipped']} |||||||")
            continue
        shared, rounds = record["shared-kv"], record["rounds"]
        totals = [record["predicted"][mode]["seconds"] / 60 for mode in MODES]
        lines.append(
            f"| {name} | {record['load_s']:.1f} | {record['reference_s']:.1f} | "
            f"{shared['first_s']:.2f} / {shared['steady_s']:.2f} | "
            f"{rounds['first_s']:.2f} / {rounds['steady_s']:.2f} ({'/'.join(map(str, rounds['passes']))}) | "
            f"{gigabytes(record['peak_rss'])} | {totals[0]:.1f} min | {totals[1]:.1f} min |"
        )
    return lines


FULL_DEPTH = 32  # the Mistral-7B shape's layers


def extrapolated(rows: list[tuple[str, dict[str, Any]]], budget: int) -> list[tuple[str, dict[str, Any]]]:
    """The Mistral-7B shape at full depth, where it was not measured: each time fitted as a line in
    the depth through the depths that were (a layer's work is the same at every depth; the embedding,
    the head and the process are the line's constant), then priced by `predicted` as a measured row
    is. Nothing where fewer than two depths were measured or the full depth was."""
    import numpy as np

    measured = {r["layers"]: r for name, r in rows if name.startswith(RANDOM_MODEL) and "plan" in r}
    if len(measured) < 2 or FULL_DEPTH in measured:
        return []
    depths = sorted(measured)

    def at_full(values: list[float]) -> float:
        slope, constant = np.polyfit(depths, values, 1)
        return float(slope * FULL_DEPTH + constant)

    record: dict[str, Any] = {
        key: at_full([measured[d][key] for d in depths]) for key in ("load_s", "reference_s")
    }
    for mode in MODES:
        record[mode] = {
            key: at_full([measured[d][mode][key] for d in depths]) for key in ("first_s", "steady_s")
        }
        record[mode]["passes"] = measured[depths[-1]][mode]["passes"]
    record["predicted"] = {mode: predicted(record, mode, budget) for mode in MODES}
    record["peak_rss"] = float("nan")
    return [(f"{RANDOM_MODEL}, {FULL_DEPTH} layers, extrapolated from {', '.join(map(str, depths))}", record)]


def report(results: dict[str, Any]) -> str:
    rows = list(results["cases"].items())
    done = [r for _, r in rows if "plan" in r]
    lines = [
        "# What a search costs, by model size",
        "",
        f"CPU: {results['cpu']}. Load average (1/5/15 min) {results['load_before']} before, "
        f"{results['load_after']} after; {results['minutes']:.1f} min.",
        "",
        *(f"Plan: `{plan}`" for plan in sorted({r["plan"] for r in done})),
        "",
        f"Prompts: {results['n_prompts']} (HumanEval; seeded random ids for the random-weight shape), at "
        f"most {results['max_prompt_tokens']} tokens, {results['new_tokens']} new tokens each. Trial: "
        f"the draft `{results['draft']}` (`{{last}}`: the model's last layer) scored in each mode; the "
        "first trial pays for its int8/int4 copies once. The budget's minutes are "
        "`SearchClock`'s total (finalists included) at the steady trial time.",
        "",
        f"Command: `{results['command']}`.",
        "",
        *table(rows, results["budget"]),
        "",
        *(
            [
                "**Extrapolated, not measured:** the full depth, each time a line in the depth through the "
                "measured depths (`extrapolated`); its peak memory is `load_memory.py`'s to say.",
                "",
                *table(full, results["budget"]),
                "",
            ]
            if (full := extrapolated(rows, results["budget"]))
            else []
        ),
        "The line `skipsearch run` would print after its first trial, per case (shared-kv):",
        "",
        *(f"- {name}: {r['predicted']['shared-kv']['line']}" for name, r in rows if "plan" in r),
        "",
    ]
    return "\n".join(lines)


def check_args(args: argparse.Namespace) -> None:
    """Bad options as one line naming the fix (exit 2), before any model loads."""
    from skipsearch.acceptance.prompts import PromptSpec
    from skipsearch.errors import SkipsearchError

    problems = []
    try:
        PromptSpec(
            n_prompts=args.n_prompts, max_prompt_tokens=args.max_prompt_tokens, new_tokens=args.new_tokens
        )
    except SkipsearchError as error:
        problems.append(str(error))
    try:
        args.draft.format(last=1)
    except (KeyError, IndexError, ValueError):
        problems.append(f"--draft {args.draft!r} names more than {{last}}: e.g. {DRAFT}")
    depths = [n.strip() for n in args.mistral_layers.split(",") if n.strip()]
    problems += [
        f"--mistral-layers: {n!r} is not a depth of 1 to 32, e.g. 2,8,32"
        for n in depths
        if not (n.isdigit() and 1 <= int(n) <= 32)
    ]
    if args.budget < 1:
        problems.append(f"--budget {args.budget}: give 1 or more (e.g. 200)")
    if args.out and "/" in args.out:
        problems.append(f"--out {args.out!r} is a file name, not a path: e.g. search-cost-xeon")
    if problems:
        print(f"search_cost: {problems[0]}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    args = parser().parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.child:
        print(json.dumps(child(args.child, args.num_layers, args)))
        return
    check_args(args)
    from skipsearch.models.kernels import busy_cpu_warning

    busy = busy_cpu_warning()
    if busy and not args.busy_ok:
        sys.exit(f"search_cost: {busy}: timings must run alone (or pass --busy-ok)")
    load_before, began = os.getloadavg(), time.perf_counter()
    rows = cases(args)
    results = {
        "cpu": cpu_line(),
        "load_before": " ".join(f"{x:.1f}" for x in load_before),
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "minutes": (time.perf_counter() - began) / 60,
        "command": "python experiments/search_cost.py " + shlex.join(sys.argv[1:]),
        **{k: getattr(args, k) for k in ("n_prompts", "max_prompt_tokens", "new_tokens", "draft", "budget")},
        "cases": dict(rows),
    }
    text = report(results)
    print(text)
    if args.out:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.out}.json").write_text(json.dumps(results, indent=1))
        (OUT / f"{args.out}.md").write_text(text)
        print(f"wrote {OUT / args.out}.md and .json", file=sys.stderr)


if __name__ == "__main__":
    main()
