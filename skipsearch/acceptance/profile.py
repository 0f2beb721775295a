"""AcceptanceProfile and exact round simulation (docs/theory.md, "The round rule") — pure
arithmetic, no model.

The estimator produces, per prompt and per continuation position, whether the draft's argmax
equals the target's (greedy match) and the sampling acceptance `sum_x min(p(x), q(x))`. Because a
draft token that matches is exactly the token the target would have produced, the accepted
length of every speculative round for any draft length `gamma` follows from the match vector:
start at the prompt end, accept the run of matches up to `gamma`, emit one more token (the
target's correction or bonus), jump past it. A draft that stops when unsure (docs/theory.md, "The
confidence stop") drafts a round only up to its first position whose confidence is below τ, so
its rounds follow from the match vector and the confidence vector together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from skipsearch.masks import KVPattern, SkipMask, kv_label, vocab_label
from skipsearch.tree_shapes import DynamicTree, Tree, as_tree


def match_runs(matches: Sequence[bool]) -> np.ndarray:
    """`runs[k]`: consecutive matches from position `k` (0 at a mismatch), so a round is O(1)."""
    runs = np.zeros(len(matches) + 1, dtype=np.int64)
    for k in range(len(matches) - 1, -1, -1):
        runs[k] = runs[k + 1] + 1 if matches[k] else 0
    return runs[:-1]


def play_rounds(
    length: int, round_at: Callable[[int], tuple[int, int]]
) -> Iterator[tuple[int, int, int, bool]]:
    """(start, γ, accepted, censored) of every round over a continuation of `length` positions.

    The one round rule every replay of rounds follows (the estimator's simulation, the tier
    policy's, the engine's end-of-output rule): `round_at(k)` gives the round starting at `k` its
    draft length γ and the run of matches from `k` (`match_runs`); it accepts the leading `min(run,
    γ)` drafts and emits one more token, so the next round starts at `k + accepted + 1`. A round
    that accepted fewer than γ because the continuation ended is censored: its length is unknown.
    `round_at` is called when the round starts, after the previous one was consumed, so a policy
    may choose γ from how the rounds went so far.
    """
    k = 0
    while k < length:
        gamma, run = round_at(k)
        accepted = min(run, gamma)
        yield k, gamma, accepted, accepted < gamma and k + accepted >= length
        k += accepted + 1


def _walk(
    matches: Sequence[bool], gamma: int, confident: Sequence[bool] | None = None
) -> Iterator[tuple[int, int, int, bool]]:
    """(start, drafted, accepted, censored) of every round over one continuation (`play_rounds`):
    each drafts γ tokens, or with `confident` (per position, whether the draft's confidence there
    is at or above its stop threshold) up to and including its first unsure position."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    runs = match_runs(matches)
    sure = None if confident is None else match_runs(confident)

    def round_at(k: int) -> tuple[int, int]:
        drafted = gamma if sure is None else min(gamma, int(sure[k]) + 1)
        return drafted, int(runs[k])

    yield from play_rounds(len(matches), round_at)


def _walk_tree(
    ranks: Sequence[int], shape: Tree, probs: Sequence[Sequence[float]] = ()
) -> Iterator[tuple[int, int, int, bool]]:
    """(start, depth, accepted, censored) of every greedy round of the tree `shape` over one
    continuation (`play_rounds`): along the target's own path a round goes one depth further while
    the target's token ranks below that depth's width under the draft (`TreeShape.accepted_depth`),
    or, in a dynamic tree, while the draft's probabilities `probs` keep the path's node among the
    nodes it feeds or verifies (`DynamicTree.accepted_depth`); the accepted path's prefix is the
    target's, so its draft logits are the teacher-forced ones."""

    def round_at(k: int) -> tuple[int, int]:
        return shape.depth, shape.accepted_depth(ranks[k : k + shape.depth], probs[k : k + shape.depth])

    yield from play_rounds(len(ranks), round_at)


def simulate_rounds(
    matches: Sequence[bool], gamma: int, confident: Sequence[bool] | None = None
) -> list[int]:
    """Accepted draft tokens of each round over one continuation, in order (`_walk`); a censored
    last round is not counted."""
    return [accepted for _, _, accepted, censored in _walk(matches, gamma, confident) if not censored]


