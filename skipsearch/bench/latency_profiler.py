"""Measure a `LatencyProfile` on the current device: what one SSD round really costs
(docs/theory.md, "Calibrated cost").

The closed forms price a contiguous draft `[0, E)` at `c = E / L` of a full step. docs/theory.md,
"Calibrated cost", warns that this underestimates `c`: the embedding, the final norm and the LM head
run on every draft step whatever the exit layer, and small passes do not shrink in proportion to
their work. So we time every part of a real forward pass separately — embedding, each layer's
attention and MLP sub-layer, norm + head — for `k` new positions (1 for a draft step, γ+1 for
verify) against a KV cache pre-filled to each context length, plus the per-round work outside the
forward passes and the head of a draft vocabulary: norm + `k` gathered rows of the LM head, for
several `k` (docs/theory.md, "The draft vocabulary").

A draft may read its weights at int8 or int4 (docs/theory.md, "Drafts at lower precision"), so
the same passes are timed with every layer at each lower precision, on the path a draft runs them
(the fused lower-precision layers where the plan fuses, `LayerwiseRunner.fused_at`): each sub-layer's
cost at that precision, for a draft that mixes precisions and skips, and the whole one-position
step, which `LatencyProfile.precision_floor` holds against the bytes it reads. Drafts run one
position (a chain) or a token tree's few rows, so these passes are timed at `PRECISION_POSITIONS`
only (the cost of a verify's many rows is the full model's): about a third more passes.

Noise control, since two runs must agree: every sample is one whole forward in execution order, so
each sub-layer's weights are as cold in the CPU caches as in real decoding; the (context, positions)
passes are shuffled within each repeat, so a slow spell of the machine spreads over all entries
instead of biasing one; the garbage collector is paused; each entry keeps the median and the IQR.
A process's speed is itself partly a draw, so `skipsearch profile` spreads the samples over several
fresh processes (`profile_processes`) and keeps the mean of their medians (`combine`). No
statistic rescues a CPU that other processes keep busy — every parallel kernel then stalls — so
such a run is flagged by its spread instead.

The parts are timed in `passes`, with the clocks of `clock`; this module measures one process
(`measure_samples`) and combines processes into a profile (`combine`). Imports torch only inside
the measuring functions.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skipsearch.bench.clock import Sync, clock_for, gc_paused, timed
from skipsearch.bench.passes import (
    Samples,
    prefill_cache,
    time_draft_heads,
    time_passes,
    time_pillar_choice,
    time_round_overhead,
)
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.latency_schema import PrecisionCosts
from skipsearch.errors import ConfigError
from skipsearch.masks import LOW_BITS, KVPattern, SkipMask
from skipsearch.store import atomic_path

if TYPE_CHECKING:
    import torch

    from skipsearch.models.runner import LayerwiseRunner

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTHS = (128, 512, 2048)
# A pass over 1-9 positions is a draft step or a chain's verify up to γ = 8; 12-32 a token tree's
# draft passes and verify, up to `tree_shapes.MAX_NODES` + 1 rows.
DEFAULT_POSITIONS = (*range(1, 10), 12, 16, 24, 32)
OVERHEAD_GAMMAS = range(1, 9)  # the round overhead is a chain's bookkeeping: timed up to γ = 8
DEFAULT_REPEATS = 40  # over DEFAULT_PROCESSES processes: docs/cpu-backend.md, "Where a step's time goes"
DEFAULT_WARMUP = 2
# Draft-head sizes timed (those below the vocabulary, plus the full one): the draft vocabularies
# a search space offers, from 1k to 32k ids.
DEFAULT_HEAD_ROWS = (1024, 2048, 4096, 8192, 16384, 32768)
# The pillar pattern whose per-round choice is timed: the search spaces' pillar count (the choice's
# cost follows the keys and layers; the pillars are a handful of rows gathered).
PILLAR_PATTERN = KVPattern.parse("s4w256k64")
# The rows a draft pass at lower precision is timed over: a chain's step (1) and a token tree's
# widest draft passes (8); between them the cost is interpolated, as the full tables are.
PRECISION_POSITIONS = (1, 8)
NOISY = 1.0  # typical IQR / median of a sub-layer above which the device was busy
COPY_BYTES = 1 << 28  # 256 MiB: far beyond any CPU cache, so a copy streams from memory
COPY_REPEATS = 7


# -- where profiles live -------------------------------------------------------------------------


def save_profile(profile: LatencyProfile, path: str | Path) -> Path:
    """Write atomically: an interrupted run must not leave half a profile that `measure` would read."""
    with atomic_path(path) as staging:
        profile.save(staging)
    return Path(path)


# -- measuring -----------------------------------------------------------------------------------


def median(samples: np.ndarray) -> np.ndarray:
    """Each entry's median over its repeats (the last axis)."""
    return np.median(samples, axis=-1)


