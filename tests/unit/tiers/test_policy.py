"""The tier controller and its policy checks."""

from __future__ import annotations

import pytest

from skipsearch.errors import ConfigError
from skipsearch.tiers.policy import TierController, TierPolicy, check_policy


# -- the policy and its simulation ------------------------------------------------------------------
def test_controller_averages_draft_acceptance_over_the_window():
    controller = TierController(TierPolicy(window=2, thresholds=(0.5, 0.8)))
    assert controller.tier == 0 and controller.acceptance is None
    assert controller.update(3, 3) == 0  # one round: the window is not full yet
    assert controller.acceptance == 1.0
    assert controller.update(0, 3) == 1  # mean(1, 0) = 0.5, at the first threshold
    assert controller.update(3, 3) == 1  # the first round left the window: mean(0, 1)
    assert controller.update(3, 3) == 2  # mean(1, 1) = 1.0: the cheapest tier
    assert controller.update(1, 4) == 1  # mean(1, 0.25) = 0.625
    assert controller.update(0, 0) == 1  # a round that drafted nothing says nothing


@pytest.mark.parametrize(
    ("thresholds", "tiers"),
    [((0.8, 0.5), 3), ((0.5,), 3), ((0.0,), 2), ((1.0,), 2), ((0.5, 0.6, 0.7, 0.8), 5)],
)
def test_invalid_policies(thresholds, tiers):
    with pytest.raises(ConfigError):
        check_policy(TierPolicy(4, thresholds), tiers)
