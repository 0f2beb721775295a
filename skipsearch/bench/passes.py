"""Timing the parts of a forward pass, the round's bookkeeping and the draft head (`latency_profiler`).

Every sample is one whole forward in execution order, so each sub-layer's weights are as cold in
the CPU caches as in real decoding; the (context, positions) passes are shuffled within each
repeat (`shuffled_repeats`, which the graphed profile's timings share). Imports torch only inside
the measuring functions.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from skipsearch.bench.clock import Sync, timed
from skipsearch.cost.latency import LatencyProfile
from skipsearch.masks import FULL_BITS, KVPattern
from skipsearch.progress import progress_bar

if TYPE_CHECKING:
    import torch

    from skipsearch.models.runner import LayerwiseRunner

Item = TypeVar("Item")


def shuffled_repeats(
    items: Sequence[Item], repeats: int, warmup: int, generator: torch.Generator
) -> Iterator[tuple[int, Item]]:
    """`(repeat, item)` for every item in each of `warmup + repeats` rounds, shuffled within each
    round, so a slow spell of the machine spreads over all items instead of biasing one; the
    warm-up rounds come first, numbered below 0, and their samples are dropped. The order is drawn
    from `generator`'s seed, so a profile taken twice times its items in the same order."""
    order = np.random.default_rng(int(generator.initial_seed()))
    for repeat in range(-warmup, repeats):
        for index in order.permutation(len(items)).tolist():
            yield repeat, items[index]


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


def prefill_cache(runner: LayerwiseRunner, context: int, generator: torch.Generator) -> Any:
    """A `DynamicCache` holding `context` positions of random tokens in every layer.

    Past recording is switched on afterwards so sliding-window layers can be cropped back too.
    """
    import torch

    cache = runner.new_cache()
    ids = random_ids(runner, context, generator)
    position_ids = torch.arange(context, device=runner.device)[None]
    with torch.no_grad():
        runner.run_layers(runner.embed(ids), 0, runner.num_layers, position_ids, cache=cache)
    cache.activate_past_recording()
    return cache


def random_ids(runner: LayerwiseRunner, length: int, generator: torch.Generator) -> torch.Tensor:
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


def time_pass(
    runner: LayerwiseRunner, cache: Any, ids: torch.Tensor, sync: Sync, bits: int = FULL_BITS
) -> PassTimes:
    """Time each part of one full forward over `ids` after the positions `cache` holds, every
    layer's weights at `bits` (`FULL_BITS`, or 8 / 4: the draft's copies, on the path a draft runs
    them, `LayerwiseRunner.fused_at`; `LayerwiseRunner.prepare_every_layer` first).

    Each attention call appends its `k` positions to its layer's cache, as a real pass does; the
    crop right after (outside the clock) takes them off again, so every sample sees one context.
    """
    import torch

    context, positions = cache.get_seq_length(), ids.shape[1]
    position_ids = torch.arange(context, context + positions, device=runner.device)[None]
    with torch.no_grad():
        (hidden, rotary, masks), embed = timed(sync, _pass_setup, runner, ids, position_ids, cache)
        attn, mlp = [], []
        attention = runner.attention if bits == FULL_BITS else partial(runner.attention, bits=bits)
        for layer in range(runner.num_layers):
            hidden, seconds = timed(sync, attention, layer, hidden, rotary, masks[layer], cache)
            cache.layers[layer].crop(-positions)
            attn.append(seconds)
            hidden, seconds = timed(sync, runner.mlp, layer, hidden, bits)
            mlp.append(seconds)
        _, head = timed(sync, runner.head, hidden)
    return PassTimes(embed, tuple(attn), tuple(mlp), head)


def time_passes(
    runner: LayerwiseRunner,
    caches: Sequence[Any],
    positions: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
    label: str,
    bits: int = FULL_BITS,
) -> Samples:
    """`warmup + repeats` rounds over every (cache, positions) pair, shuffled within each round,
    every layer's weights at `bits` (`time_pass`)."""
    grid = list(itertools.product(range(len(caches)), range(len(positions))))
    samples = Samples.empty(runner.num_layers, len(caches), len(positions), repeats)
    with progress_bar(label, (warmup + repeats) * len(grid)) as bar:
        for repeat, (c, k) in shuffled_repeats(grid, repeats, warmup, generator):
            ids = random_ids(runner, positions[k], generator)
            times = time_pass(runner, caches[c], ids, sync, bits)
            if repeat >= 0:
                samples.record(c, k, repeat, times)
            bar.advance(bar.task_ids[0])
    return samples


