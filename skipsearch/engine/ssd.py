"""Self-speculative decoding with any SkipMask on one shared KV cache (docs/theory.md, "The engine:
ground truth"), batch size 1.

A round starts with `n` committed tokens; the cache holds positions `0 .. n-2` in every layer
and the last token `t` (position `n-1`) is pending (see `engine.cache`).

1. Draft: γ autoregressive steps of the masked model from `t`, writing K/V into the shared cache
   (fewer when the policy stops a round after a draft token the draft itself is unsure of).
   Layers below `s1` (the mask's first divergent layer) run exactly as in the full model, so
   their K/V — and the draft's residual stream at `s1` — are exact; K/V the draft writes in layers
   `>= s1` are scratch.
2. Verify: the full model over the γ + 1 positions `n-1 .. n-1+γ` (`t` and the γ drafts). The
   exact K/V below `s1` is reused: layers `< s1` run only for the last draft token, which the
   draft never fed; layers `>= s1` run for all γ + 1 positions from the draft's exact states,
   after cropping their scratch K/V back to `n - 1`.
3. Accept: greedy (argmax equality) or rejection sampling; `k` drafts plus one target token are
   committed, so every output token is the target's.
4. Rollback: crop every layer to the new committed length - 1 and check the invariant (after
   every round when the rounds are timed, else once after the last: `run_rounds`).

A round with γ = 0 is one plain autoregressive step; the γ controller uses it once speculation
is switched off, and the last round uses a smaller γ so the output never overshoots.

`run_rounds` plays the rounds for any schedule of masks and any implementation of the passes:
`speculative_decode` drafts every round with one mask, `engine.tiered` picks a mask per round, and
`engine.graphs` replays the same passes from CUDA graphs.

Host reads: an untimed greedy round reads the device once — the accepted count together with the
committed tokens (`sampling.greedy_commit`) — and its pending token stays on the device, so a GPU
queues the next round's kernels (or CUDA-graph replays) without waiting. Reads that remain by
design: a sampled round's in `sample_accept`, a draft that stops when unsure reads its confidence
after every draft token (`confidence`), and a timed round syncs at every phase boundary
(`RoundClock`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from skipsearch.acceptance.estimator import greedy_confidence
from skipsearch.engine.cache import check_lengths, crop
from skipsearch.engine.gamma import GammaController, GammaPolicy
from skipsearch.engine.result import DecodeResult, new_tokens
from skipsearch.engine.sampling import GREEDY, Sampling, greedy_commit, sample, sample_accept
from skipsearch.engine.timing import RoundClock, RoundTiming
from skipsearch.errors import ConfigError
from skipsearch.kv.pillars import PillarChoice, PillarKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.plan import engaged
from skipsearch.models.runner import LayerwiseRunner


@dataclass(frozen=True)
class Proposal:
    """γ draft tokens, the draft's distributions `q` (sampling only) and its exact states.

    `exact[j]` `[1, 1, d]` is the draft's residual stream where it last equals the full model's
    for the input at draft step j: the input of layer `s1`, or — when the MLP of layer `s1 - 1`
    is skipped — the output of that layer's attention, which verify completes with the MLP.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    exact: list[torch.Tensor]


def positions(start: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + count, device=device)[None]


def divergent_layer(mask: SkipMask, kv: KVPattern | None) -> int:
    """`s1` of a draft: the mask's first divergent layer, or 0 under a KV pattern, whose first
    attention already reads fewer keys (so no layer's output, and no K/V past layer 0's, is the
    full model's; layer 0's K/V is recomputed by verify for simplicity)."""
    return 0 if kv is not None else mask.first_divergent_layer


