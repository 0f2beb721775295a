"""The estimator's rounds next to the engine's, on the text both decode.

The estimator scores teacher-forced positions of the reference continuation; the engine decodes
its own text, rounds cut by its end-of-output rule. To compare like with like, `replay` plays
the estimator's match vector under the engine's rule (`acceptance.profile.play_rounds`), and
`shared_length` / `engine_rounds_within` / `replay_within` limit both to the text they share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from skipsearch.acceptance.profile import AcceptanceProfile, match_runs, play_rounds
from skipsearch.engine.result import DecodeTrace, judged_tokens


def replay(matches: Sequence[bool], gamma: int, max_new_tokens: int) -> list[tuple[int, int]]:
    """(γ used, drafts accepted) of every round the engine would run on this match vector.

    The engine's rule, not the estimator's: the last rounds shrink γ so the output never exceeds
    `max_new_tokens` (a γ = 0 round is a plain step), and nothing is censored.
    """
    runs = match_runs(matches)

    def round_at(k: int) -> tuple[int, int]:
        return max(min(gamma, max_new_tokens - k - 1), 0), int(runs[k])

    return [(g, n) for _, g, n, _ in play_rounds(len(matches), round_at)]


def shared_length(tokens: Sequence[int], continuation: Sequence[int]) -> int:
    """How many tokens the SSD output shares with the reference continuation before they part.

    In bf16 a verify over γ + 1 positions and a one-position step round differently, so at a
    numerical near-tie the SSD output may take the other token (`bench.lossless` allows it), and
    from there on the engine decodes a different text than the one the estimator teacher-forces:
    comparing the two past that point compares two texts, not two predictions of one.
    """
    length = min(len(tokens), len(continuation))
    return next((i for i in range(length) if tokens[i] != continuation[i]), length)


def engine_rounds_within(result: DecodeTrace, limit: int) -> tuple[list[tuple[int, int]], int]:
    """(γ, accepted) of the engine's rounds whose every token lies in the first `limit` tokens of its
    output, and how many tokens those rounds produced."""
    rounds, produced = [], 0
    for gamma, accepted in zip(result.gammas, result.accepted, strict=True):
        if produced + accepted + 1 > limit:
            break
        rounds.append((gamma, accepted))
        produced += accepted + 1
    return rounds, produced


def replay_within(
    matches: Sequence[bool], gamma: int, max_new_tokens: int, limit: int
) -> list[tuple[int, int]]:
    """`replay` over the first `limit` positions, without a last round cut short by the limit
    (its rejection would be the end of the compared text, not the draft's)."""
    rounds = replay(matches[:limit], gamma, max_new_tokens)
    produced = sum(n + 1 for _, n in rounds[:-1])
    if rounds and rounds[-1][1] < rounds[-1][0] and produced + rounds[-1][1] >= limit:
        rounds.pop()
    return rounds


def same_text_rounds(
    matches: Sequence[Sequence[bool]],
    results: Sequence[DecodeTrace],
    continuations: Sequence[Sequence[int]],
    gamma: int,
    max_new_tokens: int,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """The engine's rounds and the estimator's (its match vectors replayed under the engine's rule)
    over the text both decode, prompt by prompt, and how many tokens that text is."""
    engine: list[tuple[int, int]] = []
    estimated: list[tuple[int, int]] = []
    shared = 0
    for row, result, continuation in zip(matches, results, continuations, strict=True):
        rounds, covered = engine_rounds_within(result, shared_length(result.tokens, continuation))
        engine += rounds
        estimated += replay_within(row, gamma, max_new_tokens, covered)
        shared += covered
    return engine, estimated, shared


def round_stats(rounds: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Tokens per round and judged acceptance over rounds that drafted, as `Summary.of` counts them."""
    drafted = [(g, n) for g, n in rounds if g > 0]
    judged = sum(judged_tokens(g, n) for g, n in drafted)
    return (
        sum(n + 1 for _, n in drafted) / len(drafted),
        sum(n for _, n in drafted) / judged if judged else float("nan"),
    )


def judged_positions(result: DecodeTrace) -> list[tuple[int, int, bool]]:
    """(continuation offset, depth, accepted) of every draft token a round judged."""
    judged, offset = [], 0
    for g, n in zip(result.gammas, result.accepted, strict=True):
        judged += [(offset + j, j + 1, j < n) for j in range(judged_tokens(g, n))]
        offset += n + 1
    return judged


def disagreement(
    results: Sequence[DecodeTrace],
    rows: Sequence[int],
    limits: Sequence[int],
    profile: AcceptanceProfile,
    gamma: int,
) -> list[float]:
    """Per depth 1..γ: share of judged positions where the engine and the estimator disagree,
    over the text both decode (each prompt's first `limits` tokens: `shared_length`).

    `shared-kv` is exact at depth 1 by construction (the first draft step reads only the full
    model's K/V); deeper steps also read the draft's own scratch K/V of the round's earlier drafts.
    """
    compared, differ = np.zeros(gamma), np.zeros(gamma)
    for result, row, limit in zip(results, rows, limits, strict=True):
        matches = profile.greedy_match[row]
        for offset, depth, accepted in judged_positions(result):
            if offset < min(len(matches), limit):
                compared[depth - 1] += 1
                differ[depth - 1] += matches[offset] != accepted
    return [float(d / c) if c else float("nan") for d, c in zip(differ, compared, strict=True)]
