"""`skipsearch decode`: real self-speculative decoding of one mask against the baselines.

In one process, interleaved over repeats and prompts: autoregressive decoding through the
layer-wise runner, `model.generate`, the SSD engine, and — for a contiguous prefix —
`model.generate(assistant_early_exit=E)`. Reports tokens/s and speedup over `generate`,
measured acceptance and tokens per round next to the estimator's prediction, the lossless check
(greedy SSD == autoregressive, exit 1 otherwise) and the round-time breakdown by context length.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.cli.common import (
    add_draft_vocab_option,
    add_kv_options,
    add_mask_options,
    add_model_options,
    add_prompt_options,
    add_weight_options,
    random_weights,
)
from skipsearch.errors import ConfigError, SkipsearchError
from skipsearch.masks import FULL_KV, KVPattern, parse_draft_vocab
from skipsearch.options import option_type
from skipsearch.store import check_cache_dir, check_output_file, write_text_atomic
from skipsearch.tree_shapes import as_tree

if TYPE_CHECKING:
    from skipsearch.bench.decode_report import DecodeReport, GraphedComparison

DEFAULT_GAMMA = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "decode",
        help="real SSD with one mask vs autoregressive decoding",
        description="Self-speculative decoding with one mask: speed, acceptance, lossless check, "
        "latency breakdown, next to the estimator's prediction.",
    )
    add_model_options(parser)
    add_weight_options(parser)
    add_prompt_options(parser)
    add_mask_options(parser)
    parser.add_argument(
        "--from",
        dest="from_path",
        metavar="PATH",
        help="JSON with a 'mask' string and optional 'gamma' or 'gamma_best' (e.g. a run's best.json), "
        "or a tier set's tiers.json",
    )
    parser.add_argument(
        "--max-new-tokens",
        dest="new_tokens",
        type=option_type("new_tokens"),
        default=argparse.SUPPRESS,
        help="same as --new-tokens",
    )
    parser.add_argument(
        "--gamma",
        type=option_type("gamma"),
        help=f"draft length (default: from --from, else {DEFAULT_GAMMA})",
    )
    parser.add_argument(
        "--tree",
        metavar="SHAPE",
        help="draft token trees of this shape, e.g. 2x2x1 (children per node by depth), or dynamic "
        "ones, e.g. n16d5k2 (a node budget, draft passes, children a node); default: from --from, else "
        "a chain of --gamma. Decoded beside the same draft as a chain of --gamma",
    )
    parser.add_argument(
        "--tree-nodes",
        type=option_type("tree_nodes"),
        metavar="N",
        help="draft dynamic token trees of N nodes (EAGLE-2's expand and rerank; the default depth, "
        "2 children a node): the same as --tree nN",
    )
    parser.add_argument(
        "--dynamic-gamma",
        action="store_true",
        help="adapt gamma to recent acceptance (starts at --gamma, range 2..8, switches off below 0.4)",
    )
    parser.add_argument(
        "--draft-stop",
        type=option_type("round_stop"),
        default=0.0,
        metavar="TAU",
        help="end a round after a draft token the draft itself gives a probability below TAU, so "
        "gamma is the most a round drafts (default 0: never; experiments/draft_stop.py predicts TAU)",
    )
    add_draft_vocab_option(parser, "draft from a draft vocabulary (default: from --from, else full)")
    add_kv_options(parser)
    parser.add_argument(
        "--temperature", type=option_type("temperature"), default=0.0, help="0 = greedy (default)"
    )
    parser.add_argument(
        "--top-p", type=option_type("top_p"), default=1.0, help="nucleus sampling mass (default 1.0)"
    )
    parser.add_argument("--top-k", type=option_type("top_k"), help="sample among the k most likely tokens")
    parser.add_argument(
        "--repeats", type=option_type("repeats"), default=3, help="timed passes over the prompts (default 3)"
    )
    parser.add_argument(
        "--seed", type=option_type("decode_seed"), default=0, help="sampling seed (default %(default)s)"
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="also decode the draft (with --tree, its trees and its chain) and the autoregressive "
        "baseline on CUDA graphs, and compare them (needs --device cuda; with a tier set, same as "
        "--require-graphs)",
    )
    parser.add_argument(
        "--require-graphs",
        action="store_true",
        help="with a tier set: fail instead of decoding eagerly when CUDA graphs cannot be captured",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="time every SSD round phase by phase (draft, verify, sample, cache): a device sync at each "
        "phase boundary, which on a GPU stalls the queue, so only when asked",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    parser.set_defaults(handler=run)


def read_tree(path: Path) -> str | None:
    """A JSON file's token-tree shape (a search run's best.json names one when a tree won)."""
    try:
        tree = json.loads(path.read_text()).get("tree")
    except (OSError, ValueError, AttributeError):
        return None
    shape = as_tree(tree)  # `chain`: no tree
    return None if shape is None else str(shape)


def read_from(path: Path) -> tuple[str, int | None]:
    """The draft of a JSON file — its `mask` string, plus `|v:K` when it names a `draft_vocab` and
    `|kv:sSwW` when it names a `kv` pattern — and its optional `gamma` (or a search run's
    `gamma_best`)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read --from {path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("mask"), str):
        raise ConfigError(f'{path} has no "mask" string: pass a run\'s best.json or {{"mask": "a:4|m:4"}}')
    key = "gamma" if "gamma" in data else "gamma_best"
    gamma = data.get(key)
    if gamma is not None and (not isinstance(gamma, int) or gamma < 1):
        raise ConfigError(
            f"{path}: {key} must be an integer >= 1, got {gamma!r}: fix the file, or pass --gamma"
        )
    with named_file(path):
        vocab, kv = parse_draft_vocab(data.get("draft_vocab")), KVPattern.parse(data.get("kv"))
    draft = data["mask"] + ("" if vocab is None else f"|v:{vocab}") + ("" if kv is None else f"|kv:{kv}")
    return draft, gamma


