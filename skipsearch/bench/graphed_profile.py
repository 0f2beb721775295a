"""A LatencyProfile of CUDA-graph replays: each part of a pass as a graphed engine pays it
(docs/theory.md, "Calibrated cost"; `skipsearch profile --graphs`).

`latency_profiler` times launched kernels between syncs. On a GPU a sub-layer at one position is then
host-bound — launching its kernels takes longer than running them — so that profile overprices the
draft step of an engine that replays CUDA graphs (`engine.graphs`), where the launches are gone.
Here every part of a pass — embed (with the rotary tables and the causal mask), each attention,
each MLP, norm + head — is captured as a graph of its own over a `StaticKV`, as `engine.graphs`
runs them, and chained: each part's captured output is the next part's input, so the replays in
order compute the real forward pass (checked against the eager pass after capture;
`bench.graphed_passes` builds them). They are replayed in execution order, so each sub-layer's
weights are as cold as in decoding, with an event between every two replays
(`clock.CudaClock.chain`); the (context, positions) passes are shuffled within each repeat, as in
`passes.time_passes`.

A part replayed on its own still pays one graph launch that a pass captured as one graph does not,
so each whole pass is captured and timed too, and every part gives up an equal share of the
difference: `gap = (Σ parts − whole) / parts` (`reconcile`). The parts then sum to the whole pass
(no part is priced below zero); meta keeps the gaps (`launch_gap_s`) and the whole-pass medians
(`whole_pass_s`) so the reconciliation can be checked.

The round's overhead — what a round pays beyond its passes — is measured on real graphed rounds
(`time_graphed_rounds`): a round of `engine.graphs.GraphSteps` timed on the wall clock, from an idle
device to the accept's one host read, less its graphs replayed back to back on the device clock.
The rest is what the passes alone do not show: the host's bookkeeping while the device waits for
the next round's first replay, the inputs filled before each replay, the accept. Draft heads are
graphed too, each replayed right after a whole one-position pass. No pillar choice is timed:
graphs do not run KV patterns, so this profile prices pillars as free, and meta says so.

Without CUDA (`pool=None`, `capture=False`) the same part functions run eagerly, as
`GraphSteps(capture=False)` does, so all but the capture itself is tested on a CPU.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from skipsearch.bench.clock import Sync, clock_for, gc_paused
from skipsearch.bench.graphed_passes import GraphedPass, graphed_passes, record
from skipsearch.bench.latency_profiler import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_HEAD_ROWS,
    DEFAULT_POSITIONS,
    DEFAULT_REPEATS,
    DEFAULT_WARMUP,
    check_axes,
    check_settings,
    copy_bandwidth,
    head_row_counts,
    iqr,
    median,
    process_meta,
)
from skipsearch.bench.passes import PassTimes, Samples, random_ids, shuffled_repeats
from skipsearch.bench.processes import loaded_meta
from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.sampling import GREEDY
from skipsearch.engine.shared_kv import crop
from skipsearch.engine.ssd import settle
from skipsearch.engine.steps import Round
from skipsearch.engine.timing import RoundClock
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.random_weights import RandomWeights
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.progress import progress_bar

log = logging.getLogger(__name__)

# Seconds a draft head is held at when its launch gap swallows it: a profile needs a time > 0.
HEAD_FLOOR = 1e-9


def _draft_head(head: DraftHead, hidden: torch.Tensor, _carry: Any) -> torch.Tensor:
    return head(hidden)


def _pass_times(seconds: Sequence[float]) -> PassTimes:
    """`seconds` of embed, attention and MLP of each layer, head, as `PassTimes`."""
    return PassTimes(seconds[0], tuple(seconds[1:-1:2]), tuple(seconds[2:-1:2]), seconds[-1])


@torch.no_grad()
def time_graphed_passes(
    grid: Sequence[Sequence[GraphedPass]],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> tuple[Samples, np.ndarray]:
    """Every part of every pass, and every whole pass `[context, positions, repeat]`, timed
    `warmup + repeats` rounds, each round's (pass, parts or whole) shuffled.

    The parts are replayed in order with an event between every two (`Sync.chain`); the cache is
    set back to its context after each pass, outside the clock. Every sample replays the same
    tokens: no part's time depends on their values.
    """
    contexts, positions = len(grid), len(grid[0])
    work = list(itertools.product(range(contexts), range(positions), (False, True)))
    layers = (len(grid[0][0].parts) - 2) // 2  # embed, attention and MLP of each layer, head
    samples = Samples.empty(layers, contexts, positions, repeats)
    whole = np.zeros((contexts, positions, repeats))
    with progress_bar("profile --graphs: timing replays", (warmup + repeats) * len(work)) as bar:
        for repeat, (c, k, as_one) in shuffled_repeats(work, repeats, warmup, generator):
            graphed = grid[c][k]
            _, seconds = sync.chain((graphed.whole,) if as_one else graphed.parts)
            graphed.restore()
            if repeat >= 0 and as_one:
                whole[c, k, repeat] = seconds[0]
            elif repeat >= 0:
                samples.record(c, k, repeat, _pass_times(seconds))
            bar.advance(bar.task_ids[0])
    return samples, whole


@torch.no_grad()  # a captured graph must not record autograd state
def time_graphed_heads(
    runner: LayerwiseRunner,
    after: GraphedPass,
    rows: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
    pool: Any = None,
) -> np.ndarray:
    """Seconds of a draft head (`DraftHead`: final norm and its own product) over the first `k`
    rows of the LM head for each of `rows`, graphed, `[len(rows), repeats]`.

    Each head is replayed right after the whole pass `after` (one position), in one chain, so its
    rows are as cold as after a draft's layers (`passes.time_draft_heads`); row counts are
    shuffled within each repeat.
    """
    embedding = runner.decoder.embed_tokens.weight
    hidden = torch.randn(1, 1, runner.config.hidden_size, generator=generator).to(embedding)
    heads = [
        record(
            partial(_draft_head, DraftHead.gather(runner, range(k)), hidden),
            None,
            after.cache,
            after.context,
            pool,
        )
        for k in rows
    ]
    samples = np.zeros((len(rows), repeats))
    for repeat, index in shuffled_repeats(range(len(rows)), repeats, warmup, generator):
        _, seconds = sync.chain((after.whole, heads[index]))
        after.restore()
        if repeat >= 0:
            samples[index, repeat] = seconds[1]
    return samples


@torch.no_grad()
def time_graphed_rounds(
    runner: LayerwiseRunner,
    context: int,
    gammas: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> dict[int, np.ndarray]:
    """Seconds a graphed round of draft length γ pays beyond its graph replays, per γ.

    One round of `GraphSteps` (γ draft replays, the crop, the verify replay, `ssd.settle`'s accept
    and rollback) on the wall clock, from an idle device to the accept's host read — as each round
    of a decode starts — less the same graphs replayed back to back (`Sync.chain`). The mask is an
    early exit at half depth; what is left does not depend on which layers the graphs run."""
    layers = runner.num_layers
    mask = SkipMask.prefix(layers, max(1, layers // 2))
    steps = GraphSteps(runner, [mask], [max(gammas)], context + max(gammas) + 2)
    prompt = random_ids(runner, context, generator)[0].tolist()
    cache = steps.prefill(prompt)
    pending = torch.tensor([[prompt[-1]]], device=runner.device)
    idle, untimed = device_sync(runner.device), RoundClock(runner.device, timed=False)
    samples: dict[int, list[float]] = {gamma: [] for gamma in gammas}
    for repeat, gamma in shuffled_repeats(gammas, repeats, warmup, generator):
        at = Round(0, cache, pending, context - 1, gamma)
        idle()
        began = time.perf_counter()
        proposal = steps.draft(at, GREEDY, None)
        crop(cache, at.start, range(mask.first_divergent_layer, layers))
        logits = steps.verify(at, proposal)
        settle(cache, list(prompt), proposal, logits, GREEDY, None, untimed)
        wall = time.perf_counter() - began
        crop(cache, context - 1)
        replays = [lambda _: steps.drafts[0]()] * gamma + [lambda _, g=gamma: steps.verifies[(0, g)]()]
        _, seconds = sync.chain(replays)
        crop(cache, context - 1)
        if repeat >= 0:
            samples[gamma].append(wall - sum(seconds))
    return {gamma: np.asarray(times) for gamma, times in samples.items()}


def reconcile(samples: Samples, whole: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The parts' medians, each less its pass's launch gap (never below zero), and the gaps
    `[context, positions]`: `gap = (Σ parts − whole) / parts` of the medians.

    A part replayed alone pays a graph launch (and the device's wait for it) that a pass captured
    as one graph pays once; taken off every part equally, the parts sum to the whole pass."""
    medians = {name: median(getattr(samples, name)) for name in LatencyProfile.TABLES}
    parts = 2 + 2 * medians["attn"].shape[0]
    total = medians["embed"] + medians["head"] + medians["attn"].sum(axis=0) + medians["mlp"].sum(axis=0)
    gap = (total - median(whole)) / parts
    return {name: np.maximum(table - gap, 0.0) for name, table in medians.items()}, gap