def round_starts(matches: Sequence[bool], gamma: int, confident: Sequence[bool] | None = None) -> list[int]:
    """For each position, where the draft's round began when it drafted from there (docs/theory.md,
    "The round rule").

    The rounds are those `simulate_rounds` walks: a round starting at `k` that drafts `d` tokens
    drafts from positions `k .. k + min(accepted + 1, d) - 1`, all of which get `k`. A position no
    draft reads (the one after a fully accepted round, whose token the verify emits) gets itself.
    The round-aware estimator lets a draft at `p` see its own K/V from `starts[p]` to `p` and the
    full model's before `starts[p]`, which is what the engine's draft sees.
    """
    return _starts(_walk(matches, gamma, confident), len(matches))


def tree_round_starts(ranks: Sequence[int], shape: Tree, probs: Sequence[Sequence[float]] = ()) -> list[int]:
    """`round_starts` of the greedy rounds of a token tree (`_walk_tree`): along the accepted path
    a tree's draft sees what a chain's does, its own K/V from the round's start (`engine.tree_rounds`)."""
    return _starts(_walk_tree(ranks, shape, probs), len(ranks))


def _starts(walk: Iterator[tuple[int, int, int, bool]], length: int) -> list[int]:
    starts = list(range(length))
    for k, drafted, accepted, _ in walk:
        for position in range(k, min(k + min(accepted + 1, drafted), length)):
            starts[position] = k
    return starts


def previous_round_starts(
    matches: Sequence[bool], gamma: int, confident: Sequence[bool] | None = None
) -> list[int]:
    """For each position a draft reads, where the round before its own began (-1 in the first
    round, and at a position no draft reads): the first position of the verify whose attention
    chose the pillars its draft reads (`kv.pillars`)."""
    previous, before = [-1] * len(matches), -1
    for k, drafted, accepted, _ in _walk(matches, gamma, confident):
        for position in range(k, min(k + min(accepted + 1, drafted), len(matches))):
            previous[position] = before
        before = k
    return previous


