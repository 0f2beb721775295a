"""Profile in several fresh processes, one after another: a process's speed is partly a draw.

On the 2-core CPU we develop on, the same sub-layer at 5–9 positions runs at one of two speeds
that are fixed for the life of a process: SmolLM2's MLP at 6 positions takes about 1.1 ms in most
processes and 1.5 ms in roughly one in four (attention at 5–9 positions shifts with it). Pinning
threads (`OMP_PROC_BIND`) and transparent huge pages (`THP_MEM_ALLOC_ENABLE`) leave it as it is, so
it is most likely the memory layout the process happened to get. A profile measured in one process
is then right for that process only, and two runs of `skipsearch profile` disagreed by up to 40%.

Whatever later decodes with the chosen mask runs in a process of its own, so the cost model wants
the expected cost over processes: each of `processes` fresh interpreters takes `repeats /
processes` samples, and the profile keeps the mean of their medians
(`bench.latency_profiler.combine`). They run one at a time: two at once would share the cores and
time each other.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from skipsearch.bench.latency_profiler import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_HEAD_ROWS,
    DEFAULT_POSITIONS,
    DEFAULT_REPEATS,
    DEFAULT_WARMUP,
    ProcessTimings,
    check_axes,
    combine,
    measure_samples,
    process_meta,
)
from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.models.loading import LoadedModel, device_type
from skipsearch.models.random_weights import RandomWeights

DEFAULT_PROCESSES = 10


def _measure_in_this_process(
    model: str,
    device: str,
    dtype: str,
    random_weights: RandomWeights | None,
    contexts: tuple[int, ...],
    positions: tuple[int, ...],
    repeats: int,
    warmup: int,
    seed: int,
    label: str,
    head_rows: tuple[int, ...],
    announce: bool,
) -> tuple[ProcessTimings, dict[str, Any]]:
    """The body of one fresh process: load the model, take its samples, say what it ran on."""
    from skipsearch.models.loading import load_model
    from skipsearch.models.runner import LayerwiseRunner

    loaded = load_model(model, device, dtype, random_weights, announce=announce)
    runner = LayerwiseRunner(loaded.model)
    measured = measure_samples(runner, contexts, positions, repeats, warmup, seed, label, head_rows)
    return measured, {**process_meta(runner, loaded.model_id), **loaded_meta(loaded, random_weights)}


def loaded_meta(loaded: LoadedModel, random_weights: RandomWeights | None) -> dict[str, Any]:
    """What a profile records of the model beyond `process_meta`: its width and kernel plan, and
    for a weight-free model the real depth its depth-cut profile is scaled back to (`scale_to_depth`)."""
    config = loaded.model.config
    meta = {"hidden_size": config.hidden_size, **loaded.plan.to_record()}
    if random_weights is not None:
        meta |= {"random_weights": True, "real_num_layers": config.real_num_layers}
    return meta


def profile_processes(
    model: str,
    device: str = "cpu",
    dtype: str = "auto",
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    positions: Iterable[int] = DEFAULT_POSITIONS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    processes: int | None = None,
    seed: int = 0,
    head_rows: Iterable[int] = DEFAULT_HEAD_ROWS,
    random_weights: RandomWeights | None = None,
) -> LatencyProfile:
    """Measure `model`'s LatencyProfile over `processes` fresh interpreters, `repeats` samples in all.

    Each process gets its own seed (`seed + i`) and `warmup` discarded rounds; an error raised in
    one (a context longer than the model allows, a hub model offline) reaches the caller as it is.
    With `processes=1` the samples are taken in this process; None is `default_processes(device)`.
    A depth-cut weight-free model (`random_weights.num_layers`) is scaled back to its real depth.
    """
    from skipsearch.models.loading import resolve_model_dir, weight_dtypes

    contexts, steps = check_axes(context_lengths, positions)
    head_rows = tuple(head_rows)
    processes = default_processes(device) if processes is None else processes
    if processes < 1:
        raise ConfigError(f"processes must be >= 1, got {processes}")
    if repeats < processes:
        raise ConfigError(f"repeats ({repeats}) must be at least processes ({processes}): each takes a share")
    if processes > 1 and random_weights is None:  # a bad --model fails before any process starts,
        resolve_model_dir(model, weight_dtypes(device, dtype))  # and a GGUF is converted once, in its dtypes
    share = math.ceil(repeats / processes)
    measurements: list[ProcessTimings] = []
    meta: dict[str, Any] = {}
    for index in range(processes):
        label = f"profile: process {index + 1}/{processes}"
        settings = (contexts, steps, share, warmup, seed + index, label, head_rows, index == 0)
        measured, meta = _run(processes > 1, model, device, dtype, random_weights, *settings)
        measurements.append(measured)
    profile = combine(measurements, {**meta, "warmup": warmup}, contexts, steps)
    return scale_to_depth(profile, meta.get("real_num_layers", profile.num_layers))


def default_processes(device: str) -> int:
    """Several fresh processes on a CPU (its speed is a per-process draw), one on an accelerator.

    A GPU's kernels do not inherit the host process's memory layout, and each process would load
    the whole model again — ten loads of a 7B model take most of a GPU session.
    """
    return DEFAULT_PROCESSES if device_type(device) == "cpu" else 1


def _run(fresh: bool, *arguments: Any) -> tuple[ProcessTimings, dict[str, Any]]:
    """One measurement, in a new interpreter when `fresh` (a lone process may as well be this one)."""
    if not fresh:
        return _measure_in_this_process(*arguments)
    spawn = multiprocessing.get_context("spawn")  # a fork would inherit this process's memory layout
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(_measure_in_this_process, *arguments).result()
