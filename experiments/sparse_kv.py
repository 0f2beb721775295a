"""KV-pattern drafts against layer skipping, by context (issue 22): which pays where, predicted and measured.

At each context N (default 512, 2048, 4096 and 8000 tokens: SmolLM2 holds 8,192 positions), on
prompts of `stdlib-long` cut to their last N tokens (`--prompts` of them measured, the next
`--decode-prompts` held out):
- **joint**: the best draft of a search of the light sparse space (1-8 skipped layers,
  `draft_vocab_space.yaml`; knapsack candidates, then TPE), every mask scored with every key and
  under each KV pattern of `--patterns` that leaves keys out (sink and window, and the same with
  64 pillars), each with every draft vocabulary of `--vocabs`, or the KV-only draft where it
  scores higher;
- **layer-only**: the best of the same search's masks scored with every key (and any vocabulary);
- **KV-only**: every layer, the best of those patterns (and any vocabulary).
Each is scored by the calibrated cost model at its best γ, on a latency profile measured at
128-8000 tokens (`skipsearch profile --context-lengths ... --out <out>/profile.json`,
taken first unless `--profile` names one); then the three are decoded against autoregressive
decoding on the held-out prompts, interleaved and paired per prompt and repeat, every output
checked against the autoregressive one (bf16: near-ties within the measured tolerance).

    python experiments/sparse_kv.py    # ~75 min on two idle cores before pillars and vocabularies
    python experiments/sparse_kv.py --contexts 512,2048   # a shorter sweep
    python experiments/sparse_kv.py --profile results/sparse_kv/xeon-amx/profile.json   # keep the profile
    python experiments/sparse_kv.py --contexts 8000 --out results/sparse_kv/xeon-amx   # 8k alone (~30 min)

The draft vocabularies are ranked on a stdlib sample without the measured or the held-out prompts'
files (the default ranking avoids only the measured ones, and stdlib-long's held-out prompts are
in its sample). Writes `{results.json, README.md, crossover.png}` under `--out`
(`results/sparse_kv/xeon-amx/`). Run it alone; the load
average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import Stamp
from _load import load_line
from sparse_kv_report import write_report

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.acceptance.vocab import ranking_for
from skipsearch.acceptance.worker import prepare
from skipsearch.bench.interleaved import benchmark
from skipsearch.bench.lossless import check_runs
from skipsearch.config import RunConfig
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.masks import KVPattern, SkipMask, parse_draft_vocab, vocab_label
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.loading import eos_ids
from skipsearch.run.search_step import RunContext, run_scorer, search_one
from skipsearch.search import EvaluationCache, load_study
from skipsearch.search.objective import scoring_latency
from skipsearch.search.results import trial_records
from skipsearch.search.space_files import load_space
from skipsearch.store import CACHE_DIR
from skipsearch.validate.phases import decode_seconds, prefill_estimate
from skipsearch.validate.replay import round_stats, same_text_rounds

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "sparse_kv" / "xeon-amx"
SPACE = Path(__file__).with_name("draft_vocab_space.yaml")
PROFILE_CONTEXTS = "128,256,512,1024,2048,4096,8000"  # every pattern's key count, and every context


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--contexts", default="512,2048,4096,8000")
    p.add_argument("--prompts", type=int, default=4, help="prompts the drafts are measured on")
    p.add_argument("--decode-prompts", type=int, default=3, help="held-out prompts decoded")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--budget", type=int, default=24, help="distinct masks per search")
    p.add_argument(
        "--patterns",
        default="s4w128,s4w256,s4w512,s4w1024,s4w128k64,s4w256k64",
        help="the KV patterns searched (those that leave keys out at a context)",
    )
    p.add_argument("--vocabs", default="full,32768,16384,8192", help="the draft vocabularies searched")
    p.add_argument("--out", type=Path, default=OUT, help="where results.json and the report go")
    p.add_argument("--repeats", type=int, default=2, help="timed passes over the decode prompts")
    p.add_argument("--profile", help="a latency profile covering the contexts (default: measure one)")
    p.add_argument(
        "--decode-only",
        action="store_true",
        help="decode again the drafts results.json holds (no profile, no search, no fidelity)",
    )
    return p


def latency_profile(args: argparse.Namespace) -> LatencyProfile:
    """The profile given, or one measured now at `PROFILE_CONTEXTS` in fresh processes."""
    path = Path(args.profile) if args.profile else args.out / "profile.json"
    if not args.profile:
        command = [sys.executable, "-m", "skipsearch", "profile", "--model", args.model]
        command += ["--context-lengths", PROFILE_CONTEXTS, "--processes", "3", "--out", str(path)]
        subprocess.run(command, check=True)
    return LatencyProfile.load(path)


def run_config(args: argparse.Namespace, context: int, kv: tuple[KVPattern | None, ...]) -> RunConfig:
    prompts = PromptSpec("stdlib-long", args.prompts, max_prompt_tokens=context, new_tokens=args.new_tokens)
    vocabs = vocab_sizes(args)
    measure = MeasureConfig(
        model=args.model,
        prompts=prompts,
        mode="shared-kv",
        kv_patterns=tuple(p for p in kv if p),
        draft_vocabs=tuple(k for k in vocabs if k is not None),
    )
    return RunConfig(
        measure=measure,
        space=str(SPACE),
        strategy="knapsack+tpe",
        budget=args.budget,
        cost="calibrated",
        draft_vocab=vocabs,
        kv=kv,
        context=context,
    )


def vocab_sizes(args: argparse.Namespace) -> tuple[int | None, ...]:
    return tuple(parse_draft_vocab(text) for text in args.vocabs.split(","))


def patterns_at(args: argparse.Namespace, context: int) -> tuple[KVPattern, ...]:
    """The patterns of `--patterns` that leave keys out at `context`."""
    patterns = (KVPattern.parse(text) for text in args.patterns.split(","))
    return tuple(p for p in patterns if p.sink + p.window < context)


def measured_and_held_out(args: argparse.Namespace, context: int) -> PromptSpec:
    """The measured prompts followed by the held-out ones (the first `--prompts` are measured)."""
    total = args.prompts + args.decode_prompts
    return PromptSpec("stdlib-long", total, max_prompt_tokens=context, new_tokens=args.new_tokens)


def rank_without_held_out(args: argparse.Namespace, context: int, measurement: Any) -> None:
    """Rank the draft vocabularies on a sample without the held-out prompts' files as well: the
    default ranking avoids only the measured prompts, and a held-out prompt's file in the counting
    corpus would flatter a small vocabulary's decodes."""
    measurement.ranking = ranking_for(measurement.loaded, measured_and_held_out(args, context))


