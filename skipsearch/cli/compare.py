"""`skipsearch compare`: random vs uniform vs learned at the same budget and seeds."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from skipsearch.cli.common import add_model_options, add_prompt_options
from skipsearch.cli.executor_options import add_executor_options, executor_factory
from skipsearch.cli.run import add_search_options
from skipsearch.config import COMPARED_STRATEGIES  # not run.pipeline: registering loads no matplotlib
from skipsearch.options import option_type

COMPARE_OPTIONS = ("strategies", "seeds", "random_multiple")  # stored in run.yaml's `compare:`


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("compare", help="search strategies side by side at equal budget")
    add_model_options(parser)
    add_prompt_options(parser)
    add_search_options(parser)
    add_executor_options(parser)
    parser.add_argument(
        "--seeds", type=option_type("seeds"), default=3, help="seeds per strategy (default %(default)s)"
    )
    parser.add_argument(
        "--strategies",
        default=",".join(COMPARED_STRATEGIES),
        help="comma-separated strategies to compare (default %(default)s)",
    )
    parser.add_argument(
        "--random-multiple",
        type=option_type("random_multiple"),
        default=0,
        metavar="M",
        help="also run random search at M times the budget, the reference to beat (default: none)",
    )
    parser.add_argument("--out", help="directory (default runs/compare-<model>-<space>)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted compare")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from skipsearch.api import default_compare_out
    from skipsearch.cli.run import run_config, typed_settings
    from skipsearch.config import CompareSettings
    from skipsearch.progress import console
    from skipsearch.run.compare import run_compare
    from skipsearch.run.compare_tables import write_compare_outputs
    from skipsearch.store import COMPARISON_SUMMARY, COMPARISON_TABLE, CONVERGENCE_PLOT

    config = run_config(args, "learned")
    out = Path(args.out) if args.out else default_compare_out(config)
    args.resume_dir = out  # an interrupt says how to resume it (`cli.main`)

    def progress(name: str) -> Callable[[int, int, float | None], None]:
        def on_trial(scored: int, total: int, best: float | None) -> None:
            console.print(
                f"{name}: {scored}/{total} best {best:.3f}" if best else f"{name}: {scored}/{total}"
            )

        return on_trial

    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    compare = CompareSettings(strategies, args.seeds, args.random_multiple)
    typed = typed_settings(args) | {
        f"compare.{dest}": "--" + dest.replace("_", "-") for dest in COMPARE_OPTIONS if dest in args.typed
    }
    studies = run_compare(config, compare, out, args.resume, progress, executor_factory(args), typed)
    Console().print(write_compare_outputs(out, studies))
    Console().print(f"{COMPARISON_TABLE}, {COMPARISON_SUMMARY} and {CONVERGENCE_PLOT} in {out}")
    return 0
