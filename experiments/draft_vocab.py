"""Draft vocabularies, measured (issue 12): does a draft that proposes from the top-k ids pay?

Four parts, each writing into `results/draft_vocab/<model>/`:

- `acceptance`: probe masks measured at every draft-vocabulary size (one forward each), next to
  the head's time at that many rows from the model's latency profile (`skipsearch profile`
  measures it per row count) and the calibrated speedup it predicts.
- `search`: learned (TPE) searches at equal budget of two spaces that allow light drafts, a sparse
  one (one to eight skipped layers anywhere, `experiments/draft_vocab_space.yaml`) and the shipped
  `block` space (one run of consecutive layers), scored by the calibrated cost model, with the
  vocabulary dimension (`[full, sizes...]`) and without it (`[full]`), N seeds, in one journal
  with one shared evaluation cache (the evaluator measures every size either way).
- `finalists`: each variant's 3 best distinct drafts over its seeds, re-scored exactly (`rounds`
  mode at their γ*, `run.finalists`), as `skipsearch run`'s verdict ranks them.
- `decode`: the best draft of each variant (by exact score once `finalists` ran, else by search
  score), decoded for real against autoregressive decoding on held-out prompts (the next prompts
  of the same shuffle, so disjoint from the ones the search scored), interleaved and paired per
  (repeat, prompt), greedy, every output checked token for token. Reports end-to-end and
  decode-only (prefill excluded) speedups with their spread and the load average before and after.
  Timing: run it alone on an idle machine.

Run: `.venv/bin/python experiments/draft_vocab.py --model smollm2-135m` (needs a latency profile of
the model on this machine: `skipsearch profile --model smollm2-135m`); `--parts decode` reruns
one part; `--report-only` rewrites README.md from the saved JSON.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from _common import Stamp, configure
from draft_vocab_report import plot_acceptance, report

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.bench.interleaved import benchmark
from skipsearch.bench.lossless import check_runs
from skipsearch.config import RunConfig
from skipsearch.cost.calibrated import predict
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.masks import Draft, SkipMask, vocab_label
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.loading import dtype_name, eos_ids
from skipsearch.run.finalists import rescore
from skipsearch.run.pipeline import open_context, resolve_space_settings
from skipsearch.run.search_step import run_scorer, search_one
from skipsearch.search import EvaluationCache, load_study
from skipsearch.search.results import trial_records
from skipsearch.store import JOURNAL_FILE, readable_profile_path
from skipsearch.validate.phases import decode_seconds, prefill_estimate

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "draft_vocab"
SIZES = (32768, 16384, 8192, 4096, 2048)
SEARCH_PROMPTS = PromptSpec(n_prompts=8, max_prompt_tokens=256, new_tokens=48, seed=0)
PROBES = {"smollm2-135m": ["a:14|m:14", "a:12,14,16|m:12,14,16"], "qwen2.5-coder-0.5b": ["7-13"]}
SPACES = {"sparse": str(Path(__file__).with_name("draft_vocab_space.yaml")), "block": "block"}
"""The light sparse space (1-8 skipped layers anywhere) and the shipped block space (one run of
1 to L/2 consecutive layers), searched at the same budget."""
VARIANTS = {
    f"{space}: {label}": (space, choices)
    for space in SPACES
    for label, choices in (("mask only", (None,)), ("mask + vocabulary", (None, *SIZES)))
}
PARTS = ("acceptance", "search", "finalists", "decode")
AR = "autoregressive"


def parser() -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", choices=sorted(PROBES))
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--budget", type=int, default=40, help="distinct masks per study (default 40)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the decode prompts")
    p.add_argument("--decode-prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--name", help="results/draft_vocab/'s folder (default: the model's; another CPU)")
    return p


def run_config(model: str, space: str, budget: int, seed: int, choices: tuple[int | None, ...]) -> RunConfig:
    measure = MeasureConfig(model=model, prompts=SEARCH_PROMPTS, mode="shared-kv")
    return RunConfig(
        measure=measure,
        space=SPACES[space],
        budget=budget,
        seed=seed,
        cost="calibrated",
        draft_vocab=choices,
    )


def study_config(
    model: str, space: str, budget: int, seed: int, choices: tuple[int | None, ...]
) -> RunConfig:
    """The config a study of one variant runs, and its finalists are re-scored with: the evaluator
    measures every vocabulary size whatever the variant searches (one shared evaluation cache)."""
    config = resolve_space_settings(run_config(model, space, budget, seed, choices))
    return replace(config, measure=replace(config.measure, draft_vocabs=SIZES))


# -- part 1: acceptance and head time against k ------------------------------------------------
def acceptance(model: str, context: Any) -> dict[str, Any]:
    measurement, latency = context.measurement, context.latency
    vocab_size = int(measurement.runner.config.vocab_size)
    at = SEARCH_PROMPTS.max_prompt_tokens + SEARCH_PROMPTS.new_tokens / 2
    rows = []
    for text in PROBES[model]:
        mask = SkipMask.parse(text, measurement.num_layers)
        profile = measurement.estimator.evaluate(mask, 1.0, SIZES)
        for variant in profile.variants:
            k = variant.draft_vocab
            prediction = predict(
                variant, mask, latency=latency, context=at, draft_vocab=k, vocab_size=vocab_size
            )
            rows.append(
                {
                    "mask": str(mask),
                    "draft_vocab": vocab_label(k),
                    "alpha": variant.alpha,
                    "sampling_acceptance": variant.sampling_acceptance,
                    "tokens_per_round_1": variant.tokens_per_round(1),
                    "tokens_per_round_2": variant.tokens_per_round(2),
                    "head_ms": 1e3 * latency.draft_head_time(k, at, vocab_size),
                    "step_ms": 1e3 * latency.step_time(at),
                    "calibrated_speedup": prediction.best_calibrated.speedup,
                    "calibrated_gamma": prediction.best_calibrated.gamma,
                }
            )
    head = [
        {
            "rows": r,
            "head_ms": 1e3 * t,
            "ratio_to_full": t / latency.head_by_rows[-1],
            "rows_share": r / vocab_size,
        }
        for r, t in zip(latency.head_rows, latency.head_by_rows, strict=True)
    ]
    return {"context": at, "probes": rows, "head": head, "profile": latency.meta}


# -- part 2: searches with and without the vocabulary dimension ---------------------------------
def search(model: str, context: Any, budget: int, seeds: int, out: Path) -> list[dict[str, Any]]:
    (out / "searches" / JOURNAL_FILE).unlink(missing_ok=True)  # a rerun starts new studies; the cache stays
    cache = EvaluationCache(out / "searches" / "cache")
    studies = []
    for seed in range(seeds):
        for label, (space, choices) in VARIANTS.items():
            config = study_config(model, space, budget, seed, choices)
            name = f"{space}-{'vocab' if len(choices) > 1 else 'mask'}-s{seed}"
            result = search_one(config, context, out / "searches", False, study_name=name, cache=cache)
            best = result.best
            studies.append(
                {
                    "variant": label,
                    "seed": seed,
                    "study": name,
                    "best_score": best.score,
                    "draft": str(Draft(best.skip_mask, _vocab(best.details["draft_vocab"]))),
                    "gamma": best.gamma_best,
                    "alpha": best.details["alpha"],
                    "model_evaluations": result.model_evaluations,
                }
            )
            print(
                f"{name}: {best.score:.3f} with {studies[-1]['draft']} at gamma {best.gamma_best}", flush=True
            )
    return studies


def _vocab(label: int | str) -> int | None:
    return None if label == "full" else int(label)


# -- part 2b: the finalists re-scored exactly, as `skipsearch run`'s verdict does ------------------
def finalists(model: str, context: Any, studies: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Per variant, the best distinct drafts of its studies (all seeds), measured again in `rounds`
    mode at their γ* and scored by the same cost model (`run.finalists`): `shared-kv` overrates
    drafts whose later steps read their own scratch K/V, most of all deep ones."""
    found = {}
    for label, (space, choices) in VARIANTS.items():
        names = [s["study"] for s in studies if s["variant"] == label]
        records = [r for name in names for r in trial_records(load_study(out / "searches", name))]
        config = study_config(model, space, 1, 0, choices)
        exact = rescore(records, context.measurement, run_scorer(config, context), 1.0)
        found[label] = [asdict(f) for f in exact]
        scores = (f"{f.mask} v:{f.draft_vocab} {f.search_score:.3f} -> {f.exact_score:.3f}" for f in exact)
        print(f"{label}: " + "; ".join(scores), flush=True)
    return found


