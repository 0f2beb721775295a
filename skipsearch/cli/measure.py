"""`skipsearch measure`: acceptance profile and predicted speedup of one skip mask."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.cli.common import (
    add_draft_vocab_option,
    add_kv_options,
    add_mask_options,
    add_model_options,
    add_prompt_options,
    add_weight_options,
    random_weights,
)
from skipsearch.cli.executor_options import add_executor_options, executor_factory
from skipsearch.cli.run import add_context_options
from skipsearch.options import option_type
from skipsearch.store import check_cache_dir, check_output_file, write_text_atomic

if TYPE_CHECKING:  # imported when the command runs (`latency_profile`), not when the parser is built
    from skipsearch.cost.latency import LatencyProfile

GAMMAS = range(1, 9)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="acceptance of one skip mask on real prompts",
        description="Teacher-forced acceptance of one mask, tokens per round (gamma 1..8) and speedup.",
    )
    add_model_options(parser)
    add_weight_options(parser)
    add_prompt_options(parser)
    add_mask_options(parser)
    add_executor_options(parser)
    parser.add_argument(
        "--temperature",
        type=option_type("temperature"),
        default=1.0,
        help="for sampling acceptance (default 1.0)",
    )
    add_draft_vocab_option(parser, "the draft proposes from a draft vocabulary")
    add_kv_options(parser)
    parser.add_argument(
        "--latency-profile", help="profile.json for the calibrated speedup (default: cached one)"
    )
    add_context_options(parser)
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.cli.common import (
        check_mask_args,
        draft_vocab_from_args,
        kv_pattern_from_args,
        mask_from_args,
        measure_config,
    )
    from skipsearch.models.device import check_device
    from skipsearch.models.random_weights import refuse_acceptance
    from skipsearch.run.preflight import known_depth

    refuse_acceptance(random_weights(args), "measure")
    config = measure_config(args)
    if args.json:
        check_output_file(args.json, "--json")
    check_cache_dir()
    make_executor = executor_factory(args, workers=1)  # checks the executor options before the model loads
    check_mask_args(args, known_depth(args.model))
    check_device(args.device)  # the first check that imports torch

    from skipsearch.acceptance.worker import prepare
    from skipsearch.cost.calibrated import predict
    from skipsearch.cost.closed_forms import head_share_from_config
    from skipsearch.masks import kv_label, vocab_label
    from skipsearch.search.objective import DEFAULT_CONTEXT, model_kv_share

    latency_path, latency = latency_profile(args)
    context = DEFAULT_CONTEXT if args.context is None else args.context
    measurement = prepare(config, check=lambda num_layers: mask_from_args(args, num_layers))
    mask = mask_from_args(args, measurement.num_layers)

    draft_vocab, kv = draft_vocab_from_args(args), kv_pattern_from_args(args)
    full_seconds = measurement.estimator.time_full_forward()  # before a Ray executor frees the model
    with make_executor(config, args.temperature, measurement) as executor:
        measured, eval_seconds = executor.measure_one(mask)
    profile = measured.for_vocab(draft_vocab, kv)
    model_config = measurement.runner.config
    prediction = predict(
        profile,
        mask,
        gamma_max=max(GAMMAS),
        latency=latency,
        context=context,
        draft_vocab=draft_vocab,
        vocab_size=int(model_config.vocab_size),
        head_share=None if latency else head_share_from_config(model_config.to_dict()),
        kv=kv,
        kv_share=None if latency else model_kv_share(measurement.runner.model, context),
    )
    result = {
        "model": args.model,
        "mask": str(mask),
        "draft_vocab": vocab_label(draft_vocab),
        "kv": kv_label(kv),
        "mode": config.mode,
        "r_draft": mask.r_draft(),
        "r_reuse": 0.0 if kv is not None else mask.r_reuse,
        "alpha": profile.alpha,
        "sampling_acceptance": profile.sampling_acceptance,
        "temperature": args.temperature,
        "tokens_per_round": {g: profile.tokens_per_round(g) for g in GAMMAS},
        "alpha_by_depth": profile.alpha_by_depth(max(GAMMAS)),
        "predicted": prediction.to_dict(),
        "latency_profile": str(latency_path) if latency else None,
        "context": context,
        "eval_seconds": eval_seconds,
        "full_forward_seconds": full_seconds,
        "n_positions": profile.n_positions,
    }
    print_result(result, prediction)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(result, indent=2))
    return 0


def latency_profile(args: argparse.Namespace) -> tuple[Path, LatencyProfile | None]:
    """Where the latency profile is (`--latency-profile`, else this device's cached one) and the
    profile checked for `--context`, or None where none was measured (the closed form then)."""
    from skipsearch.cli.common import kv_pattern_from_args
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.models.loading import dtype_name
    from skipsearch.search.objective import scoring_latency
    from skipsearch.store import readable_profile_path

    path = (
        Path(args.latency_profile)
        if args.latency_profile
        else readable_profile_path(args.model, args.device, dtype_name(args.device, args.dtype))
    )
    latency = LatencyProfile.load(path) if args.latency_profile or path.is_file() else None
    cost = "calibrated" if latency is not None else "closed-form"
    patterned = kv_pattern_from_args(args) is not None
    return path, scoring_latency(cost, latency, args.context, args.extrapolate_context, patterned)


def print_result(result: dict, prediction: object) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{result['model']}[/]  mask [cyan]{result['mask']}[/]  draft vocabulary "
        f"{result['draft_vocab']}  KV {result['kv']}  ({result['mode']} estimator, "
        f"{result['n_positions']} positions)"
    )
    console.print(
        f"r_draft {result['r_draft']:.3f}   r_reuse {result['r_reuse']:.3f}   alpha (greedy) "
        f"{result['alpha']:.3f}   sampling acceptance (T={result['temperature']:g}) "
        f"{result['sampling_acceptance']:.3f}"
    )
    table = Table()
    table.add_column("gamma", justify="right")
    table.add_column("tokens/round", justify="right")
    table.add_column("speedup closed-form", justify="right")
    if prediction.calibrated is not None:
        table.add_column("speedup calibrated", justify="right")
    for i, gamma in enumerate(GAMMAS):
        row = [str(gamma), f"{result['tokens_per_round'][gamma]:.2f}", f"{prediction.closed_form[i]:.2f}"]
        if prediction.calibrated is not None:
            row.append(f"{prediction.calibrated[i]:.2f}")
        table.add_row(*row)
    console.print(table)
    best = prediction.best_closed_form
    console.print(f"best gamma (closed form): {best.gamma} -> {best.speedup:.2f}x")
    if prediction.calibrated is None:
        console.print(
            "no latency profile for this model and device: run `skipsearch profile` for calibrated speedups"
        )
    else:
        calibrated = prediction.best_calibrated
        console.print(
            f"best gamma (calibrated, at a context of {result['context']} tokens): {calibrated.gamma} -> "
            f"{calibrated.speedup:.2f}x"
        )
    console.print(
        f"evaluation {result['eval_seconds']:.2f} s   vs one full forward over the same batch "
        f"{result['full_forward_seconds']:.2f} s"
    )
