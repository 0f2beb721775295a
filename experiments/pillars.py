"""Pillars beside sink and window at a long context (issue 22): do the keys the last verify weighed
most buy acceptance, and does that pay for their reads?

On `stdlib-long` prompts cut to their last `--context` tokens, every layer runs (KV-only drafts) at
γ `--gamma` under each of `--patterns` (default: the window 8k's sweep found best, the same with
64 and 256 pillars, and a narrower window whose pillars make up the same key count). For each:
- the greedy agreement α of the `shared-kv` estimator (every position its own round's first draft);
- tokens per round by the `rounds` estimator against the engine's own decodes of the same prompts,
  whole outputs and the text both decode (`sparse_kv.fidelity`);
- the decode-only speedup against autoregressive decoding on held-out prompts, interleaved and
  paired per prompt and repeat, every output checked against the autoregressive one
  (`sparse_kv.decode`, the same kernels for both: bf16 packed weights, the decode kernel).

    python experiments/pillars.py                  # ~10 min on two idle cores
    python experiments/pillars.py --context 4096

Writes `results/sparse_kv/epyc-avx512/pillars-{context}.json` and `.md`. Run it alone; the load average is
recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _common import markdown_table
from _load import load_line
from sparse_kv import decode, fidelity

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.acceptance.worker import prepare
from skipsearch.masks import KVPattern, SkipMask

OUT = Path(__file__).resolve().parents[1] / "results" / "sparse_kv" / "epyc-avx512"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--context", type=int, default=8000)
    p.add_argument("--patterns", default="s4w256,s4w256k64,s4w256k256,s4w128k128")
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4, help="prompts the drafts are measured on")
    p.add_argument("--decode-prompts", type=int, default=3, help="held-out prompts decoded")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="timed passes over the decode prompts")
    args = p.parse_args()
    load_before = os.getloadavg()
    patterns = [KVPattern.parse(text) for text in args.patterns.split(",")]
    prompts = PromptSpec(
        "stdlib-long", args.prompts, max_prompt_tokens=args.context, new_tokens=args.new_tokens
    )
    measurement = prepare(MeasureConfig(model=args.model, prompts=prompts, kv_patterns=tuple(patterns)))
    every_layer = SkipMask(measurement.num_layers)
    profile = measurement.estimator.evaluate(every_layer, 0.0, (), patterns=patterns)
    drafts: dict = {
        str(kv): {"mask": str(every_layer), "kv": str(kv), "gamma": args.gamma, "alpha": scored.alpha}
        for kv, scored in zip(patterns, profile.by_kv, strict=True)
    }
    print(json.dumps(drafts, indent=1), flush=True)
    drafts["fidelity"] = fidelity(drafts, measurement, args.new_tokens)
    print(json.dumps(drafts["fidelity"], indent=1), flush=True)
    drafts["measured"] = decode(args, args.context, drafts, measurement)
    drafts["load"] = load_line(load_before, os.getloadavg())
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"pillars-{args.context}"
    stem.with_suffix(".json").write_text(json.dumps(drafts, indent=1, default=str) + "\n")
    rows = []
    for kv in patterns:
        name, measured, fit = str(kv), drafts["measured"][str(kv)], drafts["fidelity"][str(kv)]
        same = fit["same_text"]
        rows.append(
            [
                f"`{name}`",
                str(kv.keys_read),
                f"{drafts[name]['alpha']:.3f}",
                f"{fit['estimator']:.2f} / {fit['engine']:.2f} ({100 * fit['error']:+.1f}%)",
                f"{100 * same['error']:+.1f}%" if "error" in same else "-",
                f"{measured['tokens_per_round']:.2f}",
                f"{measured['round_ms']['draft']:.1f} / {measured['round_ms']['verify']:.1f}",
                f"**{measured['decode_only']:.3f}×** ({measured['pairs'][0]:.2f}–{measured['pairs'][1]:.2f})",
                "{real_divergences} real, {near_ties} near-tie".format(**measured["lossless"]),
            ]
        )
    step = drafts["measured"]["autoregressive_ms_per_token"]
    lines = [
        f"# Pillars beside sink and window at {args.context} tokens: {args.model}",
        "",
        f"`python experiments/pillars.py --context {args.context} --patterns {args.patterns} --gamma "
        f"{args.gamma}`: every layer runs, γ {args.gamma}; {args.prompts} `stdlib-long` prompts "
        f"measured, {args.decode_prompts} held out × {args.new_tokens} tokens × {args.repeats} repeats "
        f"decoded, paired against autoregressive decoding ({step:.1f} ms a token) on the same kernels.",
        f"Plan: {drafts['measured'].get('plan_line', drafts['measured']['plan'])}.",
        "",
        *markdown_table(
            [
                "pattern",
                "keys a draft step reads",
                "α (shared-kv)",
                "tokens/round: rounds estimator / engine (error)",
                "error on the text both decode",
                "tokens/round decoded",
                "draft / verify ms a round",
                "decode-only speedup (pairs)",
                "lossless",
            ],
            rows,
        ),
        "",
        f"{drafts['load']}.",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