def round_bookkeeping(draft_logits: Sequence[torch.Tensor], verify_logits: torch.Tensor, cache: Any) -> int:
    """The engine's own work of one greedy round outside the forward passes; returns the accepted count.

    The draft's argmax per step (`[1, V]` each), then the engine's `greedy_accept` over the `γ + 1`
    verify positions, its `crop` of the rejected positions and its cache-length check — the same
    functions `engine.ssd.settle` runs, so the profile prices what the engine does. The crop
    removes all `γ`: slicing costs the same whatever the count.
    """
    import torch

    from skipsearch.engine.sampling import greedy_accept
    from skipsearch.engine.shared_kv import check_lengths, crop

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


def time_round_overhead(
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
    for repeat, gamma in shuffled_repeats(gammas, repeats, warmup, generator):
        draft = list(logits[:gamma].split(1))
        verify = logits[gamma : 2 * gamma + 1]
        _, seconds = timed(sync, round_bookkeeping, draft, verify, _shallow_copy(cache))
        if repeat >= 0:
            samples[gamma].append(seconds)
    return {gamma: np.asarray(times) for gamma, times in samples.items()}


def pillar_round(
    runner: LayerwiseRunner, cache: Any, pattern: KVPattern, scores: Sequence[torch.Tensor]
) -> Any:
    """What a round with a pillar draft does outside its passes, as the engine does it
    (`engine.ssd.SelfSpeculative`): the verify's choice from each layer's query-0 scores
    (`[1, H, 1, N]`), every layer's pillars read out, then gathered from `cache` for the draft."""
    import torch

    from skipsearch.kv.pillars import PillarChoice, PillarKeys

    length = scores[0].shape[-1]
    source = torch.tensor([[length - 1]], device=scores[0].device)
    choice = PillarChoice(pattern, source, runner.num_layers, runner.config.num_key_value_heads)
    for layer, layer_scores in enumerate(scores):
        choice.record(layer, layer_scores)
    return PillarKeys.gather(pattern, choice.first_rows(), cache)


def time_pillar_choice(
    runner: LayerwiseRunner,
    caches: Sequence[Any],
    pattern: KVPattern,
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> np.ndarray:
    """Seconds of `pillar_round` over each cache, `[len(caches), repeats]`, on random scores of the
    cache's length (the choice's cost depends on the keys and layers, not on their values)."""
    import torch

    heads = runner.config.num_attention_heads
    samples = np.zeros((len(caches), repeats))
    for index, cache in enumerate(caches):
        length = cache.get_seq_length()
        scores = [
            torch.randn(1, heads, 1, length, generator=generator).to(runner.device)
            for _ in range(runner.num_layers)
        ]
        for repeat in range(-warmup, repeats):
            _, seconds = timed(sync, pillar_round, runner, cache, pattern, scores)
            if repeat >= 0:
                samples[index, repeat] = seconds
    return samples


def time_draft_heads(
    runner: LayerwiseRunner,
    cache: Any,
    rows: Sequence[int],
    repeats: int,
    warmup: int,
    sync: Sync,
    generator: torch.Generator,
) -> np.ndarray:
    """Seconds of a draft head (`DraftHead`: final norm and its own product) over the first `k`
    rows of the LM head, `[len(rows), repeats]`.

    Each sample follows an untimed full pass at one position, so the head's rows are as cold as
    after a draft's layers: timed back to back, a small head would sit in the CPU caches and look
    cheaper than it is in decoding. Row counts are shuffled within each repeat.
    """
    import torch

    from skipsearch.models.draft_head import DraftHead

    heads = [DraftHead.gather(runner, range(k)) for k in rows]
    embedding = runner.decoder.embed_tokens.weight
    hidden = torch.randn(1, 1, runner.config.hidden_size, generator=generator).to(embedding)
    samples = np.zeros((len(rows), repeats))
    with torch.no_grad():
        for repeat, index in shuffled_repeats(range(len(rows)), repeats, warmup, generator):
            time_pass(runner, cache, random_ids(runner, 1, generator), sync)
            _, seconds = timed(sync, heads[index], hidden)
            if repeat >= 0:
                samples[index, repeat] = seconds
    return samples
