"""The round loop: one function (`run_rounds`) plays every kind of round — a chain's, a static or
dynamic token tree's, eager or on CUDA graphs, with one mask or a tier per round — on one shared KV
cache (docs/theory.md, "The engine: ground truth"), batch size 1. `speculative_decode`, a chain of
one mask, is its front door.

A round starts with `n` committed tokens; the cache holds positions `0 .. n-2` in every layer
and the last token `t` (position `n-1`) is pending (see `engine.shared_kv`).

1. Draft: γ steps of the masked model from `t`, writing K/V into the shared cache — a chain's γ
   tokens, one a step (fewer when the policy stops a round after a draft token the draft itself is
   unsure of), or a token tree's γ depths, one pass a depth (`engine.tree_rounds`). Layers below
   `s1` (the mask's first divergent layer) run exactly as in the full model, so their K/V — and
   the draft's residual stream at `s1` — are exact; K/V the draft writes in layers `>= s1` are
   scratch.
2. Verify: the full model over `t` and what was drafted, in one pass. The exact K/V below `s1` is
   reused: layers `< s1` run only for the tokens the draft never fed (a chain's last draft token,
   a tree's leaves); layers `>= s1` run for every position from the draft's exact states, after
   cropping their scratch K/V back to `n - 1`.
3. Accept: greedy (argmax equality) or rejection sampling, by the proposal's shape (a chain's
   `steps.ChainProposal`, a tree's walk); `k` drafts plus one target token are committed, so
   every output token is the target's.
4. Rollback: a chain crops every layer to the new committed length - 1; a tree first moves its
   accepted path's K/V next to `t` (`shared_kv.compact`). The invariant is checked after every
   round when the rounds are timed, else once after the last.

A round with γ = 0 is one plain autoregressive step: the γ controller uses it once speculation is
switched off, and the last round of a decode drafts less so the output never overshoots (a tree's
last token is its γ = 0 round).

The loop knows three interfaces (`engine.steps`): the passes (`RoundSteps`: eager, graphed, chain
or tree), the proposal (`Proposal`: what was drafted, its accept and rollback) and the schedule
(`Schedule`: each round's tier and γ, told how each round went): `OneMask` with the γ controller
(`speculative_decode`, `engine.graphed_decode`), `FixedLength` (`engine.tree_rounds`,
`engine.graphed_tree`), `tiered.TierSchedule` (`engine.tiered`).

Host reads: an untimed greedy chain round reads the device once — the accepted count together with
the committed tokens (`sampling.greedy_commit`) — and its pending token stays on the device, so a
GPU queues the next round's kernels (or CUDA-graph replays) without waiting; a greedy tree round
reads its drafted tokens and the target's argmax in one copy. Reads that remain by design: a
sampled round's, a draft that stops when unsure reads its confidence after every draft token
(`steps.confidence`), a dynamic tree reads its draft's choices after every pass, and a timed round
syncs at every phase boundary (`RoundClock`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from skipsearch.engine.gamma import GammaController, GammaPolicy
from skipsearch.engine.result import DecodeTrace, Rounds
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.shared_kv import check_lengths, crop
from skipsearch.engine.steps import EagerSteps, Proposal, Round, RoundSteps
from skipsearch.engine.timing import RoundClock
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.kernels import engaged
from skipsearch.models.runner import LayerwiseRunner


def settle(
    cache: Any,
    tokens: list[int],
    proposal: Proposal,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    clock: RoundClock,
) -> tuple[int, list[int], torch.Tensor]:
    """Steps 3 and 4 of a round: accept, append the committed tokens to `tokens`, roll back, by the
    proposal's shape (`steps.Proposal`). `logits` `[rows, V]` are the verify's.

    Returns the accepted draft count `n`, the `n + 1` tokens committed, and the last of them
    `[1, 1]` on the device: the next round's pending token. The invariant is checked here only in a
    timed round (`run_rounds`).
    """
    start = len(tokens) - 1
    with clock.phase("sample"):
        path, committed, pending = proposal.accept(logits, sampling, generator)
    tokens += committed
    with clock.phase("cache"):
        proposal.roll_back(cache, start, path)
        if clock.timed:
            check_lengths(cache, len(tokens) - 1)
    return len(path), committed, pending


class Schedule(Protocol):
    """Which mask and how many drafts (a tree: depths) the next round uses, told how each round went."""

    def next_round(self) -> tuple[int, int]:
        """(index of the mask, γ) before the output's end clips it."""

    def update(self, accepted: int, drafted: int) -> Any:
        """The outcome of the round just played."""


