"""The interface of the round loop and a chain's side of it.

The interface (`engine.ssd.run_rounds` plays it; its docstring states what a draft and a verify
may assume of the cache): `Round`, where a round starts; `RoundSteps`, the passes that draft a
`Proposal` and verify it; `Proposal`, what was drafted, with the accept and the rollback of its
shape. Token trees implement the same three (`engine.tree_rounds`, `engine.graphed_tree`).

A chain's side: its proposal (`ChainProposal`: `sampling.greedy_commit` or `sampling.sample_accept`,
then a crop), the draft and verify functions shared by the eager path and the captured graphs
(`engine.graphs`), and `EagerSteps`, the reference implementation over a DynamicCache, a KV
pattern's pillars included.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from skipsearch.acceptance.statistics import greedy_confidence
from skipsearch.engine.sampling import Sampling, greedy_commit, sample, sample_accept
from skipsearch.engine.shared_kv import crop
from skipsearch.kv.pillars import PillarChoice, PillarKeys
from skipsearch.kv.tree_keys import TreeKeys
from skipsearch.masks import LOW_BITS, KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner


class Proposal(Protocol):
    """What a round drafted — a chain (`ChainProposal`) or a token tree (`tree_rounds.TreeProposal`) —
    with the accept and the rollback of its shape, which `ssd.settle` runs after the verify."""

    @property
    def length(self) -> int:
        """γ of the round: a chain's draft tokens, a tree's depth (the schedule is told it)."""

    def accept(
        self, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
    ) -> tuple[Sequence[int], list[int], torch.Tensor]:
        """Step 3 over the verify's logits `[rows, V]`: the accepted path (the nodes whose tokens
        are committed, `n` of them), the `n + 1` committed tokens, and the last of them `[1, 1]` on
        the device: the next round's pending token."""

    def roll_back(self, cache: Any, start: int, path: Sequence[int]) -> None:
        """Step 4: leave the cache holding the committed tokens but the pending one (positions
        `0 .. start + n`), the accepted `path`'s K/V at the positions after `start`."""


@dataclass(frozen=True)
class ChainProposal:
    """γ draft tokens `[γ]`, the draft's distributions `q` `[γ, V]` (sampling only) and its exact
    states.

    `exact[j]` `[1, 1, d]` is the draft's residual stream where it last equals the full model's
    for the input at draft step j: the input of layer `s1`, or — when the MLP of layer `s1 - 1`
    is skipped or at lower precision — the output of that layer's attention, which verify
    completes with the full MLP.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    exact: list[torch.Tensor]

    @property
    def length(self) -> int:
        return len(self.tokens)  # a draft that stops early proposes fewer than the round asked

    def accept(
        self, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
    ) -> tuple[range, list[int], torch.Tensor]:
        """Greedy reads the device once (`greedy_commit`) and leaves the pending token there;
        sampling reads what `sample_accept` reads and the accepted drafts, and copies the extra
        token back. The path is the draft positions `1 .. n`, already in place."""
        if sampling.greedy:
            committed, pending = greedy_commit(self.tokens, logits)
        else:
            n, extra = sample_accept(self.tokens, self.probs, sampling.probs(logits), generator)
            committed = [*self.tokens[:n].tolist(), extra]
            pending = torch.tensor([[extra]], device=logits.device)
        return range(1, len(committed)), committed, pending

    def roll_back(self, cache: Any, start: int, path: Sequence[int]) -> None:
        """A crop of every layer: the accepted drafts' K/V already sits after `start`."""
        crop(cache, start + len(path) + 1)


def positions(start: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + count, device=device)[None]


def divergent_layer(mask: SkipMask, kv: KVPattern | None) -> int:
    """`s1` of a draft: the mask's first divergent layer, or 0 under a KV pattern, whose first
    attention already reads fewer keys (so no layer's output, and no K/V past layer 0's, is the
    full model's; layer 0's K/V is recomputed by verify for simplicity)."""
    return 0 if kv is not None else mask.first_divergent_layer


@functools.cache
def _without_mlp(num_layers: int, layer: int) -> SkipMask:
    return SkipMask(num_layers, mlp=[layer])


