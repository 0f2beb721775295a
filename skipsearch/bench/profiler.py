"""Measure a `LatencyProfile` on the current device: what one SSD round really costs (DESIGN §5).

The closed forms price a contiguous draft `[0, E)` at `c = E / L` of a full step. Reference 001
§5.1 warns that this underestimates `c`: the embedding, the final norm and the LM head run on every
draft step whatever the exit layer, and small passes do not shrink in proportion to their work. So
we time every part of a real forward pass separately — embedding, each layer's attention and MLP
sub-layer, norm + head — for `k` new positions (1 for a draft step, γ+1 for verify) against a KV
cache pre-filled to each context length, plus the per-round work outside the forward passes and
the head of a draft vocabulary: norm + `k` gathered rows of the LM head, for several `k` (DESIGN §8).

Noise control, since two runs must agree: every sample is one whole forward in execution order, so
each sub-layer's weights are as cold in the CPU caches as in real decoding; the (context, positions)
passes are shuffled within each repeat, so a slow spell of the machine spreads over all entries
instead of biasing one; the garbage collector is paused; each entry keeps the median and the IQR.
A process's speed is itself partly a draw, so `skipsearch profile` spreads the samples over several
fresh processes (`profile_processes`) and keeps the mean of their medians (`combine`). No
statistic rescues a CPU that other processes keep busy — every parallel kernel then stalls — so
such a run is flagged by its spread instead.

Imports torch only inside the measuring functions.
"""

from __future__ import annotations

import copy
import gc
import itertools
import logging
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.progress import progress_bar
from skipsearch.store import atomic_path

if TYPE_CHECKING:
    import torch

    from skipsearch.models.runner import LayerwiseRunner

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTHS = (128, 512, 2048)
DEFAULT_POSITIONS = tuple(range(1, 10))
DEFAULT_REPEATS = 40  # over DEFAULT_PROCESSES processes: see results/profile/stability.md
DEFAULT_WARMUP = 2
# Draft-head sizes timed (those below the vocabulary, plus the full one): the draft vocabularies
# a search space offers, from 1k to 32k ids.
DEFAULT_HEAD_ROWS = (1024, 2048, 4096, 8192, 16384, 32768)
SUMMARY_GAMMAS = tuple(range(1, 9))
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


@dataclass(frozen=True)
class PassTimes:
    """Seconds of each part of one forward pass over `k` new positions."""

    embed: float
    attn: tuple[float, ...]
    mlp: tuple[float, ...]
    head: float


@dataclass(frozen=True)
class Samples:
    """Every kept sample: `embed`/`head` `[context, positions, repeat]`, `attn`/`mlp` `[layer, ...]`."""

    embed: np.ndarray
    head: np.ndarray
    attn: np.ndarray
    mlp: np.ndarray

    @classmethod
    def empty(cls, layers: int, contexts: int, positions: int, repeats: int) -> Samples:
        shape = (contexts, positions, repeats)
        return cls(np.zeros(shape), np.zeros(shape), np.zeros((layers, *shape)), np.zeros((layers, *shape)))

    def record(self, c: int, k: int, repeat: int, times: PassTimes) -> None:
        """Store one pass at context index `c`, positions index `k`."""
        self.embed[c, k, repeat] = times.embed
        self.head[c, k, repeat] = times.head
        self.attn[:, c, k, repeat] = times.attn
        self.mlp[:, c, k, repeat] = times.mlp

    def reduce(self, statistic: Callable[[np.ndarray], np.ndarray]) -> dict[str, Any]:
        """Each table reduced over its repeats, as the nested lists `LatencyProfile` stores."""
        return {name: statistic(getattr(self, name)).tolist() for name in LatencyProfile.TABLES}


def _median(samples: np.ndarray) -> np.ndarray:
    return np.median(samples, axis=-1)


def _iqr(samples: np.ndarray) -> np.ndarray:
    upper, lower = np.percentile(samples, [75, 25], axis=-1)
    return upper - lower


