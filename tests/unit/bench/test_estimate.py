"""The estimator's prediction next to a decode: a stopping draft is predicted from the profile's
confidences when greedy, and not at all when sampled or with a dynamic γ."""

from types import SimpleNamespace

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.bench.estimate import estimator_check
from skipsearch.engine import GammaPolicy, Sampling

PROFILE = AcceptanceProfile(
    "a:1",
    ((True, True, True, False, True, True, True, True),),
    ((0.5,) * 8,),
    0.0,
    greedy_confidence=((0.9, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9),),
)
MEASURED = SimpleNamespace(acceptance=0.8, tokens_per_round=2.5)


def test_a_greedy_stopping_draft_is_predicted_with_its_stop() -> None:
    found = estimator_check(PROFILE, "rounds", GammaPolicy.fixed(3, 0.5), Sampling(), MEASURED)
    assert found.tokens_per_round == pytest.approx(PROFILE.tokens_per_round(3, 0.5))
    assert found.tokens_per_round != pytest.approx(PROFILE.tokens_per_round(3))
    assert found.no_prediction is None
    assert found.relative_error == pytest.approx((found.tokens_per_round - 2.5) / 2.5)


@pytest.mark.parametrize(
    ("policy", "sampling", "why"),
    [
        (GammaPolicy.fixed(3, 0.5), Sampling(temperature=1.0), "sampling has no stop"),
        (GammaPolicy(initial=3), Sampling(), "dynamic"),
    ],
)
def test_no_prediction_says_why(policy, sampling, why) -> None:
    found = estimator_check(PROFILE, "rounds", policy, sampling, MEASURED)
    assert found.tokens_per_round is None and found.relative_error is None
    assert why in found.no_prediction
