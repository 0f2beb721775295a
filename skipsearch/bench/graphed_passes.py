"""The forward passes the graphed profile times (`bench.graphed_profile`): each part of a pass —
embed (with the rotary tables and the causal mask), each attention, each MLP, norm + head — captured
as a CUDA graph of its own over a `StaticKV`, as `engine.graphs` runs them, and chained, so the
replays in order compute the real forward pass; the whole pass captured as one graph beside them,
and both checked against the eager pass.

Without a graph pool (`pool=None`) the same part functions run eagerly, as
`GraphSteps(capture=False)` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from skipsearch.bench.passes import random_ids
from skipsearch.engine.graphs import REPLAY_TOLERANCE, GraphReplayError, capture, sliding_window_problem
from skipsearch.engine.shared_kv import StaticKV
from skipsearch.errors import ConfigError
from skipsearch.models.runner import LayerwiseRunner

Part = Callable[[Any], Any]


@dataclass(frozen=True)
class Carry:
    """What flows from part to part of a pass: the residual stream, and the preamble every
    attention reads (the rotary tables, the causal mask over all the cache's slots)."""

    hidden: torch.Tensor
    rotary: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor


@dataclass(frozen=True)
class GraphedPass:
    """One forward pass over `ids` (`[1, k]`, a static buffer) after the `context` positions that
    `tokens` left in `cache`: its parts in execution order and the whole pass, each a `Part` that
    replays its graph (or, eagerly, runs the part) on the previous part's output."""

    context: int
    tokens: torch.Tensor
    ids: torch.Tensor
    cache: StaticKV
    parts: tuple[Part, ...]
    whole: Part

    def restore(self) -> None:
        """Every layer back at `context` positions: each attention of a pass appends `k`, on the
        device (a clamp would do as well; neither reads anything back)."""
        self.cache.lengths.fill_(self.context)


def run_in_order(parts: Sequence[Part], carry: Any = None) -> Any:
    """The parts of a pass, each on the previous one's output: the pass's output."""
    for part in parts:
        carry = part(carry)
    return carry


def _causal(slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`[1, 1, k, max_len]`: query `i` attends to every slot up to its position (`engine.graphs`)."""
    return (slots <= positions[0, :, None])[None, None]


def _embed(
    runner: LayerwiseRunner, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, _carry: None
) -> Carry:
    hidden = runner.embed(ids)
    return Carry(hidden, runner.rotary(hidden, positions), _causal(slots, positions))


def _attention(runner: LayerwiseRunner, cache: StaticKV, layer: int, carry: Carry) -> Carry:
    hidden = runner.attention(layer, carry.hidden, carry.rotary, carry.mask, cache, own_mask=True)
    return replace(carry, hidden=hidden)


def _mlp(runner: LayerwiseRunner, layer: int, carry: Carry) -> Carry:
    return replace(carry, hidden=runner.mlp(layer, carry.hidden))


def _head(runner: LayerwiseRunner, carry: Carry) -> torch.Tensor:
    return runner.head(carry.hidden)


def pass_steps(
    runner: LayerwiseRunner, cache: StaticKV, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
) -> list[Part]:
    """The eager parts of one full pass in execution order: embed (+ rotary and mask, which every
    pass pays once, as `passes._pass_setup` charges them), attention and MLP of each layer (with
    the caller's mask, as `run_layers` runs a static cache's layers), then norm + head."""
    layers = (
        (partial(_attention, runner, cache, layer), partial(_mlp, runner, layer))
        for layer in range(runner.num_layers)
    )
    return [
        partial(_embed, runner, ids, positions, slots),
        *itertools.chain.from_iterable(layers),
        partial(_head, runner),
    ]


def record(step: Part, inputs: Any, cache: StaticKV, context: int, pool: Any) -> Part:
    """`step` itself without a `pool` (eager); else a replay of its graph captured on `inputs` (a
    static tensor or Carry of them), which returns the captured output whatever it is given.

    Captured as `engine.graphs` captures its steps (`capture`); an attention's runs append to its
    layer, so the lengths are set back to `context` after each, and the graph reads them from the
    device at every replay.
    """
    if pool is None:
        return step
    graph, output = capture(lambda: step(inputs), lambda: cache.lengths.fill_(context), pool)
    return Replay(graph, output, step)


@dataclass(frozen=True)
class Replay:
    """A captured part: replays `graph` and returns its captured `output`, whatever it is given.

    It holds `step`, whose own tensors (a pass's positions and slots, a draft head's rows and
    input) the graph reads by address and nothing else references: freed, their memory goes to
    other tensors and every replay reads those. (Found on a GPU: the chained replays' logits
    came out 0.4-1.7 off the forward pass once the passes' steps were gone.)"""

    graph: torch.cuda.CUDAGraph
    output: Any
    step: Part

    def __call__(self, _: Any) -> Any:
        self.graph.replay()
        return self.output


def prefilled_cache(
    runner: LayerwiseRunner, context: int, room: int, generator: torch.Generator
) -> tuple[StaticKV, torch.Tensor]:
    """A `StaticKV` of `context + room` slots and the `context` random tokens whose K/V it holds
    in every layer, run eagerly as `GraphSteps.prefill` runs a prompt.

    No more slots than a pass needs: a static cache's attention reads every slot, so a bigger one
    would price the context as longer than it is."""
    device = runner.device
    dtype = runner.decoder.embed_tokens.weight.dtype
    cache = StaticKV(runner.config, context + room, 1, dtype, device)
    tokens = random_ids(runner, context, generator)
    positions = torch.arange(context, device=device)[None]
    mask = _causal(torch.arange(context + room, device=device), positions)
    runner.run_layers(runner.embed(tokens), 0, runner.num_layers, positions, cache=cache, attention_mask=mask)
    return cache, tokens


@torch.no_grad()  # a captured graph must not record autograd state
def graphed_passes(
    runner: LayerwiseRunner,
    contexts: Sequence[int],
    positions: Sequence[int],
    generator: torch.Generator,
    pool: Any = None,
) -> list[list[GraphedPass]]:
    """`[context][positions]`: one pass over random tokens at every pair, each part captured into
    `pool` in execution order (None: eager), then the whole pass as one graph.

    After each capture the part is replayed once, so the captured output the next part is captured
    on holds real values; a captured pass is then checked against its eager steps."""
    room = max(positions)
    problem = sliding_window_problem(runner, contexts[-1] + room)
    if problem:
        raise ConfigError(problem)
    grid: list[list[GraphedPass]] = []
    for context in contexts:
        cache, tokens = prefilled_cache(runner, context, room, generator)
        slots = torch.arange(context + room, device=runner.device)
        row = []
        for k in positions:
            ids = random_ids(runner, k, generator)
            at = torch.arange(context, context + k, device=runner.device)[None]
            steps = pass_steps(runner, cache, ids, at, slots)
            parts: list[Part] = []
            carry = None
            for step in steps:
                parts.append(record(step, carry, cache, context, pool))
                carry = parts[-1](carry)
            whole = record(partial(run_in_order, steps), None, cache, context, pool)
            graphed = GraphedPass(context, tokens, ids, cache, tuple(parts), whole)
            graphed.restore()
            if pool is not None:
                check_replays(graphed, steps)
            row.append(graphed)
        grid.append(row)
    return grid


def check_replays(graphed: GraphedPass, steps: Sequence[Part]) -> None:
    """Raise GraphReplayError unless the chained parts' replays and the whole pass's replay give
    the eager pass's logits (to rounding, as `engine.graphs` checks its steps): a capture that
    recorded other work, or a chain that lost a link, fails here instead of timing something else."""
    expected = run_in_order(steps).float()
    graphed.restore()
    for name, parts in (("chained parts", graphed.parts), ("whole pass", (graphed.whole,))):
        got = run_in_order(parts).float()
        graphed.restore()
        scale = float(expected.abs().max()) or 1.0
        error = float((expected - got).abs().max())
        if not error <= REPLAY_TOLERANCE * scale:  # `not <=` also catches NaN
            raise GraphReplayError(
                f"the {name} of the graphed pass at context {graphed.context}, {graphed.ids.shape[1]} "
                f"positions, differ from the eager pass by {error:.3g} (scale {scale:.3g})"
            )