class WallClock:
    """Host wall time: on a CPU the call's work is done when it returns."""

    def time(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - start


class CudaClock:
    """CUDA events around the call, after a synchronisation: the device's time, not the launch's.

    A call returns once its kernels are queued, so wall time would count the launch only. The
    queue is drained first, so the start event marks the call's first kernel, and the end event
    is waited for. Between the events the device may idle while the host launches the next
    kernel: at one position a sub-layer is launch-bound, and these times include that gap.
    """

    def __init__(self, device: torch.device) -> None:
        import torch

        self.device = device
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def time(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        import torch

        torch.cuda.synchronize(self.device)
        self.start.record()
        out = fn(*args)
        self.end.record()
        self.end.synchronize()
        return out, self.start.elapsed_time(self.end) / 1e3


Sync = WallClock | CudaClock


def _synchronizer(device: torch.device) -> Sync:
    """The clock for `device`: CUDA events on a GPU, wall time elsewhere."""
    return CudaClock(device) if device.type == "cuda" else WallClock()


def _timed(sync: Sync, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    return sync.time(fn, *args)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A collection in the middle of a timed call would land on whichever sub-layer was running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def prefill_cache(runner: LayerwiseRunner, context: int, generator: torch.Generator) -> Any:
    """A `DynamicCache` holding `context` positions of random tokens in every layer.

    Past recording is switched on afterwards so sliding-window layers can be cropped back too.
    """
    import torch

    cache = runner.new_cache()
    ids = _random_ids(runner, context, generator)
    position_ids = torch.arange(context, device=runner.device)[None]
    with torch.no_grad():
        runner.run_layers(runner.embed(ids), 0, runner.num_layers, position_ids, cache=cache)
    cache.activate_past_recording()
    return cache


def _random_ids(runner: LayerwiseRunner, length: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    ids = torch.randint(0, runner.config.vocab_size, (1, length), generator=generator)
    return ids.to(runner.device)


def _pass_setup(
    runner: LayerwiseRunner, ids: torch.Tensor, position_ids: torch.Tensor, cache: Any
) -> tuple[torch.Tensor, Any, list[Any]]:
    """Embedding, rotary tables and one causal mask per attention type: the per-pass preamble.

    Charged to `embed`, since every pass (draft step or verify) pays it once whatever it skips.
    """
    hidden = runner.embed(ids)
    rotary = runner.rotary(hidden, position_ids)
    masks: dict[str, Any] = {}
    for layer, kind in enumerate(runner.layer_types):
        if kind not in masks:
            masks[kind] = runner.causal_mask(hidden, position_ids, cache, layer)
    return hidden, rotary, [masks[kind] for kind in runner.layer_types]


def time_pass(runner: LayerwiseRunner, cache: Any, ids: torch.Tensor, sync: Sync) -> PassTimes:
    """Time each part of one full forward over `ids` after the positions `cache` holds.

    Each attention call appends its `k` positions to its layer's cache, as a real pass does; the
    crop right after (outside the clock) takes them off again, so every sample sees one context.
    """
    import torch

    context, positions = cache.get_seq_length(), ids.shape[1]
    position_ids = torch.arange(context, context + positions, device=runner.device)[None]
    with torch.no_grad():
        (hidden, rotary, masks), embed = _timed(sync, _pass_setup, runner, ids, position_ids, cache)
        attn, mlp = [], []
        for layer in range(runner.num_layers):
            hidden, seconds = _timed(sync, runner.attention, layer, hidden, rotary, masks[layer], cache)
            cache.layers[layer].crop(-positions)
            attn.append(seconds)
            hidden, seconds = _timed(sync, runner.mlp, layer, hidden)
            mlp.append(seconds)
        _, head = _timed(sync, runner.head, hidden)
    return PassTimes(embed, tuple(attn), tuple(mlp), head)


def _time_passes(
    runner: LayerwiseRunner,
    caches: Sequence[Any],
    positions: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
    label: str,
) -> Samples:
    """`warmup + repeats` rounds over every (cache, positions) pair, shuffled within each round."""
    grid = list(itertools.product(range(len(caches)), range(len(positions))))
    samples = Samples.empty(runner.num_layers, len(caches), len(positions), repeats)
    order = np.random.default_rng(int(generator.initial_seed()))
    with progress_bar(label, (warmup + repeats) * len(grid)) as bar:
        for repeat in range(-warmup, repeats):
            for index in order.permutation(len(grid)):
                c, k = grid[index]
                ids = _random_ids(runner, positions[k], generator)
                times = time_pass(runner, caches[c], ids, sync)
                if repeat >= 0:
                    samples.record(c, k, repeat, times)
                bar.advance(bar.task_ids[0])
    return samples


def _warn_if_noisy(samples: Samples) -> None:
    """Flag a profile taken on a busy device: its medians measure the neighbours, not the model.

    On an idle CPU a sub-layer's IQR is about a quarter of its median; when other processes share
    the cores every parallel kernel stalls and the IQR exceeds the median itself.
    """
    noise = float(np.median(_iqr(samples.attn) / _median(samples.attn)))
    if noise > NOISY:
        log.warning(
            "timings are noisy (typical IQR is %.1fx the median): other work is probably running on "
            "this device; stop it and re-run for a profile that repeats",
            noise,
        )


def round_bookkeeping(draft_logits: Sequence[torch.Tensor], verify_logits: torch.Tensor, cache: Any) -> int:
    """The engine's own work of one greedy round outside the forward passes; returns the accepted count.

    The draft's argmax per step (`[1, V]` each), then the engine's `greedy_accept` over the `γ + 1`
    verify positions, its `crop` of the rejected positions and its cache-length check — the same
    functions `engine.ssd.settle` runs, so the profile prices what the engine does. The crop
    removes all `γ`: slicing costs the same whatever the count.
    """
    import torch

    from skipsearch.engine.cache import check_lengths, crop
    from skipsearch.engine.sampling import greedy_accept

    drafted = torch.cat([logits.argmax(dim=-1) for logits in draft_logits])
    accepted, _ = greedy_accept(drafted, verify_logits)
    length = cache.get_seq_length() - len(draft_logits)
    crop(cache, length)
    check_lengths(cache, length)
    return accepted


def _shallow_copy(cache: Any) -> Any:
    """A cache whose layers can be cropped without touching `cache`: crop rebinds, never writes."""
    trial = copy.copy(cache)
    trial.layers = [copy.copy(layer) for layer in cache.layers]
    return trial


def _time_round_overhead(
    runner: LayerwiseRunner,
    cache: Any,
    gammas: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> dict[int, np.ndarray]:
    """Seconds of `round_bookkeeping` per γ, on logits of the model's real vocabulary size."""
    import torch

    weight = runner.model.lm_head.weight
    logits = torch.randn(2 * max(gammas) + 1, weight.shape[0], generator=generator).to(weight)
    samples: dict[int, list[float]] = {gamma: [] for gamma in gammas}
    order = np.random.default_rng(int(generator.initial_seed()))
    for repeat in range(-warmup, repeats):
        for gamma in order.permutation(gammas).tolist():
            draft = list(logits[:gamma].split(1))
            verify = logits[gamma : 2 * gamma + 1]
            _, seconds = _timed(sync, round_bookkeeping, draft, verify, _shallow_copy(cache))
            if repeat >= 0:
                samples[gamma].append(seconds)
    return {gamma: np.asarray(times) for gamma, times in samples.items()}


def _draft_head(runner: LayerwiseRunner, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A draft step's head over a gathered contiguous matrix of `k` rows: final norm, `hidden @ rows.T`."""
    import torch

    return torch.nn.functional.linear(runner.decoder.norm(hidden), rows)


def _time_draft_heads(
    runner: LayerwiseRunner,
    cache: Any,
    rows: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> np.ndarray:
    """Seconds of `_draft_head` with the first `k` rows of the LM head, `[len(rows), repeats]`.

    Each sample follows an untimed full pass at one position, so the head's rows are as cold as
    after a draft's layers: timed back to back, a small head would sit in the CPU caches and look
    cheaper than it is in decoding. Row counts are shuffled within each repeat.
    """
    import torch

    weight = runner.model.lm_head.weight
    heads = [weight[:k].contiguous() for k in rows]
    hidden = torch.randn(1, 1, weight.shape[1], generator=generator).to(weight)
    samples = np.zeros((len(rows), repeats))
    order = np.random.default_rng(int(generator.initial_seed()))
    with torch.no_grad():
        for repeat in range(-warmup, repeats):
            for index in order.permutation(len(rows)).tolist():
                time_pass(runner, cache, _random_ids(runner, 1, generator), sync)
                _, seconds = _timed(sync, _draft_head, runner, hidden, heads[index])
                if repeat >= 0:
                    samples[index, repeat] = seconds
    return samples


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


def _check_settings(
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

    from skipsearch.models.kernels import step_bytes

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
        "attention": runner.model.config._attn_implementation,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_position": kv_bytes,
    }


@dataclass(frozen=True)
class ProcessTimings:
    """Every sample one process took: the forward-pass tables, the round overhead per γ, the
    draft head with `head_rows[i]` rows in `draft_head[i]`, and the copy bandwidth (bytes/s)."""

    samples: Samples
    overhead: dict[int, np.ndarray]
    head_rows: tuple[int, ...]
    draft_head: np.ndarray
    copy_bandwidth: float


def copy_bandwidth(device: torch.device, sync: Sync) -> float:
    """Bytes per second this device moves in a large tensor copy (read plus write, as STREAM's
    copy counts them), the best of `COPY_REPEATS`: the bandwidth a memory-bound step can reach."""
    import torch

    source = torch.ones(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # touch every page first
    best = min(_timed(sync, target.copy_, source)[1] for _ in range(COPY_REPEATS))
    return 2 * COPY_BYTES / best


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
) -> ProcessTimings:
    """Time every part of a forward pass on `runner`'s device, the per-round overhead and draft heads.

    For each context length and each number of new positions `k`: embedding (+ rotary and mask),
    each attention and MLP sub-layer, and norm + head, `repeats` samples after `warmup` discarded
    rounds. Round overhead is sampled for every γ with `γ + 1 <= max(positions)`; the draft head
    for each of `head_rows` below the vocabulary size and for the full vocabulary.
    """
    import torch

    contexts, steps = check_axes(context_lengths, positions)
    _check_settings(runner, contexts, steps, repeats, warmup)
    rows = head_row_counts(int(runner.model.lm_head.weight.shape[0]), head_rows)
    sync = _synchronizer(runner.device)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    with _gc_paused():
        caches = [prefill_cache(runner, context, generator) for context in contexts]
        samples = _time_passes(runner, caches, steps, repeats, warmup, sync, generator, label)
        gammas = range(1, steps[-1])
        overhead = _time_round_overhead(runner, caches[0], gammas, repeats, warmup, sync, generator)
        draft_head = _time_draft_heads(runner, caches[0], rows, repeats, warmup, sync, generator)
    del caches
    bandwidth = copy_bandwidth(runner.device, sync)
    log.info("timed %d layers in %.1f s", runner.num_layers, time.perf_counter() - started)
    return ProcessTimings(samples, overhead, rows, draft_head, bandwidth)


def _pooled(measurements: Sequence[ProcessTimings]) -> Samples:
    """All processes' samples of each entry side by side, along the repeat axis."""
    return Samples(
        **{
            name: np.concatenate([getattr(m.samples, name) for m in measurements], axis=-1)
            for name in LatencyProfile.TABLES
        }
    )


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
        name: np.mean([_median(getattr(m.samples, name)) for m in measurements], axis=0).tolist()
        for name in LatencyProfile.TABLES
    }
    overhead = {
        gamma: float(np.mean([np.median(m.overhead[gamma]) for m in measurements]))
        for gamma in measurements[0].overhead
    }
    head_by_rows = np.mean([_median(m.draft_head) for m in measurements], axis=0)
    meta = {
        **meta,
        "repeats": pooled.embed.shape[-1],
        "processes": len(measurements),
        # Each process's full pass at the shortest context and the most positions: its speed draw.
        "process_pass_ms": [round(1e3 * _pass_median(m.samples), 3) for m in measurements],
        "load_average": os.getloadavg()[0],  # ~threads when idle: more means the device was shared
        "copy_bandwidth": float(np.mean([m.copy_bandwidth for m in measurements])),
    }
    # Built from its JSON form, so the profile in memory equals the one `LatencyProfile.load` reads.
    return LatencyProfile.from_dict(
        {
            "meta": meta,
            "context_lengths": tuple(context_lengths),
            "positions": tuple(positions),
            **tables,
            "spread": pooled.reduce(_iqr),
            "round_overhead": overhead,
            "head_rows": measurements[0].head_rows,
            "head_by_rows": head_by_rows.tolist(),
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
) -> LatencyProfile:
    """A LatencyProfile measured in this process (`profile_processes` spreads one over several)."""
    contexts, steps = check_axes(context_lengths, positions)
    measured = measure_samples(runner, contexts, steps, repeats, warmup, seed, head_rows=head_rows)
    meta = {**process_meta(runner, model), "warmup": warmup}
    return combine([measured], meta, contexts, steps)


# -- what the profile says -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSummary:
    """The two numbers the closed forms assume away, per context length (DESIGN §5, reference 001 §5.1).

    `draft_cost[i][E - 1]` is `c` of the contiguous draft `[0, E)` at `context_lengths[i]`: its
    one-position step, embedding and head included, over a full step; the closed forms assume
    `E / L`. `verify_cost[i][γ - 1]` is `f(γ)`: a full pass over `γ + 1` positions over one step.
    `head_ratio[i]` is the draft head with `head_rows[i]` rows over the full head: `k / V` if time
    were proportional to rows (empty for a profile without the table).
    """

    context_lengths: tuple[int, ...]
    num_layers: int
    draft_cost: tuple[tuple[float, ...], ...]
    gammas: tuple[int, ...]
    verify_cost: tuple[tuple[float, ...], ...]
    head_rows: tuple[int, ...] = ()
    head_ratio: tuple[float, ...] = ()

    @property
    def exits(self) -> range:
        return range(1, self.num_layers + 1)

    def naive(self, exit_layer: int) -> float:
        """`E / L`: the draft cost if time were proportional to layers."""
        return exit_layer / self.num_layers


def summary(profile: LatencyProfile, gammas: Iterable[int] = SUMMARY_GAMMAS) -> ProfileSummary:
    """Effective draft cost `c` per exit layer and verify cost `f(γ)` at every measured context length."""
    gammas = tuple(gammas)
    layers = profile.num_layers
    prefixes = [SkipMask.prefix(layers, exit_layer) for exit_layer in range(1, layers + 1)]

    def draft_costs(context: int) -> tuple[float, ...]:
        step = profile.weights(context)
        return tuple(mask.r_draft(step) for mask in prefixes)

    def verify_costs(context: int) -> tuple[float, ...]:
        return tuple(profile.weights(context, g + 1).total / profile.step_time(context) for g in gammas)

    return ProfileSummary(
        context_lengths=profile.context_lengths,
        num_layers=layers,
        draft_cost=tuple(draft_costs(c) for c in profile.context_lengths),
        gammas=gammas,
        verify_cost=tuple(verify_costs(c) for c in profile.context_lengths),
        head_rows=profile.head_rows,
        head_ratio=tuple(t / profile.head_by_rows[-1] for t in profile.head_by_rows),
    )