def draft_forward(
    runner: LayerwiseRunner,
    mask: SkipMask,
    token: torch.Tensor,
    position: torch.Tensor,
    cache: Any,
    head: DraftHead | None = None,
    attention_mask: torch.Tensor | None = None,
    kv: KVPattern | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft position of the masked model: (its exact state at `s1`, logits `[b, 1, V or k]`).

    The forward pass of a draft step, shared by the eager path and the captured graphs
    (`engine.graphs`); `head` is a draft vocabulary's head (None: the full LM head), `kv` the
    keys its attention reads (None: all)."""
    s1 = divergent_layer(mask, kv)
    hidden = runner.run_layers(runner.embed(token), 0, s1, position, mask, cache, attention_mask)
    last = runner.run_layers(hidden, s1, runner.num_layers, position, mask, cache, attention_mask, kv=kv)
    return hidden, (runner.head if head is None else head)(last)


def propose(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None, head: DraftHead | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft token for one step's logits `[V or k]`, and `q` over the full vocabulary (sampling).

    With a draft `head`, greedy proposes the subset's argmax; sampling draws from `q` over the
    subset, recorded over the full vocabulary with zeros outside it, so the residual
    `max(0, p - q)` covers every other token."""
    if sampling.greedy:
        choice, q = logits.argmax(), None
    else:
        q = sampling.probs(logits)
        choice = sample(q, generator)[0]
    if head is None:
        return choice, q
    return head.token(choice), None if q is None else head.scatter(q)


def verify_forward(
    runner: LayerwiseRunner,
    mask: SkipMask,
    exact: torch.Tensor | None,
    last: torch.Tensor,
    block_positions: torch.Tensor,
    cache: Any,
    attention_mask: torch.Tensor | None = None,
    kv: KVPattern | None = None,
    pillars: PillarChoice | None = None,
) -> torch.Tensor:
    """Full-model logits `[γ + 1, V]` over `block_positions` `[1, γ + 1]`, reusing the draft's work.

    `exact` `[b, γ, d]`: the drafts' exact states (None or empty when γ = 0); `last` `[b, 1]`: the
    last draft token (the pending token when γ = 0), which the draft never fed. Layers `< s1` run
    only for `last`; the exact states are completed with the MLP of layer `s1 - 1` when the draft
    skipped it; layers `>= s1` run for all γ + 1 positions. Shared by `verify` and `engine.graphs`.
    `pillars` records the next round's pillars from the block's first position (a KV pattern's
    `s1` is 0, so every layer runs the whole block).
    """
    s1, gamma = divergent_layer(mask, kv), 0 if exact is None else exact.shape[1]
    tail_mask = None if attention_mask is None else attention_mask[:, :, gamma : gamma + 1]
    tail_position = block_positions[:, gamma : gamma + 1]
    tail = runner.run_layers(runner.embed(last), 0, s1, tail_position, cache=cache, attention_mask=tail_mask)
    if exact is None:
        hidden = tail
    else:
        if gamma and s1 > 0 and not mask.runs_mlp(s1 - 1):
            exact = runner.mlp(s1 - 1, exact)
        hidden = torch.cat([exact, tail], dim=1)
    hidden = runner.run_layers(
        hidden,
        s1,
        runner.num_layers,
        block_positions,
        cache=cache,
        attention_mask=attention_mask,
        pillars=pillars,
    )
    return runner.head(hidden)[0]


def draft(
    runner: LayerwiseRunner,
    mask: SkipMask,
    cache: DynamicCache,
    pending: torch.Tensor,
    start: int,
    gamma: int,
    sampling: Sampling,
    generator: torch.Generator | None,
    head: DraftHead | None = None,
    kv: KVPattern | PillarKeys | None = None,
    stop_below: float = 0.0,
) -> Proposal:
    """Up to γ steps of the masked model from `pending` `[1, 1]` at position `start`
    (`draft_forward`, `propose`); `kv`, the keys they attend to (with the round's pillars,
    `PillarKeys`). The draft stops after a token whose probability under the draft is below
    `stop_below` (`confidence`); that token is still proposed. The stop reads the confidence back
    to the host after every draft token, so only a draft with a stop syncs within the draft."""
    device = runner.device
    tokens = torch.empty(gamma, dtype=torch.long, device=device)
    probs = None if sampling.greedy else torch.empty(gamma, runner.config.vocab_size, device=device)
    exact: list[torch.Tensor] = []
    token = pending
    for step in range(gamma):
        at = positions(start + step, 1, device)
        hidden, logits = draft_forward(runner, mask, token, at, cache, head, kv=kv)
        exact.append(hidden)
        tokens[step], q = propose(logits[0, -1], sampling, generator, head)
        if probs is not None:
            probs[step] = q
        token = tokens[step].view(1, 1)
        if stop_below and confidence(logits[0, -1], q, tokens[step]) < stop_below:
            drafted = step + 1
            return Proposal(tokens[:drafted], None if probs is None else probs[:drafted], exact)
    return Proposal(tokens, probs, exact)


def confidence(logits: torch.Tensor, q: torch.Tensor | None, token: torch.Tensor) -> float:
    """The draft's probability of the token it proposed: its softmax maximum over its own
    vocabulary (greedy), or `q` of the sampled token. A function of the draft alone, so a round
    that stops on it keeps greedy and sampled output lossless: the verify judges whatever was
    drafted, and the stop is a stopping time of the draft's own choices."""
    if q is not None:
        return float(q[token])
    return float(greedy_confidence(logits))  # the estimator's own formula: both stop alike


def verify(
    runner: LayerwiseRunner,
    mask: SkipMask,
    cache: DynamicCache,
    proposal: Proposal,
    pending: torch.Tensor,
    start: int,
    kv: KVPattern | None = None,
    pillars: PillarChoice | None = None,
) -> torch.Tensor:
    """Full-model logits `[γ + 1, V]` at positions `start .. start + γ` (`verify_forward`), and
    the next round's pillars into `pillars` when given.

    Expects layers `>= s1` cropped to `start` and layers `< s1` holding the draft's K/V up to
    `start + γ - 1`.
    """
    gamma = len(proposal.tokens)
    last = proposal.tokens[-1:].view(1, 1) if gamma else pending
    exact = torch.cat(proposal.exact, dim=1) if proposal.exact else None
    block = positions(start, gamma + 1, runner.device)
    return verify_forward(runner, mask, exact, last, block, cache, kv=kv, pillars=pillars)


def settle(
    cache: DynamicCache,
    tokens: list[int],
    proposal: Proposal,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    clock: RoundClock,
) -> tuple[int, list[int], torch.Tensor]:
    """Steps 3 and 4 of a round: accept, append the committed tokens to `tokens`, roll back.

    Returns the accepted draft count `n`, the `n + 1` tokens committed, and the last of them
    `[1, 1]` on the device: the next round's pending token. Greedy reads the device once
    (`greedy_commit`); sampling reads what `sample_accept` reads and the accepted drafts, and copies
    the extra token back. The invariant is checked here only in a timed round (`run_rounds`).
    """
    with clock.phase("sample"):
        if sampling.greedy:
            committed, pending = greedy_commit(proposal.tokens, logits)
        else:
            p = sampling.probs(logits)
            n, extra = sample_accept(proposal.tokens, proposal.probs, p, generator)
            committed = [*proposal.tokens[:n].tolist(), extra]
            pending = torch.tensor([[extra]], device=logits.device)
    tokens += committed
    with clock.phase("cache"):
        crop(cache, len(tokens) - 1)
        if clock.timed:
            check_lengths(cache, len(tokens) - 1)
    return len(committed) - 1, committed, pending


@dataclass(frozen=True)
class Round:
    """Where a round starts: the index of its mask, the shared cache, the pending token (`[1, 1]`,
    at position `start`) and how many tokens it drafts."""

    tier: int
    cache: Any
    pending: torch.Tensor
    start: int
    gamma: int


class RoundSteps(Protocol):
    """The forward passes of a decode over `masks` (and their KV patterns, `kvs`); `mode` says how
    they run (for logs and reports)."""

    mode: str
    masks: tuple[SkipMask, ...]
    kvs: tuple[KVPattern | None, ...]

    def prefill(self, prompt: Sequence[int]) -> Any:
        """A cache holding the prompt's K/V except the last token's (see `engine.cache`)."""

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        """`at.gamma` draft tokens with mask `at.tier` (`draft`)."""

    def verify(self, at: Round, proposal: Proposal) -> torch.Tensor:
        """Full-model logits `[γ + 1, V]` of the round (`verify`)."""


class EagerSteps:
    """`draft` and `verify` with the round's mask over a DynamicCache: the reference path.

    `heads[i]` is mask `i`'s draft head (None: the full LM head), `kvs[i]` its KV pattern (None:
    every key); `stop_below`, the draft's stop threshold (`draft`). A pattern with pillars drafts
    over the pillars the previous verify chose (`kv.pillars`): each verify of such a round
    records them, each draft gathers them once; a prefill forgets them, so a decode's first round
    drafts without."""

    mode = "eager"

    def __init__(
        self,
        runner: LayerwiseRunner,
        masks: Sequence[SkipMask],
        heads: Sequence[DraftHead | None] | None = None,
        kvs: Sequence[KVPattern | None] | None = None,
        stop_below: float = 0.0,
    ) -> None:
        self.runner, self.masks, self.stop_below = runner, tuple(masks), stop_below
        self.heads = tuple(heads) if heads is not None else (None,) * len(self.masks)
        self.kvs = tuple(kvs) if kvs is not None else (None,) * len(self.masks)
        self.pillars: list[torch.Tensor | None] = []  # per layer, from the last verify

    def prefill(self, prompt: Sequence[int]) -> Any:
        self.pillars = []
        return self.runner.prefill(prompt)

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        mask, head, kv = self.masks[at.tier], self.heads[at.tier], self.kvs[at.tier]
        reads: KVPattern | PillarKeys | None = kv
        if kv is not None and kv.pillars and any(p is not None for p in self.pillars):
            reads = PillarKeys.gather(kv, self.pillars, at.cache)
        return draft(
            self.runner, mask, at.cache, at.pending, at.start, at.gamma, sampling, generator, head, reads,
            self.stop_below,
        )  # fmt: skip

    def verify(self, at: Round, proposal: Proposal) -> torch.Tensor:
        kv = self.kvs[at.tier]
        choice = None
        if kv is not None and kv.pillars:
            source = positions(at.start, 1, self.runner.device)
            choice = PillarChoice(kv, source, self.runner.num_layers, self.runner.config.num_key_value_heads)
        logits = verify(
            self.runner, self.masks[at.tier], at.cache, proposal, at.pending, at.start, kv, choice
        )
        self.pillars = [] if choice is None else choice.first_rows()
        return logits


class Schedule(Protocol):
    """Which mask and how many drafts the next round uses, told how each round went."""

    def next_round(self) -> tuple[int, int]:
        """(index of the mask, draft length) before the output's end clips it."""

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
) -> tuple[DecodeResult, tuple[int, ...]]:
    """The round loop of the module docstring; returns the result and each round's mask index.

    Every round starts from a cache that holds exactly the full model's K/V, so the schedule may
    switch masks between rounds at no cost: no state of one mask's draft survives into the next.

    `timed` records every round's phase breakdown (`RoundClock`) and checks the cache invariant
    after the prefill and every round, at the cost of device syncs; untimed, the invariant is
    checked once, after the last round (a static cache's lengths cost a read), and
    `DecodeResult.timings` is empty. Either way the device is synchronised once after the prefill,
    so `prefill_seconds` is the prefill's device time.
    """
    if max_new_tokens < 1 or not prompt:
        raise ConfigError(f"need a non-empty prompt and max_new_tokens >= 1, got {max_new_tokens}")
    began = time.perf_counter()
    clock = RoundClock(runner.device, timed)
    cache = steps.prefill(prompt)
    device_sync(runner.device)()
    prefilled = time.perf_counter()
    tokens = list(prompt)
    if timed:
        check_lengths(cache, len(tokens) - 1)
    pending = torch.tensor([[tokens[-1]]], device=runner.device)
    tiers: list[int] = []
    gammas: list[int] = []
    accepted: list[int] = []
    timings: list[RoundTiming] = []
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
            g = len(proposal.tokens)  # a draft may stop early
            with clock.phase("cache"):
                s1 = divergent_layer(steps.masks[tier], steps.kvs[tier])
                crop(cache, start, range(s1, runner.num_layers))
            with clock.phase("verify"):
                logits = steps.verify(at, proposal)
            n, committed, pending = settle(cache, tokens, proposal, logits, sampling, generator, clock)
            schedule.update(n, g)
            ended = any(token in eos_ids for token in committed)
            tiers.append(tier)
            gammas.append(g)
            accepted.append(n)
            timing = clock.finish(start + 1, g, n)
            if timing is not None:
                timings.append(timing)
    if not timed:
        check_lengths(cache, len(tokens) - 1)
    result = DecodeResult(
        prompt_length=len(prompt),
        tokens=new_tokens(tokens, len(prompt), eos_ids),
        seconds=time.perf_counter() - began,
        gammas=tuple(gammas),
        accepted=tuple(accepted),
        timings=tuple(timings),
        prefill_seconds=prefilled - began,
    )
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
) -> DecodeResult:
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
