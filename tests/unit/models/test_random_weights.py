"""Weight-free models: shipped configs, seeded random weights, depth cuts and depth-scaled profiles."""

import pytest
import torch

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
