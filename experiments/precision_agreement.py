"""How often drafts at lower precision agree with the full model, and whether the estimator's tokens per
round are the engine's (the issue "Drafts at lower precision", items 4 and 7).

For a model loaded in float32 (the plan whose draft runs our int8/int4 kernels), on held-out
HumanEval prompts: each draft's greedy acceptance α and sampling acceptance from the round-aware
estimator (`rounds` mode at `--gamma`), and the engine's tokens per round over the same prompts,
greedy and lossless (every decode checked token for token against the reference continuation), over
the rounds it drafted in full (its last rounds draft fewer near the output's end, which the
estimator's simulation leaves out). The drafts: every layer at int8; every layer at int4 in groups
of 32, 64 and 128; attention int4 with MLP int8; and a two-layer skip for comparison. Agreement
does not depend on the machine's load (only timings do), so this runs beside other work.

    python experiments/precision_agreement.py --model smollm2-135m        # ~6 min on two cores
    python experiments/precision_agreement.py --model qwen2.5-coder-0.5b  # ~15 min

Writes `results/precision/agreement-<model>.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from _common import markdown_table, write_report
from _load import load_line

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.acceptance.reference import build_reference
from skipsearch.engine import speculative_decode
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.draft_weights import draft_weights_of, set_int4_group
from skipsearch.models.loading import load_model
from skipsearch.models.runner import LayerwiseRunner

OUT = Path(__file__).resolve().parents[1] / "results" / "precision"


def drafts(layers: int) -> list[tuple[str, str, int | None]]:
    """(label, mask, int4 group) of every draft compared."""
    last = layers - 1
    quarter, half = layers // 4, layers // 2
    return [
        ("int8, every layer", f"w8:0-{last}", None),
        ("int4 (groups of 32), every layer", f"w4:0-{last}", 32),
        ("int4 (groups of 64), every layer", f"w4:0-{last}", 64),
        ("int4 (groups of 128), every layer", f"w4:0-{last}", 128),
        ("attention int4 (32), MLP int8", f"w4a:0-{last}|w8m:0-{last}", 32),
        (f"skip layers {quarter} and {half} (full precision)", f"{quarter},{half}", None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    before, began = os.getloadavg(), time.time()
    loaded = load_model(args.model, dtype="float32", announce=False)
    loaded.model.generation_config.eos_token_id = None  # every continuation runs its full length
    runner = LayerwiseRunner(loaded.model)
    searched = PromptSpec().n_prompts  # a search's prompts by default: the first of the same shuffle
    spec = PromptSpec(
        n_prompts=searched + args.prompts,
        max_prompt_tokens=args.max_prompt_tokens,
        new_tokens=args.new_tokens,
    )
    prompts = encode_prompts(spec, loaded.tokenizer)[searched:]  # held out from the searches'
    reference = build_reference(runner, prompts, spec.new_tokens, with_kv=True)
    estimator = Estimator(runner, reference, "rounds", round_gamma=args.gamma)
    rows, records = [], []
    for label, text, group in drafts(runner.num_layers):
        try:
            set_int4_group(loaded.model, group)
        except ConfigError as error:  # a group that does not divide every input width of the model
            rows.append([label, *["–"] * 7])
            print(f"{label}: {error}", flush=True)
            continue
        mask = SkipMask.parse(text, runner.num_layers)
        profile = estimator.evaluate(mask, temperature=1.0)
        greedy = estimator.evaluate(mask, temperature=0)
        kept, lossless = [], True
        for row in range(reference.input_ids.shape[0]):
            length = int(reference.prompt_lengths[row])
            prompt = reference.input_ids[row, :length].tolist()
            expected = reference.input_ids[row, length : int(reference.lengths[row])].tolist()
            run = speculative_decode(runner, prompt, mask, len(expected), gamma=args.gamma, timed=False)
            lossless &= list(run.tokens) == expected
            kept += [n + 1 for d, n in zip(run.gammas, run.accepted, strict=True) if d == args.gamma]
        engine = sum(kept) / len(kept)
        estimated = greedy.tokens_per_round(args.gamma)
        copies = draft_weights_of(loaded.model, group).nbytes(mask)
        record = {
            "draft": label,
            "mask": text,
            "int4_group": group,
            "alpha": greedy.alpha,
            "sampling_acceptance": profile.sampling_acceptance,
            "estimated_tokens_per_round": estimated,
            "engine_tokens_per_round": engine,
            "error_pct": 100 * (estimated - engine) / engine,
            "engine_rounds": len(kept),
            "lossless": lossless,
            "copies_mb": copies / 1e6,
        }
        records.append(record)
        rows.append(
            [
                label,
                f"{record['alpha']:.3f}",
                f"{record['sampling_acceptance']:.3f}",
                f"{estimated:.3f}",
                f"{engine:.3f}",
                f"{record['error_pct']:+.1f}%",
                "yes" if lossless else "NO",
                f"{record['copies_mb']:.0f}",
            ]
        )
        print(json.dumps(record), flush=True)
    after = os.getloadavg()
    flags = Path("/proc/cpuinfo").read_text()
    cpu = next((x.split(":", 1)[1].strip() for x in flags.splitlines() if x.startswith("model name")), "?")
    lines = [
        f"# Drafts at lower precision: agreement on {args.model}",
        "",
        f"{args.prompts} held-out HumanEval prompts (after a search's 16; ≤ {args.max_prompt_tokens} "
        "tokens), "
        f"{args.new_tokens} new tokens, float32 plan (the draft's copies on skipsearch's int8/int4 kernels), "
        f"γ = {args.gamma}. α: greedy acceptance; sampling: Σ min(p, q) at T = 1 (estimator, `rounds` "
        "mode). Tokens per round: the estimator's against the engine's over the rounds it drafted in "
        "full; lossless: every greedy SSD decode equal to the reference continuation. Copies: the "
        "draft's int8/int4 weights held (MB).",
        "",
        *markdown_table(
            [
                "draft",
                "α",
                "sampling",
                "tokens/round (estimator)",
                "engine",
                "error",
                "lossless",
                "copies MB",
            ],
            rows,
        ),
        "",
        f"CPU: {cpu} ({'AMX' if 'amx_tile' in flags else 'no AMX'}); agreement does not depend on load. "
        + load_line(before, after)
        + f". Wall time {time.time() - began:.0f} s.",
        "",
        "Command: `python experiments/precision_agreement.py " + " ".join(sys.argv[1:]) + "`",
        "",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    write_report(OUT / f"agreement-{args.model}.md", lines)
    (OUT / f"agreement-{args.model}.json").write_text(
        json.dumps({"args": vars(args), "drafts": records}, indent=1)
    )


if __name__ == "__main__":
    main()