def iqr(samples: np.ndarray) -> np.ndarray:
    """Each entry's interquartile range over its repeats (the last axis): the profile's spread."""
    upper, lower = np.percentile(samples, [75, 25], axis=-1)
    return upper - lower


def _warn_if_noisy(samples: Samples) -> None:
    """Flag a profile taken on a busy device: its medians measure the neighbours, not the model.

    On an idle CPU a sub-layer's IQR is about a quarter of its median; when other processes share
    the cores every parallel kernel stalls and the IQR exceeds the median itself.
    """
    noise = float(np.median(iqr(samples.attn) / median(samples.attn)))
    if noise > NOISY:
        log.warning(
            "timings are noisy (typical IQR is %.1fx the median): other work is probably running on "
            "this device; stop it and re-run for a profile that repeats",
            noise,
        )


def head_row_counts(vocab_size: int, rows: Iterable[int] = DEFAULT_HEAD_ROWS) -> tuple[int, ...]:
    """The draft-head sizes to time: those of `rows` below the vocabulary size, and the vocabulary."""
    return tuple(sorted({k for k in _axis("head rows", rows) if k < vocab_size} | {vocab_size}))


def _axis(name: str, values: Iterable[int]) -> tuple[int, ...]:
    """Sorted, de-duplicated integers >= 1, or a ConfigError naming the bad value."""
    values = list(values)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1]
    if bad or not values:
        raise ConfigError(f"{name} must be a non-empty list of integers >= 1, got {values}")
    return tuple(sorted({int(v) for v in values}))


def check_settings(
    runner: LayerwiseRunner, contexts: tuple[int, ...], positions: tuple[int, ...], repeats: int, warmup: int
) -> None:
    if positions[-1] < 2:
        raise ConfigError(f"positions must reach at least 2 (verify of γ = 1 runs 2), got {list(positions)}")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    longest = getattr(runner.config, "max_position_embeddings", None)
    if longest is not None and contexts[-1] + positions[-1] > longest:
        raise ConfigError(
            f"context length {contexts[-1]} + {positions[-1]} positions exceeds the model's "
            f"{longest} positions: use shorter context lengths"
        )


