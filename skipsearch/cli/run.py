"""`skipsearch run`: search the skip-mask space of one model, write its run directory (`runs/<run>/`
unless `--out` says where)."""

from __future__ import annotations

import argparse
from pathlib import Path

from skipsearch.acceptance.importance import IMPORTANCE_SOURCES
from skipsearch.cli.common import (
    add_draft_vocab_option,
    add_kv_options,
    add_model_options,
    add_prompt_options,
)
from skipsearch.cli.executor_options import add_executor_options, executor_factory
from skipsearch.config import RunConfig
from skipsearch.options import option_type
from skipsearch.search.objective import AUTO_COST, COSTS, OBJECTIVES
from skipsearch.search.strategies import SAMPLER_PACKAGES, STRATEGIES


def add_search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=option_type("budget"),
        default=RunConfig.budget,
        help="distinct masks to measure (default %(default)s)",
    )
    parser.add_argument(
        "--space",
        default=RunConfig.space,
        help="search space name (search_spaces/) or YAML path (default %(default)s)",
    )
    parser.add_argument(
        "--gamma-max",
        type=option_type("gamma_max"),
        help="largest draft length scored (default: the space file's gamma_max, 8 in the shipped spaces)",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=RunConfig.objective,
        help="what a mask is scored by: its modelled speedup at the best gamma, or its acceptance rate "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--cost",
        choices=(AUTO_COST, *COSTS),
        default=AUTO_COST,
        help="cost model for the score; auto: calibrated once `skipsearch profile` has measured the "
        "model on this device, else closed-form (default %(default)s)",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="score with the profile of CUDA-graph replays (`skipsearch profile --graphs`, --device cuda), "
        "what a graphed engine pays, instead of the eager one",
    )
    parser.add_argument("--pareto", action="store_true", help="multi-objective: speedup vs r_draft")
    parser.add_argument(
        "--seed",
        type=option_type("seed"),
        default=RunConfig.seed,
        help="search seed: sampler and random masks (default %(default)s)",
    )
    parser.add_argument(
        "--sampler",
        choices=tuple(SAMPLER_PACKAGES),
        default=RunConfig.sampler,
        help="the Optuna sampler of --strategy learned (default %(default)s)",
    )
    parser.add_argument("--warm-start", action="store_true", help="learned: start from the best baselines")
    parser.add_argument(
        "--temperature",
        type=option_type("temperature"),
        default=RunConfig.temperature,
        help="for sampling acceptance (default %(default)s)",
    )
    add_draft_vocab_option(parser, "score every mask with this draft vocabulary only (overrides the space)")
    add_kv_options(parser)  # score every mask with this KV pattern only (overrides the space's kv:)
    parser.add_argument(
        "--tree",
        nargs="+",
        metavar="SHAPE",
        help="score every draft also drafting token trees of these shapes, e.g. 2x1 2x2x1 (children per "
        "node by depth) or n8 n16 (dynamic trees of that many nodes); `chain`: chains only; default: the "
        "space file's tree: list",
    )
    add_context_options(parser)
    parser.add_argument(
        "--importance",
        choices=IMPORTANCE_SOURCES,
        default=RunConfig.importance,
        help="what ranks sub-layers for ranking/knapsack: the stream-cosine proxy from the reference "
        "cache (no mask measured), or each single-unit mask measured, taken from the budget "
        "(default %(default)s)",
    )


def add_context_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context",
        type=option_type("context"),
        help="score with the latency profile at this context length (tokens; interpolated between "
        "profiled lengths; default 512)",
    )
    parser.add_argument(
        "--extrapolate-context",
        action="store_true",
        help="allow a --context outside the profiled range (extends the end segments linearly)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="search which layers the draft should skip")
    add_model_options(parser)
    add_prompt_options(parser)
    add_search_options(parser)
    add_executor_options(parser)
    parser.add_argument(
        "--strategy",
        choices=tuple(STRATEGIES),
        default=RunConfig.strategy,
        help="knapsack+tpe: knapsack candidates for a third of the budget, then TPE (default %(default)s)",
    )
    parser.add_argument("--out", help="run directory (default runs/<model>-<space>-<strategy>-s<seed>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out to its budget")
    parser.set_defaults(handler=run)


# Option dest -> the `RunConfig` field it sets: `--resume` refuses a typed one that differs, but for
# the budget, which a typed `--budget` changes (and an untyped one keeps).
STORED_OPTIONS = {
    "budget": "budget",
    "model": "measure.model",
    "device": "measure.device",
    "dtype": "measure.dtype",
    "mode": "measure.mode",
    "round_gamma": "measure.round_gamma",
    "prompts": "measure.prompts.source",
    "n_prompts": "measure.prompts.n_prompts",
    "max_prompt_tokens": "measure.prompts.max_prompt_tokens",
    "new_tokens": "measure.prompts.new_tokens",
    "prompt_seed": "measure.prompts.seed",
    "space": "space",
    "strategy": "strategy",
    "sampler": "sampler",
    "seed": "seed",
    "gamma_max": "gamma_max",
    "objective": "objective",
    "cost": "cost",
    "graphs": "graphs",
    "pareto": "pareto",
    "warm_start": "warm_start",
    "temperature": "temperature",
    "context": "context",
    "extrapolate_context": "extrapolate_context",
    "importance": "importance",
    "draft_vocab": "draft_vocab",
    "kv_sink": "kv",
    "kv_window": "kv",
    "tree": "trees",
}


def typed_settings(args: argparse.Namespace) -> dict[str, str]:
    """The stored settings this command line sets, as `RunConfig` field -> option name."""
    typed = getattr(args, "typed", frozenset())
    return {field: "--" + dest.replace("_", "-") for dest, field in STORED_OPTIONS.items() if dest in typed}


def run_config(args: argparse.Namespace, strategy: str) -> RunConfig:
    from skipsearch.cli.common import draft_vocab_from_args, kv_pattern_from_args, measure_config
    from skipsearch.tree_shapes import parse_trees

    kv = kv_pattern_from_args(args)

    return RunConfig(
        measure=measure_config(args),
        space=args.space,
        strategy=strategy,
        sampler=args.sampler,
        budget=args.budget,
        seed=args.seed,
        gamma_max=args.gamma_max,
        objective=args.objective,
        cost=args.cost,
        pareto=args.pareto,
        warm_start=args.warm_start,
        temperature=args.temperature,
        draft_vocab=None if args.draft_vocab is None else (draft_vocab_from_args(args),),
        trees=None if args.tree is None else tuple(str(shape) for shape in parse_trees(args.tree)),
        kv=None if kv is None else (kv,),
        context=args.context,
        extrapolate_context=args.extrapolate_context,
        importance=args.importance,
        graphs=args.graphs,
    )


def run(args: argparse.Namespace) -> int:
    from skipsearch.api import default_out, search_into

    config = run_config(args, args.strategy)
    make_executor = executor_factory(args)  # checks the executor options before the model loads
    out = Path(args.out) if args.out else default_out(config)
    args.resume_dir = out  # an interrupt says how to resume it (`cli.main`)
    result = search_into(
        config, out, resume=args.resume, typed=typed_settings(args), executor_factory=make_executor
    )
    print(result.markdown)  # plain: a console would wrap the mask line mid-token
    print(
        f"{int((~result.trials['repeat'].astype(bool)).sum())} masks scored, {result.measured_now} measured "
        f"in this session; files in {out}"
    )
    return 0
