"""`skipsearch plan`: the kernel plan a model runs on this device, with the timings behind each
choice (every other command prints only its one-line form)."""

from __future__ import annotations

import argparse

from skipsearch.cli.common import add_model_options, add_weight_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="show the kernel plan a model runs on this device, and the timings behind it"
    )
    add_model_options(parser)
    add_weight_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.cli.common import random_weights
    from skipsearch.models.device import check_device
    from skipsearch.models.kernels import describe_cpu
    from skipsearch.models.loading import load_model
    from skipsearch.store import check_cache_dir, kernels_dir

    check_cache_dir()
    check_device(args.device)
    loaded = load_model(args.model, args.device, args.dtype, random_weights(args), announce=False)
    device = describe_cpu() if args.device == "cpu" else args.device
    print(f"{loaded.model_id} on {device}:")
    print(loaded.plan.table())
    print(loaded.plan.line)
    if args.device == "cpu":
        print(
            f"Each measured choice is kept once per machine in {kernels_dir()} and "
            "measured again when a kernel's build changes; delete that folder to measure them all again "
            "(docs/cpu-backend.md)."
        )
    return 0