def process_meta(runner: LayerwiseRunner, model: str) -> dict[str, Any]:
    """What the timings depend on, as seen from the measuring process."""
    import torch
    import transformers

    from skipsearch.models.kernels import plan_kernels, step_bytes

    device = runner.device
    weight_bytes, kv_bytes = step_bytes(runner.model)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    return {
        "device": str(device),
        "device_name": name,
        "dtype": str(runner.model.lm_head.weight.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": model,
        "num_layers": runner.num_layers,
        "vocab_size": int(runner.model.lm_head.weight.shape[0]),
        "threads": torch.get_num_threads(),
        **plan_kernels(runner.model),
        "weight_bytes": weight_bytes,
        "kv_bytes_per_position": kv_bytes,
    }


@dataclass(frozen=True)
class PrecisionTimings:
    """The passes one process timed with every layer at one lower precision, over
    `positions` (`PRECISION_POSITIONS` up to the profile's longest pass), and the bytes of weights
    a one-position step reads at it."""

    samples: Samples
    positions: tuple[int, ...]
    weight_bytes: float


@dataclass(frozen=True)
class ProcessTimings:
    """Every sample one process took: the forward-pass tables, the round overhead per γ, the
    draft head with `head_rows[i]` rows in `draft_head[i]`, the pillar choice at each context, the
    copy bandwidth (bytes/s), and the passes at each lower precision it timed (`precisions`)."""

    samples: Samples
    overhead: dict[int, np.ndarray]
    head_rows: tuple[int, ...]
    draft_head: np.ndarray
    pillar_choice: np.ndarray
    copy_bandwidth: float
    precisions: dict[int, PrecisionTimings] = field(default_factory=dict)


def copy_bandwidth(device: torch.device, sync: Sync) -> float:
    """Bytes per second this device moves in a large tensor copy (read plus write, as STREAM's
    copy counts them), the best of `COPY_REPEATS`: the bandwidth a memory-bound step can reach."""
    import torch

    source = torch.ones(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # touch every page first
    best = min(timed(sync, target.copy_, source)[1] for _ in range(COPY_REPEATS))
    return 2 * COPY_BYTES / best


def precision_weight_bytes(runner: LayerwiseRunner, mask: SkipMask) -> float:
    """Bytes of weights one step of `mask`'s draft reads: the model's own step (`step_bytes`), its
    layers' projections replaced by the copies the draft reads at lower precision (`DraftWeights.nbytes`);
    a projection the plan packs is read in its packed copy, as `step_bytes` counts it."""
    from skipsearch.models.draft_weights import PROJECTIONS
    from skipsearch.models.kernels import step_bytes

    full, _ = step_bytes(runner.model)
    replaced = 0
    for layer, kind, _ in runner.draft_weights.used(mask):
        owner, names = PROJECTIONS[kind]
        for name in names:
            linear = getattr(getattr(runner.layers[layer], owner), name)
            weight = getattr(linear, "packed", None)
            weight = linear.weight if weight is None else weight
            replaced += weight.numel() * weight.element_size()
    return float(full - replaced + runner.draft_weights.nbytes(mask))


def time_precisions(
    runner: LayerwiseRunner,
    caches: Sequence[Any],
    steps: tuple[int, ...],
    precisions: Iterable[int],
    settings: tuple[int, int, Sync, torch.Generator],
    label: str,
) -> dict[int, PrecisionTimings]:
    """The passes with every layer at each of `precisions` (`settings`: repeats, warm-up rounds, the
    clock and the generator, as the full passes'); a precision whose copies cannot be made (a
    matrix no int4 group divides, copies that do not fit in memory) is left untimed, and said."""
    repeats, warmup, sync, generator = settings
    positions = tuple(k for k in PRECISION_POSITIONS if k <= steps[-1])
    timed_at: dict[int, PrecisionTimings] = {}
    for bits in precisions:
        try:
            mask = runner.prepare_every_layer(bits)
        except ConfigError as error:
            log.warning("int%d drafts not timed (priced by their bytes): %s", bits, error)
            continue
        samples = time_passes(
            runner, caches, positions, repeats, warmup, sync, generator, f"{label} at int{bits}", bits
        )
        timed_at[bits] = PrecisionTimings(samples, positions, precision_weight_bytes(runner, mask))
    return timed_at


def check_axes(
    context_lengths: Iterable[int], positions: Iterable[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The context lengths and position counts, sorted and validated, before any model is touched."""
    return _axis("context lengths", context_lengths), _axis("positions", positions)


def measure_samples(
    runner: LayerwiseRunner,
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    positions: Iterable[int] = DEFAULT_POSITIONS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    seed: int = 0,
    label: str = "profile: timing forward passes",
    head_rows: Iterable[int] = DEFAULT_HEAD_ROWS,
    precisions: Iterable[int] = LOW_BITS,
) -> ProcessTimings:
    """Time every part of a forward pass on `runner`'s device, the per-round overhead and draft heads.

    For each context length and each number of new positions `k`: embedding (+ rotary and mask),
    each attention and MLP sub-layer, and norm + head, `repeats` samples after `warmup` discarded
    rounds. Round overhead is sampled for every γ of `OVERHEAD_GAMMAS` with `γ + 1 <=
    max(positions)`; the draft head for each of `head_rows` below the vocabulary size and for the
    full vocabulary; a round's pillar choice and gather (`PILLAR_PATTERN`) at each context length;
    the passes with every layer at each of `precisions` (`time_precisions`).
    """
    import torch

    contexts, steps = check_axes(context_lengths, positions)
    check_settings(runner, contexts, steps, repeats, warmup)
    rows = head_row_counts(int(runner.model.lm_head.weight.shape[0]), head_rows)
    sync = clock_for(runner.device)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    with gc_paused():
        caches = [prefill_cache(runner, context, generator) for context in contexts]
        samples = time_passes(runner, caches, steps, repeats, warmup, sync, generator, label)
        gammas = [gamma for gamma in OVERHEAD_GAMMAS if gamma + 1 <= steps[-1]]
        overhead = time_round_overhead(runner, caches[0], gammas, repeats, warmup, sync, generator)
        draft_head = time_draft_heads(runner, caches[0], rows, repeats, warmup, sync, generator)
        pillars = time_pillar_choice(runner, caches, PILLAR_PATTERN, repeats, warmup, sync, generator)
        settings = (repeats, warmup, sync, generator)
        low = time_precisions(runner, caches, steps, precisions, settings, label)
    del caches
    bandwidth = copy_bandwidth(runner.device, sync)
    log.info("timed %d layers in %.1f s", runner.num_layers, time.perf_counter() - started)
    return ProcessTimings(samples, overhead, rows, draft_head, pillars, bandwidth, low)


def _pooled(measurements: Sequence[ProcessTimings]) -> Samples:
    """All processes' samples of each entry side by side, along the repeat axis."""
    return Samples(
        **{
            name: np.concatenate([getattr(m.samples, name) for m in measurements], axis=-1)
            for name in LatencyProfile.TABLES
        }
    )


def _step_medians(samples: Samples) -> np.ndarray:
    """Median seconds of a whole one-position pass (every part of each sample summed) per context:
    the step, timed as the forward it is."""
    layers = samples.attn[:, :, 0].sum(axis=0) + samples.mlp[:, :, 0].sum(axis=0)
    return np.median(samples.embed[:, 0] + layers + samples.head[:, 0], axis=-1)


def _precision_costs(measurements: Sequence[ProcessTimings], bits: int) -> dict[str, Any]:
    """The `PrecisionCosts` of `bits` (in its JSON form) from every process that timed it: the mean
    of the processes' medians, as the full tables."""
    timed = [m.precisions[bits] for m in measurements]
    return PrecisionCosts(
        attn=np.mean([median(t.samples.attn) for t in timed], axis=0).tolist(),
        mlp=np.mean([median(t.samples.mlp) for t in timed], axis=0).tolist(),
        step=tuple(np.mean([_step_medians(t.samples) for t in timed], axis=0).tolist()),
        weight_bytes=timed[0].weight_bytes,
        positions=timed[0].positions,
    ).to_dict()


def _pass_median(samples: Samples) -> float:
    """Median seconds of a whole pass (every part summed) at the first context and the last positions."""
    parts = [samples.embed, samples.head, *samples.attn, *samples.mlp]
    return float(np.median(sum(part[0, -1] for part in parts)))


def combine(
    measurements: Sequence[ProcessTimings],
    meta: dict[str, Any],
    context_lengths: Sequence[int],
    positions: Sequence[int],
) -> LatencyProfile:
    """One profile from the measurements of one or more processes.

    Each entry is the mean over processes of that process's median: robust to the odd stalled
    sample within a process, and the expected cost over processes when their speeds differ (see
    `profile_processes`). The spread is the IQR of all samples together.
    """
    pooled = _pooled(measurements)
    _warn_if_noisy(pooled)
    tables = {
        name: np.mean([median(getattr(m.samples, name)) for m in measurements], axis=0).tolist()
        for name in LatencyProfile.TABLES
    }
    overhead = {
        gamma: float(np.mean([np.median(m.overhead[gamma]) for m in measurements]))
        for gamma in measurements[0].overhead
    }
    head_by_rows = np.mean([median(m.draft_head) for m in measurements], axis=0)
    pillar_choice = np.mean([median(m.pillar_choice) for m in measurements], axis=0)
    meta = {
        **meta,
        "repeats": pooled.embed.shape[-1],
        "processes": len(measurements),
        # Each process's full pass at the shortest context and the most positions: its speed draw.
        "process_pass_ms": [round(1e3 * _pass_median(m.samples), 3) for m in measurements],
        "load_average": os.getloadavg()[0],  # ~threads when idle: more means the device was shared
        "copy_bandwidth": float(np.mean([m.copy_bandwidth for m in measurements])),
        "pillar_pattern": str(PILLAR_PATTERN),
    }
    # Built from its JSON form, so the profile in memory equals the one `LatencyProfile.load` reads.
    return LatencyProfile.from_dict(
        {
            "meta": meta,
            "context_lengths": tuple(context_lengths),
            "positions": tuple(positions),
            **tables,
            "spread": pooled.reduce(iqr),
            "round_overhead": overhead,
            "head_rows": measurements[0].head_rows,
            "head_by_rows": head_by_rows.tolist(),
            "pillar_choice": pillar_choice.tolist(),
            "precisions": {
                str(bits): _precision_costs(measurements, bits)
                for bits in measurements[0].precisions
                if all(bits in m.precisions for m in measurements)
            },
        }
    )


def measure_latency(
    runner: LayerwiseRunner,
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    positions: Iterable[int] = DEFAULT_POSITIONS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    model: str = "",
    seed: int = 0,
    head_rows: Iterable[int] = DEFAULT_HEAD_ROWS,
    precisions: Iterable[int] = LOW_BITS,
) -> LatencyProfile:
    """A LatencyProfile measured in this process (`profile_processes` spreads one over several)."""
    contexts, steps = check_axes(context_lengths, positions)
    measured = measure_samples(
        runner, contexts, steps, repeats, warmup, seed, head_rows=head_rows, precisions=precisions
    )
    meta = {**process_meta(runner, model), "warmup": warmup}
    return combine([measured], meta, contexts, steps)
