"""Scaling a profile to another depth repeats the mean layer and says so."""

import pytest

from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError


def test_scaling_repeats_the_mean_layer_and_says_so() -> None:
    ones = ((1.0,),)
    attn = (((1.0,),), ((3.0,),))
    mlp = (((2.0,),), ((6.0,),))
    profile = LatencyProfile(
        meta={"num_layers": 2},
        context_lengths=(8,),
        positions=(1,),
        embed=ones,
        head=ones,
        attn=attn,
        mlp=mlp,
        spread={"embed": ones, "head": ones, "attn": attn, "mlp": mlp},
        round_overhead={1: 0.0},
    )
    scaled = scale_to_depth(profile, 5)
    assert scaled.num_layers == 5 and scaled.meta["measured_layers"] == 2
    assert scaled.step_time(8) == pytest.approx(1 + 1 + 5 * (2 + 4))
    assert "mean of 2 measured layers" in scaled.meta["depth_scaled"]
    with pytest.raises(ConfigError):
        scale_to_depth(profile, 1)
