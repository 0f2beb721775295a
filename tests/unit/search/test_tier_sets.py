"""The tier-set search finds the set and its policy, and drops tiers it never reaches."""

from __future__ import annotations

import pytest

from skipsearch.masks import SkipMask
from skipsearch.search.tier_sets import TierSetResult, candidate_pool, drop_unused, search_tier_sets
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tiers.simulation import (
    Single,
    TierScorer,
    closed_form,
)
from tests.unit.tiers.conftest import CHEAP, CHEAP_PROFILE, RICH, RICH_PROFILE, profile, stretches


def test_the_search_finds_the_tier_set_and_its_policy():
    noise = SkipMask.from_layers(8, [1, 3])
    profiles = {
        str(RICH): RICH_PROFILE,
        str(CHEAP): CHEAP_PROFILE,
        str(noise): profile(noise, *stretches(0.3)),
    }
    pool = candidate_pool(profiles, 8, top_n=3)
    assert [c.mask for c in pool] == [RICH, noise, CHEAP]  # richest first
    (best,) = search_tier_sets(pool, trials=200, sizes=(2,), seed=0)
    assert [c.mask for c in best.tiers] == [RICH, CHEAP]
    assert best.gain > 0.1 and best.pool_best.speedup == max(c.speedup for c in pool)
    manifest = best.manifest("tiny", {"runs": []}, "closed-form")
    assert manifest.gammas == best.score.gammas and manifest.masks == (RICH, CHEAP)
    assert manifest.predicted["gain_over_pool_best_single"] == pytest.approx(best.gain)


def test_the_search_does_not_report_a_set_below_the_best_mask_when_tiers_cannot_help():
    useless = SkipMask.prefix(8, 4)
    profiles = {str(RICH): RICH_PROFILE, str(useless): profile(useless, *stretches(0.0, seed=2))}
    (best,) = search_tier_sets(candidate_pool(profiles, 8), trials=5, sizes=(2,))
    assert best.gain > -0.01  # the study's anchor: the best mask as tier 0, a policy that stays


def test_a_tier_the_policy_never_reaches_is_dropped():
    """Window 2 over one-token drafts: the mean is 0, 0.5 or 1, never in [0.7, 0.8) (tier 1)."""
    middle = SkipMask.prefix(8, 5)
    profiles = {str(RICH): RICH_PROFILE, str(middle): RICH_PROFILE, str(CHEAP): CHEAP_PROFILE}
    pool = candidate_pool(profiles, 8)
    policy = TierPolicy(2, (0.7, 0.8))
    score = TierScorer([c.tier for c in pool]).score(policy, (1, 1, 1))
    assert score.simulation.tier_rounds[1] == 0
    pruned = drop_unused(TierSetResult(tuple(pool), policy, score, Single("x", 1, 1.0)), closed_form, 8)
    assert [c.mask for c in pruned.tiers] == [RICH, CHEAP] and pruned.policy == TierPolicy(2, (0.8,))
    assert pruned.score.speedup == pytest.approx(score.speedup)
