"""The tiny model, masks and reference continuations shared by the estimator, reference and importance
tests."""

import pytest
import torch

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.acceptance.stream_proxy import proxy_importance
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import random_reference, tiny_model

MASKS = [
    SkipMask.from_layers(6, [0]),
    SkipMask.from_layers(6, [2]),
    SkipMask.from_layers(6, [1, 4]),
    SkipMask.prefix(6, 4),
    SkipMask(6, attn=[3], mlp=[1, 5]),
]


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", layers=6, seed=1)
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [7, 12, 4, 9], new_tokens=10)
    return model, runner, reference


LAYERS = 6


def importance_of(model: torch.nn.Module) -> SublayerImportance:
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [7, 12, 4], new_tokens=8, with_kv=False)
    return proxy_importance(runner, reference)