def measure_graphed_latency(
    runner: LayerwiseRunner,
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    positions: Iterable[int] = DEFAULT_POSITIONS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    model: str = "",
    capture: bool | None = None,
    seed: int = 0,
    head_rows: Iterable[int] = DEFAULT_HEAD_ROWS,
    meta: Mapping[str, Any] | None = None,
) -> LatencyProfile:
    """A LatencyProfile of CUDA-graph replays on `runner`'s device (see the module docstring).

    `capture` None captures on CUDA and runs the same parts eagerly elsewhere; `meta` adds what
    the caller knows of the model (`processes.loaded_meta`) to what `latency_profiler.process_meta` records.
    Round overhead is sampled for every γ with `γ + 1 <= max(positions)`, draft heads for each of
    `head_rows` below the vocabulary size and the full vocabulary.
    """
    contexts, steps = check_axes(context_lengths, positions)
    check_settings(runner, contexts, steps, repeats, warmup)
    capture = runner.device.type == "cuda" if capture is None else capture
    if capture and runner.device.type != "cuda":
        raise ConfigError(f"CUDA graphs need a CUDA device, the model is on {runner.device}: drop --graphs")
    rows = head_row_counts(int(runner.model.lm_head.weight.shape[0]), head_rows)
    sync = clock_for(runner.device)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    with gc_paused(), torch.no_grad():
        pool = torch.cuda.graph_pool_handle() if capture else None
        grid = graphed_passes(runner, contexts, steps, generator, pool)
        samples, whole = time_graphed_passes(grid, repeats, warmup, sync, generator)
        first = grid[0][0]
        gammas = range(1, steps[-1])
        overhead = time_graphed_rounds(runner, contexts[0], gammas, repeats, warmup, sync, generator)
        heads = time_graphed_heads(runner, first, rows, repeats, warmup, sync, generator, pool)
    del grid, first  # their graphs hold memory the copy below needs
    log.info("graphed and timed %d layers in %.1f s", runner.num_layers, time.perf_counter() - started)
    tables, gap = reconcile(samples, whole)
    bandwidth = copy_bandwidth(runner.device, sync)
    meta = {
        **process_meta(runner, model),
        **(meta or {}),
        "graphs": True,
        "capture": capture,
        "warmup": warmup,
        "repeats": repeats,
        "processes": 1,
        "load_average": os.getloadavg()[0],
        "copy_bandwidth": bandwidth,
        "launch_gap_s": gap.tolist(),
        "whole_pass_s": median(whole).tolist(),
        "draft_heads": f"replayed after the whole pass of k = {steps[0]} at context {contexts[0]}, less "
        "its launch gap",
        "pillar_choice": "not timed: graphs run no KV pattern, so pillars are priced as free",
    }
    # Built from its JSON form, so the profile in memory equals the one `LatencyProfile.load` reads.
    return LatencyProfile.from_dict(
        {
            "meta": meta,
            "context_lengths": contexts,
            "positions": steps,
            **{name: table.tolist() for name, table in tables.items()},
            "spread": samples.reduce(iqr),
            # A round's rest can read below zero on a CPU, where the replays are timed on the wall clock too.
            "round_overhead": {gamma: max(float(np.median(times)), 0.0) for gamma, times in overhead.items()},
            "head_rows": rows,
            "head_by_rows": np.maximum(median(heads) - gap[0, 0], HEAD_FLOOR).tolist(),
        }
    )


def profile_graphed(
    model: str,
    device: str = "cuda",
    dtype: str = "auto",
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    random_weights: RandomWeights | None = None,
) -> LatencyProfile:
    """`model` loaded on `device` and its graphed profile taken in this one process (a GPU's
    kernels do not inherit the host process's memory layout: `processes.default_processes`); a
    depth-cut weight-free model's is scaled back to its real depth, as `profile_processes` does."""
    from skipsearch.models.loading import load_model

    contexts, _ = check_axes(context_lengths, DEFAULT_POSITIONS)  # before the model loads
    loaded = load_model(model, device, dtype, random_weights)
    runner = LayerwiseRunner(loaded.model)
    extra = loaded_meta(loaded, random_weights)
    profile = measure_graphed_latency(
        runner, contexts, repeats=repeats, warmup=warmup, model=loaded.model_id, meta=extra
    )
    return scale_to_depth(profile, extra.get("real_num_layers", profile.num_layers))
