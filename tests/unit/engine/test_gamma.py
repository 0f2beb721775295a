"""The adaptive-gamma controller and its policies."""

import pytest

from skipsearch.engine import (
    GammaController,
    GammaPolicy,
)
from skipsearch.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


# -- γ controller ---------------------------------------------------------------------------------
def test_controller_raises_and_lowers_additively_within_bounds():
    controller = GammaController(GammaPolicy(initial=3, window=8, min_samples=4, off_below=None))
    assert controller.update(3, 3) == 3  # 3 judged: fewer than min_samples
    assert [controller.update(3, 3) for _ in range(7)] == [4, 5, 6, 7, 8, 8, 8]
    # Each fully rejected round adds one rejection: 7/8, 6/8 (between thresholds), 5/8 < 0.7 ...
    assert [controller.update(0, 8) for _ in range(9)] == [8, 8, 7, 6, 5, 4, 3, 2, 2]
    assert controller.acceptance == pytest.approx(0.0)


def test_controller_window_slides():
    controller = GammaController(GammaPolicy(initial=4, window=4, min_samples=4, off_below=None))
    controller.update(0, 4)  # window [F]
    controller.update(3, 3)  # [F, T, T, T]: 0.75, between the thresholds
    assert controller.gamma == 4 and controller.acceptance == pytest.approx(0.75)
    controller.update(1, 4)  # T, F pushed in, the two oldest out: [T, T, T, F]
    assert controller.acceptance == pytest.approx(0.75)


def test_controller_switches_off_below_the_threshold_and_stays_off():
    controller = GammaController(GammaPolicy(initial=2, min_samples=4))  # switches off below 0.4
    assert [controller.update(1, 2) for _ in range(2)] == [2, 2]  # 2 of 4 judged: 0.5, at gamma_min
    assert controller.update(0, 2) == 2  # 2 of 5: 0.4 is not below 0.4
    assert controller.update(0, 2) == 0  # 2 of 6
    assert controller.update(3, 3) == 0 and controller.update(0, 0) == 0


def test_fixed_policy_never_moves():
    controller = GammaController(GammaPolicy.fixed(3))
    assert {controller.update(n, 3) for n in (0, 3, 3, 0, 3) * 20} == {3}


@pytest.mark.parametrize(
    "settings",
    [
        {"gamma_min": 0, "initial": 1},
        {"initial": 9},
        {"raise_above": 0.5, "lower_below": 0.7},
        {"off_below": 0.8},
        {"min_samples": 100},
        {"stop_below": 1.0},
        {"stop_below": -0.1},
    ],
    ids=str,
)
def test_invalid_gamma_policies(settings):
    with pytest.raises(ConfigError):
        GammaPolicy(**settings)
