"""Token trees against chains: where the draft is unsure, do several candidates a round pay?

For one draft (a mask and a draft vocabulary) on one CPU:
- `predict`: on the search's 8 HumanEval prompts (`draft_vocab.SEARCH_PROMPTS`), teacher-forced
  (`shared-kv`): the rank of the target's token under the draft at every position, hence the
  top-k hit rates; each candidate shape's tokens per round (the chains' exact; each tree's
  re-scored exactly with the `rounds` estimator simulating its rounds), its round priced by the
  calibrated cost model on this CPU's latency profile (`cost.tree_cost`: draft passes of the tree's
  rows, a verify of all its nodes), and which shape the cost model picks: the search's choice.
  Fidelity: the engine (`tree_decode`, `speculative_decode`) decodes the same prompts greedily and
  its tokens per round, over the rounds that did not meet the output's end, beside the estimate.
- `decode`: autoregressive decoding, the best chain, the best static tree and the best dynamic
  tree (`n8`: EAGLE-2's expand and rerank at a node budget) by the prediction, on held-out
  HumanEval prompts (never seen by the prediction), interleaved and paired, every output checked
  token for token (`draft_vocab.paired_decodes`); where a round's time goes, with the rows of its passes.
- `spec-bench`: the same decoders on each of Spec-Bench's six categories (mt-bench,
  translation, summarization, qa, math_reasoning, rag; `--spec-bench PATH`, its
  `data/spec_bench/question.jsonl`): the leaderboard's own columns, "#Mean accepted tokens" (tokens
  per round) and "Speedup" (decode-only, over autoregressive decoding on the same kernels).

Timing: run it alone on an idle machine (`decode` and `spec-bench` refuse to start on a busy one
unless `--busy-ok`). Writes `{out}/{name}.md` and `.json`.

    python experiments/token_trees.py --model smollm2-135m --draft 'v:16384' --out R \\
        --profile ~/.cache/skipsearch/profiles/smollm2-135m-cpu-float32.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import configure, fmt, markdown_table, stamp_line
from draft_vocab import AR, SEARCH_PROMPTS, held_out_prompts, paired_decodes

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.acceptance.worker import prepare
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.tree_cost import score_tree, tree_round_time
from skipsearch.cpu.dtypes import describe_cpu
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.masks import Draft, split_draft
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.kernels import busy_cpu_warning
from skipsearch.models.loading import eos_ids
from skipsearch.tree_shapes import DynamicTree, Tree, TreeShape, as_tree, parse_tree

PARTS = ("predict", "decode", "spec-bench")
SHAPES = (
    "2x1", "3x1", "2x1x1", "2x2x1", "3x1x1", "3x2x1", "4x2x1", "2x1x1x1", "2x2x1x1", "3x2x1x1",
    "2x2x2x1", "2x2x1x1x1", "3x1x1x1x1", "4x1x1x1", "n3", "n4", "n6", "n8", "n12", "n16",
)  # fmt: skip
CHAINS = range(1, 9)
TOP_K = (1, 2, 3, 4, 8)
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
CHAIN, TREE, DYNAMIC = "chain", "tree", "dynamic"
SSDS = (CHAIN, TREE, DYNAMIC)


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--model", default="smollm2-135m")
    options.add_argument("--draft", required=True, help="the draft string, e.g. 'a:10-17|m:10-17|v:16384'")
    options.add_argument("--profile", required=True, help="this CPU's latency profile (skipsearch profile)")
    options.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), help="tree shapes to weigh (static 2x1, dynamic n8)"
    )
    options.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    options.add_argument("--decode-prompts", type=int, default=24)
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--new-tokens", type=int, default=64)
    options.add_argument("--spec-bench", help="Spec-Bench's question.jsonl (the spec-bench part)")
    options.add_argument("--per-category", type=int, default=4, help="Spec-Bench prompts per category")
    options.add_argument("--context", type=int, default=512, help="the context the cost model prices at")
    options.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    options.add_argument("--out", type=Path, required=True)
    options.add_argument("--name", help="file name (default: the model's)")
    options.add_argument("--busy-ok", action="store_true", help="time on a busy machine anyway")
    return options


def predict(
    measurement: Any, draft: Draft, latency: LatencyProfile, shapes: list[Tree], context: int
) -> dict:
    """The top-k curve and every shape's predicted speedup (module docstring)."""
    runner, reference = measurement.runner, measurement.estimator.reference
    vocab_ids = measurement.vocab_ids
    vocabs = () if draft.vocab is None else (draft.vocab,)
    shared = Estimator(runner, reference, "shared-kv", vocab_ids)
    profile = shared.evaluate(draft.mask, 0.0, vocabs).for_vocab(draft.vocab)
    form = Calibrated(latency, draft.mask, context, draft.vocab, runner.config.vocab_size)
    step = latency.step_time(context)
    rows: dict[str, dict[str, Any]] = {}
    for gamma in CHAINS:
        rounds = Estimator(runner, reference, "rounds", vocab_ids, round_gamma=gamma, round_vocab=draft.vocab)
        exact = rounds.evaluate(draft.mask, 0.0, vocabs).for_vocab(draft.vocab)
        chain = TreeShape.chain(gamma)
        rows[str(chain)] = _row(
            chain, exact.tokens_per_round(gamma), form, step, profile.tokens_per_round(gamma)
        )
    for shape in shapes:
        rounds = Estimator(runner, reference, "rounds", vocab_ids, round_vocab=draft.vocab, round_tree=shape)
        exact = rounds.evaluate(draft.mask, 0.0, vocabs).for_vocab(draft.vocab)
        teacher = score_tree(profile, form, shape).tokens_per_round
        rows[str(shape)] = _row(shape, exact.tree_tokens_per_round(shape), form, step, teacher)
    chains = [r for r in rows.values() if r["chain"]]
    trees = [r for r in rows.values() if not r["chain"] and not r["dynamic"]]
    dynamic = [r for r in rows.values() if r["dynamic"]]
    best = max(rows.values(), key=lambda r: (r["speedup"], -r["nodes"]))
    engine_rows(measurement, draft, rows)
    return {
        "top_k": {str(k): profile.top_k_hit_rate(k) for k in TOP_K},
        "shapes": rows,
        "best_chain": max(chains, key=lambda r: r["speedup"])["shape"],
        "best_tree": max(trees, key=lambda r: r["speedup"])["shape"] if trees else None,
        "best_dynamic": max(dynamic, key=lambda r: r["speedup"])["shape"] if dynamic else None,
        "choice": best["shape"],
        "step_ms": step * 1e3,
        "verify_cost_by_rows": {
            str(rows_): latency.weights(context, rows_).total / step for rows_ in (1, 2, 4, 8, 16, 32)
        },
    }