def winner(data: dict[str, Any], label: str, num_layers: int) -> dict[str, Any]:
    """The draft a variant decodes: its best finalist by exact score, else its best search score."""
    if label in data.get("finalists", {}):
        best = data["finalists"][label][0]
        mask = SkipMask.parse(best["mask"], num_layers)
        return {
            "draft": str(Draft(mask, _vocab(best["draft_vocab"]))),
            "gamma": best["gamma"],
            "best_score": best["exact_score"],
            "search_score": best["search_score"],
        }
    return max((s for s in data["search"] if s["variant"] == label), key=lambda s: s["best_score"])


# -- part 3: the winners decoded for real -------------------------------------------------------
def held_out_prompts(tokenizer: Any, count: int) -> list[tuple[int, ...]]:
    """The `count` prompts after the search's in the same shuffle: disjoint from those it scored."""
    spec = replace(SEARCH_PROMPTS, n_prompts=SEARCH_PROMPTS.n_prompts + count)
    return [p.ids for p in encode_prompts(spec, tokenizer)][SEARCH_PROMPTS.n_prompts :]


def decode(model: str, context: Any, data: dict[str, Any], repeats: int, count: int) -> dict[str, Any]:
    measurement = context.measurement
    runner, loaded = measurement.runner, measurement.loaded
    prompts = held_out_prompts(loaded.tokenizer, count)
    stop, new = eos_ids(loaded.model), SEARCH_PROMPTS.new_tokens
    winners = {label: winner(data, label, runner.num_layers) for label in VARIANTS}
    decoders = {AR: lambda p, g: autoregressive_decode(runner, p, new, eos_ids=stop)}
    for label, best in winners.items():
        draft = Draft.parse(best["draft"], runner.num_layers)
        head = None if draft.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(draft.vocab))
        decoders[label] = _ssd(runner, draft.mask, new, best["gamma"], stop, head)
    widest = max(int(best["gamma"]) for best in winners.values()) + 1
    results = paired_decodes(runner, prompts, decoders, repeats, widest)
    return {**results, "new_tokens": new, "winners": winners, **loaded.plan.to_record()}