@dataclass
class OneMask:
    """Every round drafts with mask 0; the draft length comes from the γ controller."""

    controller: GammaController

    def next_round(self) -> tuple[int, int]:
        return 0, self.controller.gamma

    def update(self, accepted: int, drafted: int) -> None:
        self.controller.update(accepted, drafted)


@dataclass(frozen=True)
class FixedLength:
    """Every round drafts `length` (a tree: its depth) with mask `tier`."""

    length: int
    tier: int = 0

    def next_round(self) -> tuple[int, int]:
        return self.tier, self.length

    def update(self, accepted: int, drafted: int) -> None:
        pass


def run_rounds(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    max_new_tokens: int,
    steps: RoundSteps,
    schedule: Schedule,
    sampling: Sampling,
    generator: torch.Generator | None,
    eos_ids: Collection[int],
    timed: bool = True,
) -> tuple[DecodeTrace, tuple[int, ...]]:
    """The round loop of the module docstring, for any `steps` and `schedule`; returns the result
    and each round's mask index. `DecodeTrace.gammas` holds each round's γ (a tree's depth),
    `accepted` the drafts it accepted (a tree: the depth of its accepted path).

    Every round starts from a cache that holds exactly the full model's K/V, so the schedule may
    switch masks between rounds at no cost: no state of one mask's draft survives into the next.

    `timed` records every round's phase breakdown (`RoundClock`) and checks the cache invariant
    after the prefill and every round, at the cost of device syncs; untimed, the invariant is
    checked once, after the last round (a static cache's lengths cost a read), and
    `DecodeTrace.timings` is empty. Either way the device is synchronised once after the prefill,
    so `prefill_seconds` is the prefill's device time.
    """
    if max_new_tokens < 1 or not prompt:
        raise ConfigError(f"need a non-empty prompt and max_new_tokens >= 1, got {max_new_tokens}")
    rounds = Rounds()
    clock = RoundClock(runner.device, timed)
    cache = steps.prefill(prompt)
    device_sync(runner.device)()
    rounds.prefill_done()
    tokens = list(prompt)
    if timed:
        check_lengths(cache, len(tokens) - 1)
    pending = torch.tensor([[tokens[-1]]], device=runner.device)
    tiers: list[int] = []
    ended = False
    with engaged():  # the busy cores' helpers, where the kernel plan has them
        while len(tokens) - len(prompt) < max_new_tokens and not ended:
            clock.start()
            tier, wanted = schedule.next_round()
            start = len(tokens) - 1
            g = min(wanted, max_new_tokens - (len(tokens) - len(prompt)) - 1)
            at = Round(tier, cache, pending, start, g)
            with clock.phase("draft"):
                proposal = steps.draft(at, sampling, generator)
            g = proposal.length  # a chain's draft may stop early
            with clock.phase("cache"):
                crop(cache, start, range(steps.s1[tier], runner.num_layers))
            with clock.phase("verify"):
                logits = steps.verify(at, proposal)
            n, committed, pending = settle(cache, tokens, proposal, logits, sampling, generator, clock)
            schedule.update(n, g)
            ended = any(token in eos_ids for token in committed)
            tiers.append(tier)
            rounds.add(g, n, clock.finish(start + 1, g, n))
    if not timed:
        check_lengths(cache, len(tokens) - 1)
    result = rounds.result(tokens, len(prompt), eos_ids)
    return result, tuple(tiers)


@torch.no_grad()
def speculative_decode(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    mask: SkipMask,
    max_new_tokens: int,
    gamma: int | GammaPolicy = 3,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    head: DraftHead | None = None,
    kv: KVPattern | None = None,
    timed: bool = True,
) -> DecodeTrace:
    """Decode up to `max_new_tokens` after `prompt` with the draft `mask` (see module docstring).

    Lossless: greedy output equals `autoregressive_decode`'s token for token; sampled output
    follows the target's distribution under `sampling`. `gamma` is a fixed draft length or a
    dynamic policy; `head`, a draft vocabulary's head for the draft steps (verify keeps the full
    one); `kv`, the keys the draft steps attend to (verify attends to all). A policy with
    `stop_below` ends a round early after a draft token the draft is unsure of. `timed` records
    each round's phase breakdown, at the cost of device syncs (`run_rounds`).
    """
    mask.check_fits(runner.num_layers)
    policy = gamma if isinstance(gamma, GammaPolicy) else GammaPolicy.fixed(gamma)
    schedule = OneMask(GammaController(policy))
    steps = EagerSteps(runner, [mask], [head], [kv], policy.stop_below)
    result, _ = run_rounds(
        runner, prompt, max_new_tokens, steps, schedule, sampling, generator, eos_ids, timed
    )
    return result
