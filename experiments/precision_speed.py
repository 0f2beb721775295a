"""Drafts at lower precision, decoded: how much faster than autoregressive decoding, and where a
round's time goes against the memory floor (the issue "Drafts at lower precision", item 7).

For one model, each draft of `--drafts` is decoded interleaved and paired with autoregressive
decoding (`draft_vocab.paired_decodes`): the same prompts, the same kernel plan, the target at full
precision, so the autoregressive baseline runs on the same fused bf16 layers as the verify. A draft
is `DRAFT@GAMMA` for a chain or `DRAFT@SHAPE` for a token tree, e.g. `w8:0-23@6`,
`w4:0-23|v:32768@5`, `w4:0-23|v:32768@2x2x1x1`, `a:8,20|m:26@3`. Greedy; every output is checked token
for token against autoregressive decoding. Prompts: `--prompts` held-out HumanEval prompts (after
the 8 a search scores) × `--repeats`, and with `--spec-bench PATH` the first `--per-category`
questions of each of Spec-Bench's six categories.

Per draft: the decode-only speedup (total over total, and the median and range of the per-pair
ratios), tokens per round, and the round's breakdown:
- the draft step (draft ms per round over draft steps per round) against the autoregressive step
  (its decode-only seconds per token) and against its **memory floor**: the bytes the draft step
  reads (each layer's projections at its precision's share, `masks.BYTES_SHARE`, plus the head rows
  it reads, bf16) over this machine's copy bandwidth (`bench.latency_profiler.copy_bandwidth`);
- the verify's ms per round.
The autoregressive step's own floor (every weight at bf16 and the full head) is in the header.

    python experiments/precision_speed.py --model qwen2.5-coder-0.5b \\
        --drafts 'w8:0-23@6' 'w4:0-23|v:32768@5' --prompts 24 --repeats 3      # ~15 min, alone

Run it alone (it refuses a busy machine unless `--busy-ok`); the load average is recorded before
and after. Writes `results/precision/{name}.md` and `.json` (`--name`, default `speed-MODEL`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import configure, markdown_table
from draft_vocab import AR, SEARCH_PROMPTS, held_out_prompts, paired_decodes
from token_trees import spec_bench_prompts

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.worker import prepare
from skipsearch.bench.clock import WallClock
from skipsearch.bench.latency_profiler import copy_bandwidth
from skipsearch.cpu.dtypes import describe_cpu
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.masks import BYTES_SHARE, Draft, SkipMask, split_draft
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.kernels import busy_cpu_warning
from skipsearch.models.loading import eos_ids
from skipsearch.tree_shapes import as_tree, parse_tree

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "precision"
BF16 = 2  # bytes a full-precision weight takes on the plans that time this (bf16 weights)


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--model", default="smollm2-135m")
    options.add_argument(
        "--drafts", nargs="+", help="DRAFT@GAMMA or DRAFT@SHAPE (docstring); needed unless --report-only"
    )
    options.add_argument("--prompts", type=int, default=24, help="held-out HumanEval prompts")
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--new-tokens", type=int, default=64)
    options.add_argument("--spec-bench", type=Path, help="Spec-Bench's question.jsonl")
    options.add_argument("--per-category", type=int, default=2, help="Spec-Bench prompts per category")
    options.add_argument("--threads", type=int, default=2)
    options.add_argument("--name", help="file name (default speed-MODEL)")
    options.add_argument("--busy-ok", action="store_true", help="time on a busy machine anyway")
    options.add_argument(
        "--report-only",
        action="store_true",
        help="decode nothing: recompute the byte and floor columns of the stored JSON from the model's "
        "config and write the report again",
    )
    return options


def split_entry(text: str) -> tuple[str, str]:
    """`DRAFT@SHAPE` into the draft string and its shape (a chain's γ or a tree)."""
    draft, _, shape = text.rpartition("@")
    if not draft or not shape:
        raise SystemExit(f"precision_speed: a draft is DRAFT@GAMMA or DRAFT@SHAPE, got {text!r}")
    return draft, shape


def step_bytes(config: Any, mask: SkipMask | None, head_rows: int) -> float:
    """Bytes one step reads of the projections and the head, from the config's shapes (the plan's
    packed modules hold no `weight` parameter to count): each layer's attention (q, k, v, o) and MLP
    (gate, up, down) weights at their precision's share of bf16 (`BYTES_SHARE`; all at full precision
    where `mask` is None), and `head_rows` rows of the bf16 head."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * config.intermediate_size
    total = 0.0
    for index in range(config.num_hidden_layers):
        attn_bits = 16 if mask is None else mask.attn_bits(index)
        mlp_bits = 16 if mask is None else mask.mlp_bits(index)
        total += (attention * BYTES_SHARE[attn_bits] + mlp * BYTES_SHARE[mlp_bits]) * BF16
    return total + head_rows * hidden * BF16


def decoders(measurement: Any, entries: list[tuple[str, str]], new: int) -> tuple[dict[str, Any], dict, int]:
    runner, loaded = measurement.runner, measurement.loaded
    stop = eos_ids(loaded.model)
    found: dict[str, Any] = {AR: lambda p, g: autoregressive_decode(runner, p, new, eos_ids=stop)}
    drafts: dict[str, dict[str, Any]] = {}
    widest = 1
    for text, shape_text in entries:
        draft = Draft.parse(text, runner.num_layers)
        runner.prepare(draft.mask)
        head = None if draft.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(draft.vocab))
        mask, label = draft.mask, f"{draft}@{shape_text}"
        if shape_text.isdigit():
            gamma = int(shape_text)
            found[label] = lambda p, g, m=mask, h=head, k=gamma: speculative_decode(
                runner, p, m, new, k, eos_ids=stop, head=h
            )
            widest = max(widest, gamma + 1)
        else:
            tree = parse_tree(shape_text)
            if as_tree(tree) is None:
                raise SystemExit(
                    f"precision_speed: {shape_text!r} is a chain: write its γ, e.g. @{tree.depth}"
                )
            found[label] = lambda p, g, m=mask, h=head, t=tree: tree_decode(
                runner, p, m, t, new, eos_ids=stop, head=h
            )
            widest = max(widest, tree.verify_rows)
        rows = draft.vocab or runner.config.vocab_size
        drafts[label] = {
            "draft": str(draft),
            "shape": shape_text,
            "bytes": step_bytes(runner.config, mask, rows),
        }
    return found, drafts, widest


def annotate(results: dict[str, Any], drafts: dict[str, Any], ar_bytes: float, bandwidth: float) -> None:
    """Each draft's step against the autoregressive step and against its memory floor."""
    ar_step = 1e3 / results["ar_decode_tokens_per_second"]
    for label, facts in drafts.items():
        row = results[label]
        steps = row["drafts_per_round"]
        draft_step = row["breakdown_ms"]["draft"] / steps if steps else float("nan")
        floor = 1e3 * facts["bytes"] / bandwidth
        row |= {
            **facts,
            "draft_step_ms": draft_step,
            "draft_step_over_ar_step": draft_step / ar_step,
            "draft_floor_ms": floor,
            "draft_step_over_floor": draft_step / floor,
            "bytes_over_ar": facts["bytes"] / ar_bytes,
        }


def lossless_cell(check: dict[str, Any]) -> str:
    """`identical`, the near-ties within the measured tolerance, or NO (`bench.lossless`)."""
    if check["identical"]:
        return "identical"
    return f"near-ties {check['near_ties']}" if check["passed"] else "**NO**"


def report(results: dict[str, Any], command: str) -> str:
    lines = [
        f"# Drafts at lower precision, decoded: {results['model']}",
        "",
        f"CPU: {results['cpu']}. {results['kernel_plan_line']}. The autoregressive baseline and the "
        "verify run the target at full precision on this plan's kernels; the drafts' int8/int4 "
        "layers run skipsearch's int kernels in the fused layers.",
        "",
        f"Copy bandwidth {results['bandwidth'] / 1e9:.1f} GB/s. The autoregressive step reads "
        f"{results['ar_bytes'] / 1e6:.0f} MB of weights (floor {results['ar_floor_ms']:.1f} ms).",
        "",
        f"Command: `{command}`.",
        "",
    ]
    for part, title in (("decode", "Held-out HumanEval prompts"), ("spec_bench", "Spec-Bench")):
        block = results.get(part)
        if not block:
            continue
        groups = block["categories"] if part == "spec_bench" else {"humaneval": block}
        lines += [f"## {title}", ""]
        for group, data in groups.items():
            meta = data["meta"]
            ar_step = 1e3 / data["ar_decode_tokens_per_second"]
            lines += [
                f"**{group}**: {data['prompts']} prompts × {data['repeats']} repeats, "
                f"{results['new_tokens']} new tokens; load average before "
                f"{meta['load_before']}, after "
                f"{meta['load_after']}; {meta['minutes']:.1f} min. "
                f"Autoregressive: {data['ar_decode_tokens_per_second']:.1f} tok/s decode-only "
                f"({ar_step:.1f} ms a step).",
                "",
            ]
            rows = []
            for label in results["labels"]:
                row = data[label]
                ratio = row["decode_only"]
                rows.append(
                    [
                        f"`{label}`",
                        f"{ratio['aggregate']:.3f}",
                        f"{ratio['median']:.3f} ({ratio['min']:.2f}–{ratio['max']:.2f})",
                        f"{row['tokens_per_round']:.2f}",
                        f"{row['draft_step_ms']:.1f}",
                        f"{row['draft_step_over_ar_step']:.2f}",
                        f"{row['bytes_over_ar']:.2f}",
                        f"{row['draft_floor_ms']:.1f}",
                        f"{row['draft_step_over_floor']:.2f}",
                        f"{row['breakdown_ms']['verify']:.1f}",
                        lossless_cell(row["lossless"]),
                    ]
                )
            lines += markdown_table(
                [
                    "draft@shape",
                    "decode-only ×AR",
                    "per pair median (range)",
                    "tokens/round",
                    "draft step ms",
                    "÷ AR step",
                    "bytes ÷ AR's",
                    "floor ms",
                    "÷ floor",
                    "verify ms",
                    "lossless",
                ],
                rows,
            )
            lines.append("")
    return "\n".join(lines)


def report_only(name: str, model: str) -> None:
    """The stored measurement's report again, its bytes counted from the model's config (the timings
    are the stored ones)."""
    from skipsearch.models.loading import load_model

    path = OUT / f"{name}.json"
    results = json.loads(path.read_text())
    config = load_model(model, announce=False).model.config
    ar_bytes = step_bytes(config, None, config.vocab_size)
    results |= {"ar_bytes": ar_bytes, "ar_floor_ms": 1e3 * ar_bytes / results["bandwidth"]}
    blocks = [results["decode"], *results.get("spec_bench", {}).get("categories", {}).values()]
    for block in blocks:
        drafts = {}
        for label in results["labels"]:
            draft = Draft.parse(block[label]["draft"], config.num_hidden_layers)
            rows = draft.vocab or config.vocab_size
            drafts[label] = {
                **{k: block[label][k] for k in ("draft", "shape")},
                "bytes": step_bytes(config, draft.mask, rows),
            }
        annotate(block, drafts, ar_bytes, results["bandwidth"])
    path.write_text(json.dumps(results, indent=1, default=str))
    text = report(results, results.get("command", ""))
    (OUT / f"{name}.md").write_text(text + "\n")
    print(text)


def main() -> None:
    args = parser().parse_args()
    if args.report_only:
        report_only(args.name or f"speed-{args.model}", args.model)
        return
    if not args.drafts:
        sys.exit(
            "precision_speed: give --drafts DRAFT@GAMMA ... (or --report-only to rewrite a stored report)"
        )
    configure(args.threads)
    busy = busy_cpu_warning()
    if busy and not args.busy_ok:
        sys.exit(f"precision_speed: {busy}: timings must run alone (or pass --busy-ok)")
    entries = [split_entry(text) for text in args.drafts]
    vocabs = tuple(sorted({v for d, _ in entries if (v := split_draft(d)[1]) is not None}))
    measurement = prepare(MeasureConfig(model=args.model, prompts=SEARCH_PROMPTS, draft_vocabs=vocabs))
    runner, loaded = measurement.runner, measurement.loaded
    found, drafts, widest = decoders(measurement, entries, args.new_tokens)
    bandwidth = statistics.median(copy_bandwidth(runner.device, WallClock()) for _ in range(3))
    ar_bytes = step_bytes(runner.config, None, runner.config.vocab_size)
    results: dict[str, Any] = {
        "model": args.model,
        "cpu": describe_cpu(),
        "labels": list(drafts),
        "new_tokens": args.new_tokens,
        "bandwidth": bandwidth,
        "ar_bytes": ar_bytes,
        "ar_floor_ms": 1e3 * ar_bytes / bandwidth,
        **loaded.plan.to_record(),
    }
    blocks: dict[str, list] = {}
    prompts = held_out_prompts(loaded.tokenizer, args.prompts)
    blocks["decode"] = [("humaneval", [p[-SEARCH_PROMPTS.max_prompt_tokens :] for p in prompts])]
    if args.spec_bench:
        chosen = spec_bench_prompts(args.spec_bench, loaded.tokenizer, args.per_category, 512)
        blocks["spec_bench"] = list(chosen.items())
    for part, groups in blocks.items():
        measured = {}
        for group, group_prompts in groups:
            data = paired_decodes(runner, group_prompts, found, args.repeats, widest)
            annotate(data, drafts, ar_bytes, bandwidth)
            measured[group] = data
            print(f"{part} {group}: done", file=sys.stderr)
        results[part] = measured["humaneval"] if part == "decode" else {"categories": measured}
    command = "python experiments/precision_speed.py " + shlex.join(sys.argv[1:])
    results["command"] = command
    name = args.name or f"speed-{args.model}"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(results, indent=1, default=str))
    text = report(results, command)
    (OUT / f"{name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
