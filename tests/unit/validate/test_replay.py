"""`validate.replay`: the estimator's rounds replayed under the engine's rules, the text both decode,
and where they disagree — with exact numbers."""

import math

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.engine.result import DecodeTrace
from skipsearch.validate.replay import (
    disagreement,
    engine_rounds_within,
    judged_positions,
    replay,
    replay_within,
    round_stats,
    same_text_rounds,
    shared_length,
)

T, F = True, False
MATCHES = (T, T, F, T, T, T, F)
# two rounds at γ = 3: two drafts accepted then a rejection, then all three accepted
ENGINE = DecodeTrace(0, (1, 2, 3, 4, 5, 6, 7), 1.0, gammas=(3, 3), accepted=(2, 3))


def test_replay_follows_the_engines_end_rule() -> None:
    assert replay(MATCHES, 3, 7) == [(3, 2), (3, 3)]
    # the output may not overshoot: the last rounds shrink γ, down to a plain step, uncensored
    assert replay([T] * 5, 3, 5) == [(3, 3), (0, 0)]
    assert replay([T] * 5, 3, 6) == [(3, 3), (1, 1)]


def test_replay_within_drops_a_last_round_the_limit_cut_short() -> None:
    assert replay(MATCHES[:4], 3, 7) == [(3, 2), (3, 1)]
    assert replay_within(MATCHES, 3, 7, 4) == [(3, 2)]
    assert replay_within(MATCHES, 3, 7, 7) == [(3, 2), (3, 3)]


def test_round_stats_count_judged_drafts_as_the_engine_summary_does() -> None:
    tokens_per_round, acceptance = round_stats([(3, 2), (3, 3), (0, 0)])
    assert tokens_per_round == 3.5  # the γ = 0 step drafted nothing
    assert acceptance == pytest.approx(5 / 6)  # 3 judged in each round


def test_judged_positions_stop_at_the_first_rejection() -> None:
    assert judged_positions(ENGINE) == [
        (0, 1, T),
        (1, 2, T),
        (2, 3, F),
        (3, 1, T),
        (4, 2, T),
        (5, 3, T),
    ]


def test_the_text_both_decode() -> None:
    assert shared_length((1, 2, 3, 4), (1, 2, 9)) == 2
    assert shared_length((1, 2), (1, 2, 3)) == 2
    assert engine_rounds_within(ENGINE, 5) == ([(3, 2)], 3)
    assert engine_rounds_within(ENGINE, 7) == ([(3, 2), (3, 3)], 7)


def test_same_text_rounds_stop_both_sides_at_the_engines_first_flip() -> None:
    whole = (1, 2, 3, 4, 5, 6, 7)
    assert same_text_rounds([MATCHES], [ENGINE], [whole], 3, 7) == ([(3, 2), (3, 3)], [(3, 2), (3, 3)], 7)
    # the engine took another token at offset 4: only the first round lies before it, on both sides
    flipped = (1, 2, 3, 4, 9, 9, 9)
    assert same_text_rounds([MATCHES], [ENGINE], [flipped], 3, 7) == ([(3, 2)], [(3, 2)], 3)


def test_disagreement_by_depth_on_the_judged_positions() -> None:
    profile = AcceptanceProfile("m", ((T, F, F, T, T, T),), ((1.0,) * 6,), 0.0)
    assert disagreement([ENGINE], [0], [6], profile, 3) == [0.0, 0.5, 0.0]
    # past the shared text nothing is compared: depth 2 and 3 have no position left
    first, *deeper = disagreement([ENGINE], [0], [1], profile, 3)
    assert first == 0.0 and all(math.isnan(d) for d in deeper)