@dataclass(frozen=True)
class AcceptanceProfile:
    """Per-position acceptance of one mask on one prompt set (one row per prompt).

    `draft_vocab` is the draft vocabulary the draft proposed from (None: the full vocabulary).
    `by_vocab` holds the same mask measured with smaller draft vocabularies: one model forward
    gives the draft's logits, and every subset's acceptance follows from them exactly, so a search
    scores each mask at every vocabulary size of its space for the price of one evaluation.
    `kv` is the KV pattern the draft attended through (None: every key); `by_kv` holds the same
    mask measured under other patterns (one forward each), each with its own `by_vocab`.
    `greedy_confidence` is the draft's softmax maximum over its vocabulary at each position (empty
    in profiles from before it was measured): with it, the rounds of a draft that stops below a
    threshold follow too (`stop_below`). `target_rank` is the rank of the target's token under
    the draft at each position, capped at `tree_shapes.RANK_CAP` (empty in profiles from before it was
    measured): with it, the greedy rounds of any static token tree follow (`tree_played`).
    `top_probs` holds the draft's `tree_shapes.MAX_TOP` largest probabilities at each position (empty
    before they were measured): with the ranks, a dynamic tree's rounds follow (`tree_played`).
    """

    mask: str
    greedy_match: tuple[tuple[bool, ...], ...]
    sampling_accept: tuple[tuple[float, ...], ...]
    temperature: float
    draft_vocab: int | None = None
    by_vocab: tuple[AcceptanceProfile, ...] = ()
    kv: KVPattern | None = None
    by_kv: tuple[AcceptanceProfile, ...] = ()
    greedy_confidence: tuple[tuple[float, ...], ...] = ()
    target_rank: tuple[tuple[int, ...], ...] = ()
    top_probs: tuple[tuple[tuple[float, ...], ...], ...] = ()
    _rounds: dict[tuple[int, float], list[tuple[int, int]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def variants(self) -> tuple[AcceptanceProfile, ...]:
        """This profile and every variant of it: each draft vocabulary under each KV pattern."""
        return (self, *self.by_vocab, *(variant for pattern in self.by_kv for variant in pattern.variants))

    def for_vocab(self, draft_vocab: int | None, kv: KVPattern | None = None) -> AcceptanceProfile:
        """The variant measured with `draft_vocab` (None: full) under `kv` (None: every key), or a
        KeyError naming what exists."""
        for variant in self.variants:
            if variant.draft_vocab == draft_vocab and variant.kv == kv:
                return variant
        have = ", ".join(_variant_label(v.draft_vocab, v.kv) for v in self.variants)
        wanted = _variant_label(draft_vocab, kv)
        raise KeyError(f"no profile for draft vocabulary {wanted} (measured: {have})")

    @property
    def n_positions(self) -> int:
        return sum(len(row) for row in self.greedy_match)

    @property
    def alpha(self) -> float:
        """Greedy acceptance: share of positions where the draft's argmax is the target's."""
        return float(np.mean(np.concatenate([np.asarray(r, dtype=float) for r in self.greedy_match])))

    @property
    def sampling_acceptance(self) -> float:
        """Mean `sum_x min(p, q)`: the probability a sampled draft token is accepted."""
        return float(np.mean(np.concatenate([np.asarray(r, dtype=float) for r in self.sampling_accept])))

    def played(self, gamma: int, stop_below: float = 0.0) -> list[tuple[int, int]]:
        """(drafted, accepted) of every simulated round over all prompts, at most `gamma` drafts a
        round and, with `stop_below`, none after a position whose confidence is below it (cached)."""
        key = (gamma, stop_below)
        if key not in self._rounds:
            if stop_below and not self.greedy_confidence:
                raise ValueError(
                    f"the profile of {self.mask} holds no draft confidences, which a stop at {stop_below} "
                    "needs: measure it again"
                )
            confident = (
                [[c >= stop_below for c in row] for row in self.greedy_confidence]
                if stop_below
                else [None] * len(self.greedy_match)
            )
            self._rounds[key] = [
                (drafted, accepted)
                for row, sure in zip(self.greedy_match, confident, strict=True)
                for _, drafted, accepted, censored in _walk(row, gamma, sure)
                if not censored
            ]
        return self._rounds[key]

    def tree_played(self, shape: Tree) -> list[tuple[int, int]]:
        """(depth, accepted) of every simulated greedy round of the tree `shape` over all prompts
        (`_walk_tree`); a chain-shaped tree plays the chain's rounds (`played`)."""
        if as_tree(shape) is None:
            return self.played(shape.depth)
        if not self.target_rank:
            raise ValueError(
                f"the profile of {self.mask} holds no target ranks, which the tree {shape} needs: "
                "measure it again"
            )
        dynamic = isinstance(shape, DynamicTree)
        if dynamic and not self.top_probs:
            raise ValueError(
                f"the profile of {self.mask} holds no draft probabilities, which the dynamic tree {shape} "
                "needs: measure it again"
            )
        key = (-1, str(shape))  # never a chain's key: those have gamma >= 1
        if key not in self._rounds:
            probs = self.top_probs if dynamic else [()] * len(self.target_rank)
            self._rounds[key] = [
                (depth, accepted)
                for row, row_probs in zip(self.target_rank, probs, strict=True)
                for _, depth, accepted, censored in _walk_tree(row, shape, row_probs)
                if not censored
            ]
        return self._rounds[key]

    def tree_tokens_per_round(self, shape: Tree) -> float:
        """Mean tokens committed per round of the tree `shape` (`tree_played`)."""
        played = self.tree_played(shape)
        return float(np.mean([accepted for _, accepted in played])) + 1.0 if played else 1.0

    def top_k_hit_rate(self, k: int) -> float:
        """Share of positions where the target's token is among the draft's top `k`."""
        ranks = np.concatenate([np.asarray(row) for row in self.target_rank]) if self.target_rank else None
        if ranks is None:
            raise ValueError(f"the profile of {self.mask} holds no target ranks: measure it again")
        return float(np.mean(ranks < k))

    def rounds(self, gamma: int, stop_below: float = 0.0) -> list[int]:
        """Accepted lengths of every simulated round over all prompts (`played`)."""
        return [accepted for _, accepted in self.played(gamma, stop_below)]

    def tokens_per_round(self, gamma: int, stop_below: float = 0.0) -> float:
        """Mean tokens committed per round (accepted + the target's one), measured by simulation."""
        rounds = self.rounds(gamma, stop_below)
        if not rounds:
            return 1.0
        return float(np.mean(rounds)) + 1.0

    def drafts_per_round(self, gamma: int, stop_below: float = 0.0) -> float:
        """Mean draft tokens a round makes: γ, or fewer with a stop."""
        played = self.played(gamma, stop_below)
        return float(np.mean([drafted for drafted, _ in played])) if played else float(gamma)

    def alpha_by_depth(self, gamma: int) -> list[float]:
        """`alpha_j`: among rounds that reached draft position j, the share that accepted it."""
        rounds = np.asarray(self.rounds(gamma))
        alphas: list[float] = []
        for depth in range(1, gamma + 1):
            reached = rounds >= depth - 1
            alphas.append(float(np.mean(rounds[reached] >= depth)) if reached.any() else 0.0)
        return alphas

    def summary(self, gamma_max: int = 8) -> dict:
        """JSON-ready numbers: alpha, sampling acceptance, tokens per round per gamma, alpha_j."""
        return {
            "mask": self.mask,
            "draft_vocab": vocab_label(self.draft_vocab),
            "kv": kv_label(self.kv),
            "alpha": self.alpha,
            "sampling_acceptance": self.sampling_acceptance,
            "temperature": self.temperature,
            "n_positions": self.n_positions,
            "tokens_per_round": {g: self.tokens_per_round(g) for g in range(1, gamma_max + 1)},
            "alpha_by_depth": self.alpha_by_depth(gamma_max),
        }

    def to_dict(self) -> dict:
        data: dict = {
            "mask": self.mask,
            "temperature": self.temperature,
            "greedy_match": [[int(m) for m in row] for row in self.greedy_match],
            "sampling_accept": [[round(float(a), 6) for a in row] for row in self.sampling_accept],
        }
        if self.draft_vocab is not None:
            data["draft_vocab"] = self.draft_vocab
        if self.by_vocab:
            data["by_vocab"] = [variant.to_dict() for variant in self.by_vocab]
        if self.kv is not None:
            data["kv"] = str(self.kv)
        if self.by_kv:
            data["by_kv"] = [pattern.to_dict() for pattern in self.by_kv]
        if self.greedy_confidence:
            data["greedy_confidence"] = [[round(float(c), 6) for c in row] for row in self.greedy_confidence]
        if self.target_rank:
            data["target_rank"] = [[int(r) for r in row] for row in self.target_rank]
        if self.top_probs:
            data["top_probs"] = [[[round(float(p), 5) for p in top] for top in row] for row in self.top_probs]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> AcceptanceProfile:
        """Reads profiles written before draft vocabularies, KV patterns, confidences or ranks
        existed too (full vocabulary, every key, no variants, no confidences, no ranks)."""
        return cls(
            mask=data["mask"],
            greedy_match=tuple(tuple(bool(m) for m in row) for row in data["greedy_match"]),
            sampling_accept=tuple(tuple(float(a) for a in row) for row in data["sampling_accept"]),
            temperature=float(data["temperature"]),
            draft_vocab=data.get("draft_vocab"),
            by_vocab=tuple(cls.from_dict(variant) for variant in data.get("by_vocab", ())),
            kv=KVPattern.parse(data.get("kv")),
            by_kv=tuple(cls.from_dict(pattern) for pattern in data.get("by_kv", ())),
            greedy_confidence=tuple(
                tuple(float(c) for c in row) for row in data.get("greedy_confidence", ())
            ),
            target_rank=tuple(tuple(int(r) for r in row) for row in data.get("target_rank", ())),
            top_probs=tuple(
                tuple(tuple(float(p) for p in top) for top in row) for row in data.get("top_probs", ())
            ),
        )


def _variant_label(draft_vocab: int | None, kv: KVPattern | None) -> str:
    """`16384`, or `16384|kv:s4w1024` under a KV pattern."""
    return str(vocab_label(draft_vocab)) if kv is None else f"{vocab_label(draft_vocab)}|kv:{kv}"


Evaluator = Callable[[SkipMask], AcceptanceProfile]
"""Measures one mask on the prompt set (the only expensive step of a search): its full-vocabulary
profile, with one variant per draft-vocabulary size the measurement asks for."""