def exact_part(mask: SkipMask, s1: int) -> SkipMask:
    """The mask the draft runs layers `[0, s1)` under: the full model's, but for the MLP of layer
    `s1 - 1` where `mask` skips it or runs it at lower precision (then skipped), so that what those
    layers leave is the draft's exact state (`ChainProposal.exact`)."""
    if s1 == 0 or mask.exact_mlp(s1 - 1):
        return mask  # no sub-layer below s1 is changed
    return _without_mlp(mask.num_layers, s1 - 1)


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
    keys its attention reads (None: all). The exact part stops before the MLP of layer `s1 - 1`
    where the draft changes it (`exact_part`); a lower-precision MLP there then runs on the exact state."""
    s1 = divergent_layer(mask, kv)
    embedded = runner.embed(token)
    hidden = runner.run_layers(embedded, 0, s1, position, exact_part(mask, s1), cache, attention_mask)
    last = hidden
    if s1 and mask.mlp_bits(s1 - 1) in LOW_BITS:
        last = runner.mlp(s1 - 1, hidden, mask.mlp_bits(s1 - 1))
    last = runner.run_layers(last, s1, runner.num_layers, position, mask, cache, attention_mask, kv=kv)
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
    attention_mask: torch.Tensor | TreeKeys | None = None,
    kv: KVPattern | None = None,
    pillars: PillarChoice | None = None,
) -> torch.Tensor:
    """Full-model logits `[γ + T, V]` over `block_positions` `[1, γ + T]`, reusing the draft's work.

    `exact` `[b, γ, d]`: the exact states of the γ positions the draft fed (None or empty when γ =
    0); `last` `[b, T]`: the tokens it never fed, at the block's last T positions — a chain's last
    draft token (the pending token when γ = 0), or a token tree's leaves (`engine.tree_rounds`, whose
    `attention_mask` may be its `TreeKeys`). Layers `< s1` run only for `last`; the exact states
    are completed with the full MLP of layer `s1 - 1` when the draft skipped it or ran it at lower
    precision; layers `>= s1` run for
    the whole block. Shared by `verify`, `engine.graphs`, `engine.tree_rounds` and `engine.graphed_tree`.
    `pillars` records the next round's pillars from the block's first position (a KV pattern's `s1`
    is 0, so every layer runs the whole block).
    """
    s1, gamma = divergent_layer(mask, kv), 0 if exact is None else exact.shape[1]
    if isinstance(attention_mask, TreeKeys):
        tail_mask: torch.Tensor | TreeKeys | None = attention_mask.rows_from(gamma)
    else:
        tail_mask = None if attention_mask is None else attention_mask[:, :, gamma:]
    tail_position = block_positions[:, gamma:]
    tail = runner.run_layers(runner.embed(last), 0, s1, tail_position, cache=cache, attention_mask=tail_mask)
    if exact is None:
        hidden = tail
    else:
        if gamma and s1 > 0 and not mask.exact_mlp(s1 - 1):
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
) -> ChainProposal:
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
            return ChainProposal(tokens[:drafted], None if probs is None else probs[:drafted], exact)
    return ChainProposal(tokens, probs, exact)


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
    proposal: ChainProposal,
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


@dataclass(frozen=True)
class Round:
    """Where a round starts: the index of its mask (its tier), the shared cache, the pending token
    `pending` `[1, 1]` (on the device, at position `start`; the cache holds `0 .. start - 1`) and
    γ, the draft length the round asks for: a chain's draft tokens, a tree's depth (0: no draft,
    one full-model step of the pending token)."""

    tier: int
    cache: Any
    pending: torch.Tensor
    start: int
    gamma: int


class RoundSteps(Protocol):
    """The forward passes of a decode's rounds: a chain's (`EagerSteps`, `graphs.GraphSteps`) or a
    token tree's (`tree_rounds.EagerTreeSteps`, `graphed_tree.TreeGraphSteps`). `s1[t]` is tier
    `t`'s first divergent layer (`divergent_layer`): the loop crops the draft's scratch K/V of the
    layers from it before the verify. `mode` says how the passes run (for logs and reports)."""

    mode: str
    s1: tuple[int, ...]

    def prefill(self, prompt: Sequence[int]) -> Any:
        """A cache holding the prompt's K/V except the last token's (see `engine.shared_kv`)."""

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        """Step 1: up to `at.gamma` draft tokens (a chain) or depths (a tree) with mask `at.tier`
        from `at.pending`, their K/V written into `at.cache` from slot `at.start`."""

    def verify(self, at: Round, proposal: Proposal) -> torch.Tensor:
        """Step 2: full-model logits `[rows, V]` of the round, row `i` after the `i`-th token verified
        (a chain: `[γ + 1, V]`, the pending token and the drafts; a tree: `[N + 1, V]`, the root and
        its nodes)."""


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
        self.s1 = tuple(divergent_layer(mask, kv) for mask, kv in zip(self.masks, self.kvs, strict=True))
        for mask in self.masks:
            runner.prepare(mask)  # a lower-precision draft's weights, refused here if they do not fit
        self.pillars: list[torch.Tensor | None] = []  # per layer, from the last verify

    def prefill(self, prompt: Sequence[int]) -> Any:
        self.pillars = []
        return self.runner.prefill(prompt)

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> ChainProposal:
        mask, head, kv = self.masks[at.tier], self.heads[at.tier], self.kvs[at.tier]
        reads: KVPattern | PillarKeys | None = kv
        if kv is not None and kv.pillars and any(p is not None for p in self.pillars):
            reads = PillarKeys.gather(kv, self.pillars, at.cache)
        return draft(
            self.runner, mask, at.cache, at.pending, at.start, at.gamma, sampling, generator, head, reads,
            self.stop_below,
        )  # fmt: skip

    def verify(self, at: Round, proposal: ChainProposal) -> torch.Tensor:
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