def search_context(
    args: argparse.Namespace, context: int, measurement: Any, latency: LatencyProfile
) -> RunContext:
    """The search's context over the measured model at `context`: the profile priced there and
    the space file; `best_drafts` gives it the scorer of each config it searches."""
    config = run_config(args, context, (None, *patterns_at(args, context)))
    scoring = scoring_latency(config.cost, latency, config.context, config.extrapolate_context, True)
    return RunContext(measurement, latency, {}, scoring, None, {}, load_space(config.space))


def best_drafts(args: argparse.Namespace, context: int, run: RunContext, out: Path) -> dict:
    """The three drafts at `context`: each a (mask, KV pattern, γ, predicted speedup, α) record.

    One search (knapsack candidates from the importance proxy, then TPE) scores every mask with
    every key and under each pattern, and the same masks scored with every key only give the
    layer-only draft, so both come from one candidate set at one budget. The joint draft is the
    better of that search's winner and the KV-only draft: every layer with a pattern is a joint
    candidate too, which the sparse space (1-8 skipped layers) leaves out. The search keeps its
    own evaluation cache in `out`, new every run: a mask's acceptance depends on the context and
    the prompts it was measured on.
    """
    shutil.rmtree(out, ignore_errors=True)
    patterns, measurement = patterns_at(args, context), run.measurement
    joint = run_config(args, context, (None, *patterns))
    run = replace(run, scorer=run_scorer(joint, run))
    name = f"joint-{context}"
    best = search_one(joint, run, out, False, study_name=name).best
    found = {"joint": _record(best.mask, best.gamma_best, best.score, best.details)}
    cache, every_key = EvaluationCache(out / CACHE_DIR), run_scorer(replace(joint, kv=(None,)), run)
    masks = {record.mask: record.num_layers for record in trial_records(load_study(out, name))}
    scored = {
        mask: every_key(SkipMask.parse(mask, depth), cache.get(mask).profile) for mask, depth in masks.items()
    }
    mask, score = max(scored.items(), key=lambda item: item[1].value)
    found["layer-only"] = _record(mask, score.gamma_best, score.value, score.details)
    if patterns:  # every layer, each pattern: one evaluation scores them all
        empty = SkipMask(measurement.num_layers)
        profile = measurement.estimator.evaluate(empty, 1.0, joint.measure.draft_vocabs, patterns=patterns)
        score = run_scorer(replace(joint, kv=patterns), run)(empty, profile)
        found["KV-only"] = _record(str(empty), score.gamma_best, score.value, score.details)
        if found["KV-only"]["predicted"] > found["joint"]["predicted"]:
            found["joint"] = found["KV-only"]
    found["prompt_tokens"] = [len(ids) for ids in measurement.prompt_ids()]
    return found