def paired_decodes(
    runner: Any, prompts: list[tuple[int, ...]], decoders: dict[str, Any], repeats: int, widest: int
) -> dict[str, Any]:
    """Every decoder against `decoders[AR]`, interleaved (`benchmark`) and paired per (repeat,
    prompt), greedy, every output checked token for token (near-ties within a measured tolerance,
    `widest` positions a verify at most): end-to-end and decode-only (prefill excluded) ratios
    with their spread, tokens and drafts per round, where a round's time goes, and the load
    average before and after."""
    stamp = Stamp()
    runs = benchmark(decoders, prompts, repeats, 0, runner.device)
    results: dict[str, Any] = {"meta": stamp.finish(), "prompts": len(prompts), "repeats": repeats}
    reference = runs[AR]
    for label, ssd in runs.items():
        if label == AR:
            continue
        check = check_runs(runner, prompts, reference, ssd, widest)
        per_prompt = [ssd[i :: len(prompts)] for i in range(len(prompts))]
        prefill = {i: prefill_estimate(rs) for i, rs in enumerate(per_prompt)}
        pairs = [
            (a, s, prefill[i % len(prompts)]) for i, (a, s) in enumerate(zip(reference, ssd, strict=True))
        ]
        end_to_end = [a.seconds / s.seconds for a, s, _ in pairs]
        decode_only = [decode_seconds(a, p) / decode_seconds(s, p) for a, s, p in pairs]
        results.setdefault(
            "ar_decode_tokens_per_second",
            sum(len(a.tokens) for a, _, _ in pairs) / sum(decode_seconds(a, p) for a, _, p in pairs),
        )
        results[label] = {
            "lossless": check.to_dict(),
            "end_to_end": _spread(
                end_to_end, sum(a.seconds for a, _, _ in pairs) / sum(s.seconds for _, s, _ in pairs)
            ),
            "decode_only": _spread(
                decode_only,
                sum(decode_seconds(a, p) for a, _, p in pairs)
                / sum(decode_seconds(s, p) for _, s, p in pairs),
            ),
            "tokens_per_round": statistics.fmean(n + 1 for s in ssd for n in s.accepted),
            "drafts_per_round": statistics.fmean(g for s in ssd for g in s.gammas),
            "breakdown_ms": _breakdown(ssd),
        }
    return results


def _ssd(runner: Any, mask: SkipMask, new: int, gamma: int, stop: Any, head: DraftHead | None) -> Any:
    return lambda p, g: speculative_decode(runner, p, mask, new, gamma, eos_ids=stop, head=head)


def _spread(ratios: list[float], aggregate: float) -> dict[str, float]:
    """The aggregate ratio (total time over total time) and the spread of the per-pair ratios."""
    return {
        "aggregate": aggregate,
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "stdev": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
    }


def _breakdown(results: list[Any]) -> dict[str, float]:
    """Mean milliseconds per round in each engine phase: where a round's time goes."""
    timings = [t for r in results for t in r.timings]
    phases = ("draft", "verify", "sample", "cache", "other")
    return {phase: 1e3 * statistics.fmean(getattr(t, phase) for t in timings) for phase in phases}


def main() -> None:
    args = parser().parse_args()
    out = OUT / (args.name or args.model)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "measurements.json"
    data: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {}
    if not args.report_only:
        configure(args.threads)
        if not readable_profile_path(args.model, "cpu", dtype_name("cpu", "auto")).is_file():
            raise SystemExit(
                f"no latency profile of {args.model}: run `skipsearch profile --model {args.model}` first"
            )
        config = resolve_space_settings(run_config(args.model, "sparse", args.budget, 0, (None, *SIZES)))
        context = open_context(config)
        if "acceptance" in args.parts:
            data["acceptance"] = acceptance(args.model, context)
            context.latency.save(out / "profile.json")
            plot_acceptance(data["acceptance"], out / "acceptance.png")
            saved.write_text(json.dumps(data, indent=2))
        if "search" in args.parts:
            data["search"] = search(args.model, context, args.budget, args.seeds, out)
            saved.write_text(json.dumps(data, indent=2))
        if "finalists" in args.parts:
            data["finalists"] = finalists(args.model, context, data["search"], out)
            saved.write_text(json.dumps(data, indent=2))
        if "decode" in args.parts:
            result = decode(args.model, context, data, args.repeats, args.decode_prompts)
            data[f"decode_{args.threads}_threads"] = {**result, "threads": args.threads}
            saved.write_text(json.dumps(data, indent=2))
    report(args.model, data, out, SEARCH_PROMPTS, SIZES)
    print((out / "README.md").read_text())


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
