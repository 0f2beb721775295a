"""Options shared by the commands that evaluate masks: in this process, or on Ray workers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, ExecutorFactory, local_executor
from skipsearch.executors.ray import measurement_executor
from skipsearch.executors.ray_cluster import RayOptions, check_ray_address
from skipsearch.options import option_type

if TYPE_CHECKING:
    from skipsearch.acceptance.worker import Measurement


def add_executor_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where masks are evaluated (docs/ray.md)")
    group.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: in this process; ray: on Ray actors (default %(default)s)",
    )
    group.add_argument(
        "--workers",
        type=option_type("workers"),
        help="ray: actors to run (default: one per GPU with --device cuda, else 1)",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="ray: cluster to join: auto, HOST:PORT or ray://HOST:PORT (default RAY_ADDRESS, else local)",
    )
    group.add_argument(
        "--cpus-per-worker",
        type=option_type("cpus_per_worker"),
        default=1,
        help="ray: CPUs per actor (default 1)",
    )
    group.add_argument(
        "--gpus-per-worker",
        type=option_type("gpus_per_worker"),
        default=1.0,
        help="ray with --device cuda: share of a GPU per actor, e.g. 0.5 for two per GPU (default 1)",
    )


def ray_options(args: argparse.Namespace, workers: int | None = None) -> RayOptions | None:
    """None for the local executor; options that only Ray reads are an error without it."""
    if args.executor == "local":
        given = [name for name in ("workers", "ray_address") if getattr(args, name) is not None]
        given += [name for name in ("cpus_per_worker", "gpus_per_worker") if getattr(args, name) != 1]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ConfigError(f"{flags} only apply to --executor ray: add it, or drop them")
        return None
    return RayOptions(
        address=args.ray_address,
        workers=workers or args.workers,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_worker=args.gpus_per_worker,
    )


def executor_factory(args: argparse.Namespace, workers: int | None = None) -> ExecutorFactory:
    """What `--executor` asked for; `workers` overrides `--workers` (measure needs only one).
    The Ray factory says on the console what it chose, since it depends on the cluster."""
    options = ray_options(args, workers)
    if options is None:
        return local_executor
    check_ray_address(options.address)

    def ray_executor(measure: MeasureConfig, temperature: float, measurement: Measurement) -> Executor:
        from skipsearch.progress import console

        ranking = measurement.ranking if measure.draft_vocabs else None
        executor = measurement_executor(measure, temperature, measurement.reference_path, options, ranking)
        console.print(f"Ray: {executor.plan.describe()}")
        if executor.plan.gpus_per_worker:  # the workers hold the model now; the driver's copy would double it
            measurement.release_model()
        return executor

    return ray_executor