def _record(mask: str, gamma: int, score: float, details: dict) -> dict:
    return {
        "mask": mask,
        "kv": details.get("kv") or "full",
        "vocab": vocab_label(parse_draft_vocab(details.get("draft_vocab"))),
        "gamma": gamma,
        "predicted": score,
        "alpha": details.get("alpha"),
        "score_by_kv": details.get("score_by_kv"),
        "score_by_draft_vocab": details.get("score_by_draft_vocab"),
    }


def _draft_key(draft: dict) -> tuple:
    return draft["mask"], draft["kv"], draft.get("vocab", "full"), draft["gamma"]


def _head(runner: Any, measurement: Any, draft: dict) -> DraftHead | None:
    vocab = parse_draft_vocab(draft.get("vocab"))
    return None if vocab is None else DraftHead.gather(runner, measurement.vocab_ids(vocab))


def distinct(drafts: dict) -> dict[str, str]:
    """Each draft's name (the entries of `drafts` that name a mask, in order) -> the name of the
    first draft equal to it (the joint draft is often the KV-only one): an equal draft is measured
    once and reported under both names."""
    first: dict[tuple, str] = {}
    names = [name for name, draft in drafts.items() if isinstance(draft, dict) and "mask" in draft]
    for name in names:
        first.setdefault(_draft_key(drafts[name]), name)
    return {name: first[_draft_key(drafts[name])] for name in names}


def fidelity(drafts: dict, measurement: Any, new_tokens: int) -> dict:
    """Tokens per round of each draft on the measured prompts: the rounds estimator (teacher-forced,
    rounds simulated at the draft's γ) against the engine's own decodes of the same prompts, over
    whole outputs and over the text both decode (`validate.replay`: before the engine's first bf16
    near-tie flip, without the last rounds the output's end cuts short), as experiments/fidelity.py
    compares them."""
    runner, reference = measurement.runner, measurement.estimator.reference
    stop, prompts = eos_ids(measurement.loaded.model), measurement.prompt_ids()
    found, continuations = {}, reference.continuations()
    same = distinct(drafts)
    for name in same:
        if same[name] != name:
            found[name] = found[same[name]]
            continue
        mask = SkipMask.parse(drafts[name]["mask"], runner.num_layers)
        kv, gamma = KVPattern.parse(drafts[name]["kv"]), drafts[name]["gamma"]
        vocab, head = parse_draft_vocab(drafts[name].get("vocab")), _head(runner, measurement, drafts[name])
        rounds = Estimator(
            runner, reference, "rounds", measurement.vocab_ids, round_gamma=gamma, round_vocab=vocab
        )
        profile = rounds.evaluate(mask, 1.0, () if vocab is None else (vocab,), kv)
        profile = profile if vocab is None else profile.by_vocab[0]
        estimated = profile.tokens_per_round(gamma)
        decodes = [
            speculative_decode(runner, p, mask, new_tokens, gamma, eos_ids=stop, head=head, kv=kv)
            for p in prompts
        ]
        engine = statistics.mean(n + 1 for result in decodes for n in result.accepted)
        on_engine, on_estimator, shared = same_text_rounds(
            profile.greedy_match, decodes, continuations, gamma, new_tokens
        )
        text = {"share": shared / sum(len(r.tokens) for r in decodes)}
        if on_engine and on_estimator:
            text |= {"estimator": round_stats(on_estimator)[0], "engine": round_stats(on_engine)[0]}
            text["error"] = text["estimator"] / text["engine"] - 1
        found[name] = {
            "estimator": estimated,
            "engine": engine,
            "error": estimated / engine - 1,
            "same_text": text,
        }
    return found