@contextmanager
def named_file(path: Path) -> Iterator[None]:
    """Errors about a value read from `path` (not typed) start with the file's name."""
    try:
        yield
    except SkipsearchError as error:
        raise type(error)(f"{path}: {error}") from None


def run(args: argparse.Namespace) -> int:
    from skipsearch.api import decode_report
    from skipsearch.bench.decode import check_graphable, check_tree
    from skipsearch.cli.common import (
        check_mask_args,
        draft_vocab_from_args,
        kv_pattern_from_args,
        mask_from_args,
        measure_config,
    )
    from skipsearch.engine import GammaPolicy, Sampling
    from skipsearch.masks import Draft, split_draft
    from skipsearch.models.device import check_device
    from skipsearch.run.preflight import known_depth
    from skipsearch.tiers.manifest import is_tier_manifest

    kv = kv_pattern_from_args(args)
    if args.json:  # the outputs before any work
        check_output_file(args.json, "--json")
    check_cache_dir()
    if args.graphs and not args.device.startswith("cuda"):
        raise ConfigError(
            f"--graphs captures CUDA graphs, which need a GPU, but --device is {args.device}: "
            "pass --device cuda, or drop --graphs"
        )
    args.require_graphs = args.require_graphs or args.graphs
    if args.from_path and is_tier_manifest(Path(args.from_path)):
        from skipsearch.cli.decode_tiers import run_tiers

        if kv is not None:
            raise ConfigError("a tier set decodes with full attention: drop --kv-sink/--kv-window")
        if args.draft_stop:
            raise ConfigError("a tier set's rounds draft their full gamma: drop --draft-stop")

        return run_tiers(args)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    mask_text, file_gamma = read_from(Path(args.from_path)) if args.from_path else (None, None)
    if args.tree is not None and args.tree_nodes is not None:
        raise ConfigError("give the tree once: --tree, or --tree-nodes")
    shape = f"n{args.tree_nodes}" if args.tree_nodes is not None else args.tree
    shape = shape or (read_tree(Path(args.from_path)) if args.from_path else None)
    tree = as_tree(shape)
    if mask_text is not None and any(
        value is not None for value in (args.skip, args.mask, args.attn_skip, args.mlp_skip)
    ):
        raise ConfigError("give the mask once: --from, --skip, --mask, or --attn-skip/--mlp-skip")
    gamma = next((g for g in (args.gamma, file_gamma) if g is not None), DEFAULT_GAMMA)
    if gamma < 1:
        raise ConfigError(f"--gamma must be >= 1, got {gamma}")
    policy = (
        GammaPolicy(initial=gamma, stop_below=args.draft_stop)
        if args.dynamic_gamma
        else GammaPolicy.fixed(gamma, args.draft_stop)
    )
    if args.graphs:
        check_graphable(kv, policy)
    if tree is not None:
        check_tree(tree, kv, policy, args.graphs)

    config = measure_config(args)
    if args.round_gamma is None:  # the round-aware estimator simulates the rounds this decode runs
        config = replace(config, round_gamma=gamma, round_stop=args.draft_stop)
    depth = known_depth(args.model)
    if mask_text is None:
        check_mask_args(args, depth)
    elif depth is not None:
        Draft.parse(mask_text, depth)
    check_device(args.device)  # the first check that imports torch
    file_vocab = None if mask_text is None else split_draft(mask_text)[1]
    if file_vocab is not None and args.draft_vocab is None:  # the file's draft vocabulary
        config = replace(config, draft_vocabs=(file_vocab,))
    weights = random_weights(args)

    def pick_draft(num_layers: int) -> Draft:  # checked before anything slow
        if not mask_text:  # --mask may carry `|v:K` and `|kv:sSwW`; the *_from_args read flags and mask
            return Draft(mask_from_args(args, num_layers), draft_vocab_from_args(args), kv)
        with named_file(Path(args.from_path)):
            draft = Draft.parse(mask_text, num_layers)
        vocab = draft.vocab if args.draft_vocab is None else draft_vocab_from_args(args)
        return Draft(draft.mask, vocab, kv if kv is not None else draft.kv)

    result = decode_report(
        config,
        pick_draft,
        policy,
        sampling,
        args.new_tokens,
        args.repeats,
        args.seed,
        args.breakdown,
        weights,
        args.graphs,
        tree,
    )
    print_result(result)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(result.to_json(), indent=2))
    return 0 if result.lossless else 1


