"""`skipsearch run`: search the skip-mask space of one model, write `results/<run>/`."""

from __future__ import annotations

import argparse
from pathlib import Path

from skipsearch.cli.common import add_draft_vocab_option, add_model_options, add_prompt_options
from skipsearch.cli.executor_options import add_executor_options, executor_factory


def add_search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget", type=int, default=60, help="distinct masks to measure (default %(default)s)"
    )
    parser.add_argument("--space", default="sparse", help="search space name (search_spaces/) or YAML path")
    parser.add_argument("--gamma-max", type=int, default=8, help="largest draft length scored (default 8)")
    parser.add_argument("--objective", choices=("speedup", "acceptance"), default="speedup")
    parser.add_argument(
        "--cost",
        choices=("auto", "closed-form", "calibrated"),
        default="auto",
        help="cost model for the score; auto: calibrated once `skipsearch profile` has measured the "
        "model on this device, else closed-form (default %(default)s)",
    )
    parser.add_argument("--pareto", action="store_true", help="multi-objective: speedup vs r_draft")
    parser.add_argument("--sampler", choices=("tpe", "gp", "cmaes", "nsga2"), default="tpe")
    parser.add_argument("--warm-start", action="store_true", help="learned: start from the best baselines")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="for sampling acceptance (default 1.0)"
    )
    add_draft_vocab_option(parser, "score every mask with this draft vocabulary only (overrides the space)")
    add_context_options(parser)
    parser.add_argument(
        "--importance",
        choices=("proxy", "measured"),
        default="proxy",
        help="what ranks sub-layers for ranking/knapsack: the stream-cosine proxy from the reference "
        "cache (no mask measured), or each single-unit mask measured, taken from the budget "
        "(default %(default)s)",
    )


def add_context_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context",
        type=int,
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
        choices=("learned", "random", "uniform", "exhaustive", "ranking", "knapsack", "knapsack+tpe"),
        default="learned",
        help="knapsack+tpe: knapsack candidates for a third of the budget, then TPE (default %(default)s)",
    )
    parser.add_argument("--out", help="run directory (default results/<model>-<space>-<strategy>-s<seed>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out to its budget")
    parser.set_defaults(handler=run)


def run_config(args: argparse.Namespace, strategy: str) -> object:
    from skipsearch.cli.common import draft_vocab_from_args, measure_config
    from skipsearch.config import RunConfig

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
        context=args.context,
        extrapolate_context=args.extrapolate_context,
        importance=args.importance,
    )


def trial_progress(description: str, budget: int) -> tuple[object, object]:
    """A rich bar showing trials, best score so far and ETA; returns (context manager, callback)."""
    from skipsearch.progress import progress_bar

    bar_context = progress_bar(description, budget)

    def start() -> object:
        bar = bar_context.__enter__()

        def on_trial(scored: int, total: int, best: float | None) -> None:
            task = bar.task_ids[0]
            bar.update(task, completed=scored, total=total, status=f"best {best:.3f}" if best else "")

        return on_trial

    return bar_context, start


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from skipsearch.progress import console as status
    from skipsearch.run.pipeline import (
        check_run_dir,
        cost_note,
        open_context,
        resolve_cost,
        resolve_draft_vocab,
        resumed_config,
        save_run,
        search_one,
    )
    from skipsearch.run.report import write_run_outputs
    from skipsearch.search.space_files import load_space

    config = run_config(args, args.strategy)
    make_executor = executor_factory(args)  # checks the executor options before the model loads
    out = Path(args.out or f"results/{config.measure.model}-{config.space}-{config.strategy}-s{config.seed}")
    check_run_dir(out, args.resume)
    if args.resume:
        config = resumed_config(out, args.budget)
    load_space(config.space)  # a bad space file fails before the model loads
    config = resolve_draft_vocab(config)
    context = open_context(config)
    config = resolve_cost(config, context)
    status.print(cost_note(config, context))
    save_run(config, context, out)
    executor = make_executor(config.measure, config.temperature, context.measurement)
    bar_context, start = trial_progress(f"{config.strategy} search", config.budget)
    try:
        result = search_one(config, context, out, args.resume, on_trial=start(), executor=executor)
    finally:
        bar_context.__exit__(None, None, None)
        executor.close()
    summary = write_run_outputs(out)
    console = Console()
    console.print((out / "summary.md").read_text())
    console.print(
        f"{result.budget_used} masks scored, {result.model_evaluations} measured in this session; "
        f"files in {out}"
    )
    return 0 if summary else 1
