"""Acceptance profiles and simulated rounds, by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile, match_runs, round_starts, simulate_rounds
from skipsearch.masks import KVPattern


def make_profile() -> AcceptanceProfile:
    return AcceptanceProfile(
        mask="a:1|m:1",
        greedy_match=((True, True, False, True, True, True, True, False, True), (False, True, True)),
        sampling_accept=((0.5, 0.5), (1.0,)),
        temperature=1.0,
    )


def test_rounds_accept_runs_of_matches_then_jump_past_the_target_token():
    # positions: 1 1 0 1 1 1 1 0 1
    matches = [True, True, False, True, True, True, True, False, True]
    # gamma 3: round@0 accepts 2 (mismatch at 2) -> next 3; round@3 accepts 3 -> next 7;
    # round@7 mismatches immediately -> next 8; round@8 sees one match then the end: censored.
    assert simulate_rounds(matches, 3) == [2, 3, 0]
    # gamma 1: @0 a=1 -> 2; @2 a=0 -> 3; @3 a=1 -> 5; @5 a=1 -> 7; @7 a=0 -> 8; @8 a=1 -> 10.
    assert simulate_rounds(matches, 1) == [1, 0, 1, 1, 0, 1]


def test_all_matches_accept_gamma_every_full_round():
    assert simulate_rounds([True] * 10, 4) == [4, 4]
    assert simulate_rounds([False] * 3, 4) == [0, 0, 0]
    assert simulate_rounds([], 2) == []
    with pytest.raises(ValueError):
        simulate_rounds([True], 0)


def test_profile_statistics_by_hand():
    profile = make_profile()
    assert profile.n_positions == 12
    assert profile.alpha == pytest.approx(9 / 12)
    assert profile.sampling_acceptance == pytest.approx(2 / 3)
    # gamma 3: rows give [2, 3, 0] and [0] (then 1,1 at the end is censored).
    assert profile.rounds(3) == [2, 3, 0, 0]
    assert profile.tokens_per_round(3) == pytest.approx(1 + 5 / 4)
    # depth 1: 4 rounds reached, 2 accepted; depth 2: 2 reached, 2 accepted; depth 3: 2 reached, 1.
    assert profile.alpha_by_depth(3) == pytest.approx([0.5, 1.0, 0.5])


def test_empty_mask_profile_gives_gamma_plus_one_tokens():
    profile = AcceptanceProfile("a:|m:", ((True,) * 17,), ((1.0,) * 17,), 1.0)
    assert profile.tokens_per_round(4) == 5.0
    assert profile.alpha == 1.0


def test_dict_round_trip():
    profile = make_profile()
    again = AcceptanceProfile.from_dict(profile.to_dict())
    assert again == profile
    assert again.summary(3)["tokens_per_round"][3] == profile.tokens_per_round(3)


def test_profiles_round_trip_with_their_vocabulary_variants() -> None:
    row = ((True, False, True),)
    variant = AcceptanceProfile("a:1|m:1", row, ((0.5, 0.2, 0.9),), 1.0, draft_vocab=16)
    profile = AcceptanceProfile("a:1|m:1", row, ((0.6, 0.2, 0.9),), 1.0, by_vocab=(variant,))
    assert AcceptanceProfile.from_dict(profile.to_dict()) == profile
    assert profile.for_vocab(16) is variant and profile.for_vocab(None) is profile
    with pytest.raises(KeyError, match="measured: full, 16"):
        profile.for_vocab(8)
    old = {k: v for k, v in profile.to_dict().items() if k != "by_vocab"}
    assert AcceptanceProfile.from_dict(old).by_vocab == ()


def test_profiles_round_trip_with_their_kv_pattern_variants() -> None:
    row = ((True, False, True),)
    kv = KVPattern(4, 64)
    under = AcceptanceProfile("a:1|m:1", row, ((0.5, 0.2, 0.9),), 1.0, kv=kv)
    profile = AcceptanceProfile("a:1|m:1", row, ((0.6, 0.2, 0.9),), 1.0, by_kv=(under,))
    again = AcceptanceProfile.from_dict(profile.to_dict())
    assert again == profile and again.by_kv[0].kv == kv
    assert profile.for_vocab(None, kv) is under and profile.variants == (profile, under)
    assert under.summary(2)["kv"] == "s4w64" and profile.summary(2)["kv"] == "full"
    with pytest.raises(KeyError, match=r"measured: full, full\|kv:s4w64"):
        profile.for_vocab(None, KVPattern(0, 8))


def test_round_starts_follow_simulated_rounds() -> None:
    matches = [True, True, False, True, True, True, False, True]
    # gamma 3: round at 0 accepts 2 (drafts 0,1,2), next at 3 accepts 3 (drafts 3,4,5; 6 is the
    # verify's bonus position, never drafted), next at 7 is censored (drafts 7)
    assert round_starts(matches, 3) == [0, 0, 0, 3, 3, 3, 6, 7]
    assert simulate_rounds(matches, 3) == [2, 3]
    assert round_starts(matches, 1) == list(range(8))  # one draft per round: each alone
    assert round_starts([], 2) == []
    with pytest.raises(ValueError):
        round_starts(matches, 0)


def test_match_runs():
    assert match_runs([True, True, False, True, False, True]).tolist() == [2, 1, 0, 1, 0, 1]


def test_a_draft_that_stops_when_unsure_ends_its_rounds_there() -> None:
    """Each round drafts up to and including its first unsure position, at most γ."""
    matches = [True, True, True, False, True, True, True, True]
    confident = [True, False, True, True, True, True, True, True]
    # round 0 drafts 0-1 (unsure at 1), accepts both, emits 2; round 3 drafts 3-5, rejects 3;
    # round 4 drafts 4-6, accepts them, emits 7
    assert simulate_rounds(matches, 3, confident) == [2, 0, 3]
    assert round_starts(matches, 3, confident) == [0, 0, 2, 3, 4, 4, 4, 7]
    profile = AcceptanceProfile("a:1", (tuple(matches),), (tuple(1.0 for _ in matches),), 0.0)
    with pytest.raises(ValueError, match="confidences"):
        profile.tokens_per_round(3, 0.5)
    sure = replace(profile, greedy_confidence=(tuple(0.9 if c else 0.1 for c in confident),))
    assert sure.tokens_per_round(3, 0.5) == pytest.approx((3 + 1 + 4) / 3)
    assert sure.drafts_per_round(3, 0.5) == pytest.approx((2 + 3 + 3) / 3)
    assert sure.tokens_per_round(3) == profile.tokens_per_round(3)
    assert AcceptanceProfile.from_dict(sure.to_dict()).greedy_confidence == sure.greedy_confidence