def engine_rows(measurement: Any, draft: Draft, rows: dict[str, dict[str, Any]]) -> None:
    """Each shape's tokens per round as the engine plays it, greedy on the prediction's own prompts
    for the reference's length, over the rounds that began at least a round's depth before the
    output's end (the estimator censors the rest): `engine_tokens_per_round` in each row."""
    runner, reference = measurement.runner, measurement.estimator.reference
    head = None if draft.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(draft.vocab))
    stop = eos_ids(measurement.loaded.model)
    for row in rows.values():
        shape = parse_tree(row["shape"])
        kept: list[int] = []
        for index in range(reference.input_ids.shape[0]):
            length = int(reference.prompt_lengths[index])
            prompt = reference.input_ids[index, :length].tolist()
            new = int(reference.lengths[index]) - length
            if as_tree(shape) is None:
                run = speculative_decode(
                    runner, prompt, draft.mask, new, shape.depth, eos_ids=stop, head=head, timed=False
                )
            else:
                run = tree_decode(
                    runner, prompt, draft.mask, shape, new, eos_ids=stop, head=head, timed=False
                )
            offset = 0
            for accepted in run.accepted:
                if offset <= new - shape.depth - 1:
                    kept.append(accepted + 1)
                offset += accepted + 1
        engine = sum(kept) / len(kept) if kept else 1.0
        row["engine_tokens_per_round"] = engine
        row["engine_error_pct"] = 100 * (row["tokens_per_round"] - engine) / engine


def _row(shape: Tree, tokens: float, form: Calibrated, step: float, teacher: float) -> dict[str, Any]:
    time = tree_round_time(form, shape) if as_tree(shape) is not None else form.round_time(shape.depth)
    return {
        "shape": str(shape),
        "chain": as_tree(shape) is None,
        "dynamic": isinstance(shape, DynamicTree),
        "nodes": shape.nodes,
        "draft_rows": list(shape.draft_rows),
        "verify_rows": shape.verify_rows,
        "tokens_per_round": tokens,
        "tokens_per_round_shared_kv": teacher,
        "round_steps": time.total / step,
        "draft_ms": time.draft * 1e3,
        "verify_ms": time.verify * 1e3,
        "speedup": tokens / (time.total / step),
    }


