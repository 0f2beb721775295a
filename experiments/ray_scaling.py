"""Ray on the embedded model (SmolLM2-135M): what the executor costs and what extra workers buy.

The same study (random strategy, fixed seed, so every setting evaluates the same masks) runs with
the local executor (torch on every core, and on one thread) and with Ray actors: 1 worker x 1 CPU,
1 worker x 2 CPUs and 2 workers x 1 CPU (Ray gives an actor as many torch threads as CPUs). For
each: start-up (Ray and the actors loading the model), search wall time, trials per minute, the
mean in-worker evaluation time, and the per-mask time the search spends outside evaluations
(Optuna, scoring, dispatch): Ray's overhead is its excess over the local run with the same threads.

Load and threads move those numbers on a shared machine, so the dispatch cost is also measured
alone: a round trip per mask through each executor with an evaluator that returns a real-sized
profile at once.

Writes `results/ray/scaling.csv` and `results/ray/scaling.md`.
Run: `.venv/bin/python -m experiments.ray_scaling` (about four minutes on two cores).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.config import RunConfig
from skipsearch.executors.base import Evaluator, Executor, LocalExecutor, local_executor
from skipsearch.executors.ray import RayExecutor, measurement_executor
from skipsearch.executors.ray_cluster import RayOptions
from skipsearch.masks import SkipMask
from skipsearch.run.pipeline import open_context
from skipsearch.run.search_step import RunContext, search_one
from skipsearch.search import load_study, study_trials_frame

OUT = Path(__file__).resolve().parents[1] / "results" / "ray"


@dataclass(frozen=True)
class Setting:
    """Ray options, or None for the local executor with `threads` torch threads in the driver."""

    name: str
    ray: RayOptions | None = None
    threads: int = 1

    @property
    def workers(self) -> int:
        return (self.ray.workers or 1) if self.ray else 1

    @property
    def cpus_per_worker(self) -> int:
        return self.ray.cpus_per_worker if self.ray else self.threads


SETTINGS = (
    Setting("local", threads=torch.get_num_threads()),
    Setting("local 1 thread", threads=1),
    Setting("ray 1x1", RayOptions(workers=1, cpus_per_worker=1)),
    Setting("ray 1x2", RayOptions(workers=1, cpus_per_worker=2)),
    Setting("ray 2x1", RayOptions(workers=2, cpus_per_worker=1)),
)

log = logging.getLogger("ray_scaling")


@dataclass(frozen=True)
class Row:
    setting: str
    workers: int
    cpus_per_worker: int
    trials: int
    startup_s: float
    search_s: float
    trials_per_min: float
    speedup_vs_local: float
    mean_eval_s: float
    outside_eval_per_mask_s: float
    same_masks_as_local: bool
    max_score_diff_vs_local: float


@dataclass(frozen=True)
class Echo:
    """Worker spec whose evaluator returns `profile` at once: what is left is dispatch and transfer."""

    profile: AcceptanceProfile

    def __call__(self) -> Evaluator:
        return lambda mask: self.profile


def round_trip_ms(executor: Executor, masks: list[SkipMask]) -> float:
    """Mean milliseconds from submit to outcome, one mask at a time."""
    began = time.perf_counter()
    for mask in masks:
        executor.measure_one(mask)
    return 1e3 * (time.perf_counter() - began) / len(masks)


def dispatch_cost(config: RunConfig, context: RunContext, n: int = 50) -> tuple[float, float]:
    """(local, Ray) round trip per mask in ms, with the profile of a real evaluation."""
    num_layers = context.measurement.num_layers
    masks = [SkipMask.from_layers(num_layers, [1 + i % (num_layers - 2)]) for i in range(n)]
    echo = Echo(context.measurement.estimator.evaluate(masks[0], config.temperature))
    with LocalExecutor(echo()) as local:
        local_ms = round_trip_ms(local, masks)
    with RayExecutor(echo, RayOptions(workers=1)) as ray_executor:
        round_trip_ms(ray_executor, masks[:5])  # warm up the actor's first calls
        return local_ms, round_trip_ms(ray_executor, masks)


def make_executor(setting: Setting, config: RunConfig, context: RunContext) -> Executor:
    measurement = context.measurement
    if setting.ray is None:
        return local_executor(config.measure, config.temperature, measurement)
    return measurement_executor(config.measure, config.temperature, measurement.reference_path, setting.ray)


def run_setting(setting: Setting, config: RunConfig, context: RunContext, out: Path) -> dict:
    """One study; returns timings and the trials table (mask -> score, eval seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(setting.threads)
    began = time.perf_counter()
    executor = make_executor(setting, config, context)
    started = time.perf_counter()
    try:
        search_one(config, context, out, resume=False, executor=executor)
    finally:
        searched = time.perf_counter()
        executor.close()
        torch.set_num_threads(threads)
    frame = study_trials_frame(load_study(out, config.strategy))
    frame = frame[~frame["repeat"]].set_index("mask")
    return {"startup": started - began, "search": searched - started, "trials": frame}


def measure(config: RunConfig) -> tuple[list[Row], tuple[float, float]]:
    context = open_context(config)  # the driver builds the ReferenceCache before any worker starts
    dispatch = dispatch_cost(config, context)
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for setting in SETTINGS:
            log.info("%s: %d masks", setting.name, config.budget)
            out = Path(scratch) / setting.name.replace(" ", "-")
            runs[setting.name] = run_setting(setting, config, context, out)
    local = runs["local"]
    rows = []
    for setting in SETTINGS:
        run, trials = runs[setting.name], runs[setting.name]["trials"]
        outside = (run["search"] * setting.workers - trials["eval_seconds"].sum()) / len(trials)
        same = set(trials.index) == set(local["trials"].index)
        diff = (trials["score"] - local["trials"]["score"]).abs().max() if same else float("nan")
        rows.append(
            Row(
                setting=setting.name,
                workers=setting.workers,
                cpus_per_worker=setting.cpus_per_worker,
                trials=len(trials),
                startup_s=run["startup"],
                search_s=run["search"],
                trials_per_min=60 * len(trials) / run["search"],
                speedup_vs_local=local["search"] / run["search"],
                mean_eval_s=float(trials["eval_seconds"].mean()),
                outside_eval_per_mask_s=outside,
                same_masks_as_local=same,
                max_score_diff_vs_local=float(diff),
            )
        )
    return rows, dispatch


def reading(rows: list[Row], dispatch: tuple[float, float]) -> str:
    """The table in one sentence, from this run's numbers."""
    by = {row.setting: row for row in rows}
    local, single, one, two = by["local"], by["local 1 thread"], by["ray 1x1"], by["ray 2x1"]
    startups = [row.startup_s for row in rows if row.setting.startswith("ray")]
    contended = (
        ": threads contended for cores other jobs held" if local.mean_eval_s > single.mean_eval_s else ""
    )
    return (
        f"Reading: Ray's dispatch is {dispatch[1] / 1e3 / one.mean_eval_s:.2%} of one evaluation here; "
        f"1 Ray worker x 1 CPU runs {one.trials_per_min:.0f} trials/min against {single.trials_per_min:.0f} "
        f"for the local executor on one thread, and 2 workers x 1 CPU run "
        f"{two.trials_per_min / one.trials_per_min:.2f}x the trials/min of one. One evaluation on "
        f"{local.cpus_per_worker} torch threads took {local.mean_eval_s / single.mean_eval_s:.2f}x as long "
        f"as on one{contended}. Each Ray run first spends {min(startups):.0f}-{max(startups):.0f} s starting "
        "Ray and loading the model in its actors."
    )


def write(
    rows: list[Row], dispatch: tuple[float, float], config: RunConfig, load: tuple[float, float]
) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "scaling.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)
    prompts = config.measure.prompts
    lines = [
        "# Ray executor on the embedded model: overhead and scaling",
        "",
        f"SmolLM2-135M on CPU, `{config.space}` space, `{config.strategy}` strategy, seed {config.seed}, "
        f"budget {config.budget}; {prompts.n_prompts} prompts, <= {prompts.max_prompt_tokens} prompt + "
        f"{prompts.new_tokens} new tokens, `{config.measure.mode}` estimator. "
        f"Produced by `experiments/ray_scaling.py`.",
        "",
        "| setting | workers x CPUs | start-up s | search s | trials/min | vs local | mean eval s "
        "| outside eval s/mask | same masks | max score diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.setting} | {r.workers} x {r.cpus_per_worker} | {r.startup_s:.1f} | {r.search_s:.1f} "
            f"| {r.trials_per_min:.1f} | {r.speedup_vs_local:.2f}x | {r.mean_eval_s:.2f} "
            f"| {r.outside_eval_per_mask_s:.3f} | {'yes' if r.same_masks_as_local else 'no'} "
            f"| {r.max_score_diff_vs_local:.1e} |"
        )
    lines += [
        "",
        "Dispatch alone (an evaluator that returns a real-sized profile at once, one mask "
        f"at a time): **{dispatch[1]:.2f} ms per mask on a Ray actor**, {dispatch[0]:.3f} ms in process.",
        "",
        reading(rows, dispatch),
        "",
        "- *start-up*: Ray start plus every actor loading the model and the driver's ReferenceCache "
        "(local: nothing to start). *search*: the study from its first ask to its last tell. "
        "*outside eval*: `(search s x workers - sum of in-worker evaluation s) / masks`, the time a "
        "worker slot is not evaluating: Optuna ask/tell and scoring in the driver, plus Ray's "
        "dispatch and transfer for the Ray rows; its excess over local is Ray's per-mask overhead.",
        f"- This machine has **{os.cpu_count()} CPU cores**, so 2 workers x 1 CPU use the same cores "
        "as 1 worker x 2 CPUs or the local executor with every thread: 2 workers cannot be 2x faster "
        "than that. Compare Ray 1x1 with local 1 thread for the executor's overhead, and 2x1 with "
        "1x2 for what a second worker buys over a second thread on the same cores; with one GPU (or "
        "a block of cores) per worker, trials/min grows with the workers.",
        f"- Other jobs shared the machine: load average {load[0]:.1f} before and {load[1]:.1f} after "
        f"the runs, so timings are indicative; rerun on an idle machine for clean numbers.",
        "- *same masks*: every setting evaluated exactly the masks the local run did; *max score diff* "
        "is the largest difference of a mask's score to the local run (threads differ, so float "
        "summation order may too).",
    ]
    (OUT / "scaling.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prompts = PromptSpec(
        n_prompts=args.n_prompts, max_prompt_tokens=args.max_prompt_tokens, new_tokens=args.new_tokens
    )
    config = RunConfig(
        measure=MeasureConfig(prompts=prompts), space="sparse", strategy="random", budget=args.budget
    )
    before = os.getloadavg()[0]
    rows, dispatch = measure(config)
    write(rows, dispatch, config, (before, os.getloadavg()[0]))
    log.info("wrote %s", OUT)


if __name__ == "__main__":
    main()
