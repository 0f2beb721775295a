"""Tier sets: the policy simulation against hand-computed trajectories, the search, the manifest,
and the tiered engine — lossless on a tiny model, eager, over static buffers, and on CUDA graphs."""

from __future__ import annotations

import numpy as np
import pytest

from skipsearch.cost.calibrated import predict
from skipsearch.cost.closed_forms import SelfSpeculative
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tiers.simulation import (
    Tier,
    TierScorer,
    Trajectories,
    simulate,
)
from tests.unit.tiers.conftest import CHEAP, CHEAP_PROFILE, RICH, RICH_PROFILE, profile


def test_simulation_follows_a_hand_computed_trajectory():
    """Two tiers drafting 2 and 3 tokens, window 1, threshold 0.6, round costs 1.5 and 1.2.

    k=0  tier 0: run 3 -> accepts 2 of 2, commits 3; rate 1.0 -> tier 1
    k=3  tier 1: run 1 -> accepts 1 of 3, commits 2; rate 1/3 -> tier 0
    k=5  tier 0: run 4 -> accepts 2 of 2, commits 3; rate 1.0 -> tier 1
    k=8  tier 1: run 0 -> accepts 0 of 3, commits 1; rate 0   -> tier 0
    k=9  tier 0: run 0 -> accepts 0 of 2, commits 1; rate 0   -> tier 0
    k=10 tier 0: run 2 -> accepts 2 (= γ, not censored), commits 3; k = 13: done
    """
    rich, cheap = SkipMask.from_layers(8, [6]), SkipMask.from_layers(8, [2, 5, 6])
    trajectories = Trajectories.of([profile(rich, "111011111011"), profile(cheap, "101101110110")])
    run = simulate(trajectories, [1.5, 1.2], TierPolicy(1, (0.6,)), gammas=(2, 3))
    assert (run.rounds, run.tokens, run.tier_rounds) == (6, 13, (4, 2))
    assert run.time == pytest.approx(4 * 1.5 + 2 * 1.2)
    assert run.speedup == pytest.approx(13 / 8.4)
    assert run.tokens_per_round == pytest.approx(13 / 6) and run.time_per_round == pytest.approx(1.4)


def test_a_round_running_off_the_end_while_matching_is_censored():
    trajectories = Trajectories.of([profile("a:1|m:1", "011", "0")])
    run = simulate(trajectories, [1.0], TierPolicy(1, ()), gammas=(3,))
    assert (run.rounds, run.tokens) == (2, 2)  # "011" ends in a censored round; "0" is one round


def test_one_tier_reproduces_the_single_mask_prediction():
    rng = np.random.default_rng(3)
    mask = SkipMask.from_layers(12, [3, 7, 9])
    rows = ["".join("1" if x < 0.7 else "0" for x in rng.random(80)) for _ in range(5)]
    measured = profile(mask, *rows)
    form = SelfSpeculative.from_mask(mask)
    prediction = predict(measured, mask, gamma_max=6)
    for gamma in range(1, 7):
        run = simulate(Trajectories.of([measured]), [form.round_cost(gamma)], TierPolicy(4, ()), (gamma,))
        assert run.tokens_per_round == pytest.approx(measured.tokens_per_round(gamma))
        assert run.speedup == pytest.approx(prediction.closed_form[gamma - 1])


def test_profiles_of_different_prompt_sets_do_not_mix():
    with pytest.raises(ConfigError, match="different prompts"):
        Trajectories.of([profile("a:1|m:1", "0101"), profile("a:2|m:2", "010")])


def test_a_tier_set_beats_its_best_single_mask_when_difficulty_varies():
    scorer = TierScorer([Tier(RICH, RICH_PROFILE), Tier(CHEAP, CHEAP_PROFILE)])
    assert [(s.mask, s.gamma) for s in scorer.singles] == [(str(RICH), 1), (str(CHEAP), 1)]
    score = scorer.score(TierPolicy(window=6, thresholds=(0.9,)), gammas=(1, 8))
    assert score.gain > 0.15
    assert score.best_single == scorer.singles[0]
    assert 0.2 < score.simulation.tier_share[1] < 0.5
    assert scorer.score(TierPolicy(6, (0.9,))).gammas == (1, 1)  # default: each mask's own best γ
    with pytest.raises(ConfigError, match="one draft length"):
        scorer.score(TierPolicy(6, (0.9,)), gammas=(1, 9))