def print_result(result: DecodeReport) -> None:
    from rich.console import Console

    from skipsearch.bench.decoders import EARLY_EXIT
    from skipsearch.cli.decode_tables import fmt, print_breakdown, print_caveats, summary_table, verdict

    console = Console()
    conditions = result.conditions
    sampling = conditions.sampling
    decoding = "greedy" if sampling.greedy else f"sampling {asdict(sampling)}"
    gamma = f"dynamic from {result.gamma}" if result.dynamic_gamma else str(result.gamma)
    if result.draft_stop:
        gamma += f", stopping below {result.draft_stop}"
    if result.tree is not None:
        gamma = f"token trees {result.tree}, beside the chain of gamma {gamma}"
    kv = "" if result.kv == FULL_KV else f"  KV pattern [cyan]{result.kv}[/]"
    console.print(
        f"[bold]{result.model}[/]  mask [cyan]{result.mask}[/]{kv}  gamma {gamma}  {decoding}\n"
        f"{conditions.prompts} prompts x {conditions.repeats} repeats, <= {conditions.max_new_tokens} new "
        "tokens"
    )

    def label(name: str) -> str:
        return f"{name} E={result.exit_layer}" if name == EARLY_EXIT else name

    console.print(summary_table(result.summaries, "HF", label))
    print_caveats(console, conditions.timing_caveats)
    if result.random_weights:
        console.print(
            "random weights: acceptance and tokens/round say nothing about the real model; "
            "the time per pass does"
        )
    for est in result.estimators:
        line = f"estimator {est.mode}: alpha {est.alpha:.3f} (engine {fmt(est.measured_acceptance)})"
        if est.tokens_per_round is None:
            line += f"; no tokens/round prediction: {est.no_prediction}"
        else:
            line += (
                f", tokens/round {est.tokens_per_round:.3f} (engine "
                f"{fmt(est.measured_tokens_per_round)}, error {fmt(est.relative_error, '+.1%')})"
            )
        console.print(line)
    console.print(f"lossless (greedy SSD == autoregressive, every prompt): {verdict(result.lossless_check)}")
    if result.hf_matches_autoregressive is not None:
        console.print(f"HF generate == autoregressive runner: {result.hf_matches_autoregressive}")
    print_graphs(console, result.graphs)
    print_breakdown(console, result.breakdown)


def print_graphs(console: Any, graphs: GraphedComparison | None) -> None:
    """The graphed comparison, when the decode ran one."""
    if graphs is None:
        return
    console.print(
        f"graphed ({graphs.mode}): SSD {graphs.ssd_vs_graphed_autoregressive:.3f}x the graphed "
        f"autoregressive decode, which runs {graphs.graphed_vs_eager_autoregressive:.2f}x the eager one; "
        f"graphed == eager autoregressive tokens: {graphs.graphed_autoregressive_matches}"
    )
