"""Weight-free models: shipped configs, seeded random weights, depth cuts and depth-scaled profiles."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from skipsearch import cli
from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError, ModelLoadError
from skipsearch.models.loading import load_model
from skipsearch.models.random_weights import RandomWeights, random_config, shipped_configs
from skipsearch.models.registry import REGISTRY


def test_every_alias_ships_its_config_with_the_registry_depth() -> None:
    assert shipped_configs() == sorted(REGISTRY)
    for alias, entry in REGISTRY.items():
        assert random_config(alias, RandomWeights()).num_hidden_layers == entry.num_layers


def test_a_depth_cut_keeps_the_width() -> None:
    config = random_config("mistral-7b", RandomWeights(num_layers=2))
    assert (config.num_hidden_layers, config.real_num_layers) == (2, 32)
    assert (config.hidden_size, config.num_key_value_heads, config.vocab_size) == (4096, 8, 32768)


def test_random_weights_are_seeded_and_need_no_download() -> None:
    def first_weight(seed: int) -> torch.Tensor:
        loaded = load_model("smollm2-135m", "cpu", "auto", RandomWeights(num_layers=1, seed=seed))
        assert loaded.tokenizer is None and loaded.source == "random-weights:smollm2-135m"
        return loaded.model.model.layers[0].mlp.up_proj.weight

    assert torch.equal(first_weight(0), first_weight(0))
    assert not torch.equal(first_weight(0), first_weight(1))


@pytest.mark.parametrize(
    ("name", "weights", "error", "message"),
    [
        ("smollm2-135m", RandomWeights(num_layers=31), ConfigError, "exceeds smollm2-135m's 30 layers"),
        ("org/unknown", RandomWeights(), ModelLoadError, "needs an architecture config"),
    ],
)
def test_bad_weight_free_models(name: str, weights: RandomWeights, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        random_config(name, weights)


def test_num_layers_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="--num-layers must be >= 1"):
        RandomWeights(num_layers=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["measure", "--random-weights", "--skip", "4"], "meaningless on random weights"),
        (["profile", "--num-layers", "2"], "--num-layers only applies with --random-weights"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


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


def test_profile_of_the_mistral_7b_shape_on_this_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The acceptance criterion of issue 14: a 2-layer cut of the 7B architecture, scaled to 32."""
    out = tmp_path / "mistral.json"
    args = (
        "--model mistral-7b --random-weights --num-layers 2 --context-lengths 128 --processes 1 --repeats 3"
    )
    assert cli.main(["profile", *args.split(), "--out", str(out)]) == 0
    assert "depth scaled" in capsys.readouterr().out
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert (meta["num_layers"], meta["measured_layers"], meta["hidden_size"]) == (32, 2, 4096)
    assert meta["random_weights"] is True
    assert np.asarray(data["attn"]).shape == (32, 1, 9)
    profile = LatencyProfile.load(out)
    assert profile.weights(128).attn[0] == profile.weights(128).attn[31] > 0


def test_decode_of_the_mistral_7b_shape_on_this_cpu(tmp_path: Path) -> None:
    """GQA, a 32k vocabulary and 4,096-wide layers through every decoder, without a tokenizer."""
    out = tmp_path / "decode.json"
    args = (
        "decode --model mistral-7b --random-weights --num-layers 2 --skip 1 --gamma 2 --n-prompts 1 "
        "--max-prompt-tokens 8 --new-tokens 4 --repeats 1"
    )
    assert cli.main([*args.split(), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["random_weights"] is True and result["estimators"] == []
    assert result["lossless"] is True and result["hf_matches_autoregressive"] is True
    assert set(result["summaries"]) == {"autoregressive", "hf-generate", "ssd", "hf-early-exit"}