def decoders(measurement: Any, draft: Draft, chain: int, trees: dict[str, Tree], new: int) -> dict[str, Any]:
    runner, loaded = measurement.runner, measurement.loaded
    stop = eos_ids(loaded.model)
    head = None if draft.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(draft.vocab))
    mask = draft.mask
    found = {
        AR: lambda p, g: autoregressive_decode(runner, p, new, eos_ids=stop),
        CHAIN: lambda p, g: speculative_decode(runner, p, mask, new, chain, eos_ids=stop, head=head),
    }
    for label, tree in trees.items():
        found[label] = lambda p, g, tree=tree: tree_decode(
            runner, p, mask, tree, new, eos_ids=stop, head=head
        )
    return found


def spec_bench_prompts(path: Path, tokenizer: Any, per_category: int, max_tokens: int) -> dict[str, list]:
    """The first `per_category` questions of each of the leaderboard's six categories (mt-bench:
    its 80 questions over 8 subcategories, spread evenly), each its first turn, tokenized as
    `--prompts spec-bench` reads them."""
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mt = [q for q in questions if q["category"] not in SPEC_BENCH_CATEGORIES[1:]]
    by_category = {"mt_bench": mt[:: max(1, len(mt) // per_category)][:per_category]}
    for category in SPEC_BENCH_CATEGORIES[1:]:
        by_category[category] = [q for q in questions if q["category"] == category][:per_category]
    out = {}
    with tempfile.TemporaryDirectory() as scratch:  # PromptSpec reads a file: the chosen turns
        for category, chosen in by_category.items():
            file = Path(scratch) / f"{category}.jsonl"
            file.write_text("".join(json.dumps({"turns": q["turns"][:1]}) + "\n" for q in chosen))
            spec = PromptSpec(str(file), len(chosen), max_tokens, 64, 0)
            out[category] = [p.ids for p in encode_prompts(spec, tokenizer)]
    return out


def report(results: dict[str, Any], command: str) -> str:
    lines = [
        f"# Token trees against chains: {results['model']}, draft `{results['draft']}`",
        "",
        f"CPU: {results['cpu']}. {results['kernel_plan_line']}.",
        f"Command: `{command}`.",
        "",
    ]
    predicted = results.get("predict")
    if predicted:
        lines += [
            "## Predicted (the search's 8 HumanEval prompts, teacher-forced; priced at "
            f"{results['context']} tokens by this CPU's profile)",
            "",
            "The target's token among the draft's top k: "
            + ", ".join(f"top-{k} {rate:.3f}" for k, rate in predicted["top_k"].items())
            + ".",
            "",
            "A pass over r rows costs, in steps of one row: "
            + ", ".join(f"{rows} rows {cost:.2f}" for rows, cost in predicted["verify_cost_by_rows"].items())
            + ".",
            "",
        ]
        header = [
            "shape", "nodes", "draft rows", "verify rows", "tokens/round", "engine's", "round (steps)",
            "speedup",
        ]  # fmt: skip
        rows = sorted(predicted["shapes"].values(), key=lambda r: -r["speedup"])
        lines += markdown_table(
            header,
            [
                [
                    f"`{r['shape']}`" + (" (chain)" if r["chain"] else ""),
                    str(r["nodes"]),
                    "+".join(map(str, r["draft_rows"])),
                    str(r["verify_rows"]),
                    f"{r['tokens_per_round']:.3f}",
                    fmt(r.get("engine_tokens_per_round"), ".3f"),
                    f"{r['round_steps']:.3f}",
                    f"{r['speedup']:.3f}",
                ]
                for r in rows
            ],
        )
        errors = [abs(r["engine_error_pct"]) for r in rows if "engine_error_pct" in r]
        if errors:
            lines += [
                "",
                "tokens/round: the `rounds` estimator's; engine's: the engine's greedy decode of the same "
                "prompts (rounds clear of the output's end). Largest gap "
                f"{max(errors):.1f}% over {len(errors)} shapes.",
            ]
        lines += ["", f"The cost model picks `{predicted['choice']}`.", ""]
        if predicted.get("command", command) != command:
            lines += [f"This part's command: `{predicted['command']}`.", ""]
        if predicted.get("kernel_plan_line", results["kernel_plan_line"]) != results["kernel_plan_line"]:
            lines += [
                f"This part ran on {predicted['kernel_plan_line']}: its costs come from the profile, "
                "not from its own timings.",
                "",
            ]
    for part, title in (("decode", "Decoded (held-out HumanEval prompts)"), ("spec_bench", "Spec-Bench")):
        if part not in results:
            continue
        lines += [f"## {title}", ""]
        block = results[part]
        groups = block["categories"] if part == "spec_bench" else {"humaneval": block}
        header = [
            "prompts",
            "decoder",
            "#Mean accepted tokens",
            "Speedup (decode-only)",
            "spread",
            "lossless",
        ]
        table = []
        for category, measured in groups.items():
            for label in block["shapes"]:
                m = measured[label]
                spread = m["decode_only"]
                table.append([
                    category,
                    f"{label} `{block['shapes'][label]}`",
                    f"{m['tokens_per_round']:.2f}",
                    f"{spread['aggregate']:.3f}x",
                    f"{spread['min']:.3f}-{spread['max']:.3f}",
                    "yes" if m["lossless"]["passed"] else "NO",
                ])  # fmt: skip
        lines += markdown_table(header, table)
        lines += ["", stamp_line(block["meta"]), ""]
        if block.get("command", command) != command:
            lines += [f"This part's command: `{block['command']}`.", ""]
        if part == "decode":
            lines += ["Where a round's time goes (ms per round):", ""]
            phases = ("draft", "verify", "sample", "cache", "other")
            lines += markdown_table(
                ["decoder", *phases],
                [
                    [label, *(fmt(block[label]["breakdown_ms"][p], ".2f") for p in phases)]
                    for label in block["shapes"]
                ],
            )
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parser().parse_args()
    configure(args.threads)
    timing = {"decode", "spec-bench"} & set(args.parts)
    busy = busy_cpu_warning()
    if timing and busy and not args.busy_ok:
        sys.exit(f"token_trees: {busy}: timings must run alone (or pass --busy-ok)")
    latency = LatencyProfile.load(Path(args.profile).expanduser())
    vocab = split_draft(args.draft)[1]
    vocabs = () if vocab is None else (vocab,)
    config = MeasureConfig(model=args.model, prompts=SEARCH_PROMPTS, mode="shared-kv", draft_vocabs=vocabs)
    measurement = prepare(config)
    runner, loaded = measurement.runner, measurement.loaded
    draft = Draft.parse(args.draft, runner.num_layers)
    shapes = [parse_tree(s) for s in args.shapes]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or args.model
    path = out / f"{name}.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    results |= {"model": args.model, "draft": str(draft), "cpu": describe_cpu(), "context": args.context}
    if timing or "kernel_plan_line" not in results:  # the report's plan is the timed parts' plan
        results |= loaded.plan.to_record()
    if "predict" in args.parts:
        results["predict"] = predict(measurement, draft, latency, shapes, args.context)
    predicted = results["predict"]
    chain = TreeShape.parse(predicted["best_chain"]).depth
    trees = {
        label: parse_tree(predicted[key])
        for label, key in ((TREE, "best_tree"), (DYNAMIC, "best_dynamic"))
        if predicted.get(key)
    }
    shapes_used = {CHAIN: str(TreeShape.chain(chain)), **{label: str(t) for label, t in trees.items()}}
    widest = max(chain + 1, *(t.verify_rows for t in trees.values()))
    if "decode" in args.parts:
        prompts = held_out_prompts(loaded.tokenizer, args.decode_prompts)
        prompts = [p[-SEARCH_PROMPTS.max_prompt_tokens :] for p in prompts]
        found = decoders(measurement, draft, chain, trees, args.new_tokens)
        results["decode"] = {
            **paired_decodes(runner, prompts, found, args.repeats, widest),
            "shapes": shapes_used,
        }
    if "spec-bench" in args.parts:
        if not args.spec_bench:
            sys.exit("token_trees: the spec-bench part needs --spec-bench PATH (Spec-Bench's question.jsonl)")
        prompts = spec_bench_prompts(Path(args.spec_bench), loaded.tokenizer, args.per_category, 512)
        found = decoders(measurement, draft, chain, trees, args.new_tokens)
        categories = {}
        for category, chosen in prompts.items():
            categories[category] = paired_decodes(runner, chosen, found, args.repeats, widest)
        metas = [c.pop("meta") for c in categories.values()]
        meta = {
            **metas[0],
            "load_after": metas[-1]["load_after"],
            "minutes": sum(m["minutes"] for m in metas),
        }
        results["spec_bench"] = {"categories": categories, "meta": meta, "shapes": shapes_used}
    command = "python experiments/token_trees.py " + shlex.join(sys.argv[1:])
    for part in args.parts:  # which command and plan measured each part, when a later run redoes one
        results[part.replace("-", "_")] |= {"command": command, "kernel_plan_line": loaded.plan.line}
    path.write_text(json.dumps(results, indent=1))
    (out / f"{name}.md").write_text(report(results, command))
    print(report(results, command))


if __name__ == "__main__":
    main()