def decode(args: argparse.Namespace, context: int, drafts: dict, measurement: Any) -> dict:
    """The drafts decoded against autoregressive decoding on the held-out prompts, paired."""
    runner, loaded = measurement.runner, measurement.loaded
    spec = measured_and_held_out(args, context)
    prompts = [p.ids for p in encode_prompts(spec, loaded.tokenizer)][args.prompts :]
    stop, new = eos_ids(loaded.model), args.new_tokens
    decoders = {"autoregressive": lambda p, g: autoregressive_decode(runner, p, new, eos_ids=stop)}
    same = distinct(drafts)
    for name in dict.fromkeys(same.values()):  # each distinct draft once, in order
        draft = drafts[name]
        mask = SkipMask.parse(draft["mask"], runner.num_layers)
        kv, gamma, head = KVPattern.parse(draft["kv"]), draft["gamma"], _head(runner, measurement, draft)
        decoders[name] = lambda p, g, m=mask, k=kv, y=gamma, h=head: speculative_decode(
            runner, p, m, new, y, eos_ids=stop, head=h, kv=k
        )
    stamp = Stamp()
    runs = benchmark(decoders, prompts, args.repeats, 0, runner.device)
    measured = {"meta": stamp.finish(), "plan": loaded.plan.details, "plan_line": loaded.plan.line}
    baseline = runs["autoregressive"]
    for name in same:
        if same[name] != name:
            measured[name] = measured[same[name]]
            continue
        widest = drafts[name]["gamma"] + 1
        check = check_runs(runner, prompts, baseline, runs[name], widest).to_dict()
        per_prompt = [runs[name][i :: len(prompts)] for i in range(len(prompts))]
        prefill = [prefill_estimate(results) for results in per_prompt]
        paired = enumerate(zip(baseline, runs[name], strict=True))
        pairs = [(a, s, prefill[i % len(prompts)]) for i, (a, s) in paired]
        ratios = [decode_seconds(a, p) / decode_seconds(s, p) for a, s, p in pairs]
        rounds = [t for result in runs[name] for t in result.timings]
        measured[name] = {
            "decode_only": sum(decode_seconds(a, p) for a, _, p in pairs)
            / sum(decode_seconds(s, p) for _, s, p in pairs),
            "pairs": [min(ratios), max(ratios)],
            "tokens_per_round": statistics.mean(n + 1 for s in runs[name] for n in s.accepted),
            "round_ms": {
                "draft": 1e3 * statistics.mean(t.draft for t in rounds),
                "verify": 1e3 * statistics.mean(t.verify for t in rounds),
                "rest": 1e3 * statistics.mean(t.sample + t.cache + t.other for t in rounds),
            },
            "lossless": check,
        }
    ar_tokens = sum(len(a.tokens) for a in baseline)
    measured["autoregressive_ms_per_token"] = 1e3 * sum(decode_seconds(a, 0.0) for a in baseline) / ar_tokens
    return measured


def main() -> None:
    args = parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    if args.decode_only:
        results = json.loads((args.out / "results.json").read_text())
    else:
        latency = latency_profile(args)
        space = {"patterns": args.patterns, "vocabs": args.vocabs, "budget": args.budget}
        results = {"model": args.model, "contexts": {}, "profile": latency.meta, "space": space}
    for context in (int(c) for c in args.contexts.split(",")):
        measurement = prepare(run_config(args, context, (None, *patterns_at(args, context))).measure)
        rank_without_held_out(args, context, measurement)
        if args.decode_only:
            drafts = results["contexts"][str(context)]
        else:
            run = search_context(args, context, measurement, latency.for_context(context))
            drafts = best_drafts(args, context, run, args.out / "searches" / str(context))
            drafts["fidelity"] = fidelity(drafts, measurement, args.new_tokens)
        drafts["measured"] = decode(args, context, drafts, measurement)
        results["contexts"][str(context)] = drafts
        print(json.dumps({context: drafts}, indent=1, default=str), flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    results["load"] = load_line(load_before, os.getloadavg())
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    write_report(results, args.out)


if __name__ == "__main__":
    main()
