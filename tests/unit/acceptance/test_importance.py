"""Sub-layer importance: the stream-cosine proxy from the reference cache, and the measured form."""

import pytest
import torch

from skipsearch.acceptance.importance import measured_importance
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from tests.conftest import tiny_model
from tests.unit.acceptance.conftest import LAYERS, importance_of


@pytest.mark.parametrize(("part", "layer"), [("attn", 2), ("mlp", 4), ("attn", 0)])
def test_a_zeroed_sublayer_is_the_least_important(part: str, layer: int) -> None:
    """A sub-layer whose output projection is zero leaves the stream as it was: importance 0,
    below every other sub-layer's."""
    model = tiny_model("llama", layers=LAYERS, seed=1)
    block = model.model.layers[layer]
    with torch.no_grad():
        (block.self_attn.o_proj if part == "attn" else block.mlp.down_proj).weight.zero_()
    importance = importance_of(model)
    values = {(p, i): getattr(importance, p)[i] for p in ("attn", "mlp") for i in range(LAYERS)}
    assert min(values, key=values.__getitem__) == (part, layer)
    assert values[(part, layer)] == pytest.approx(0.0, abs=1e-6)
    assert min(v for k, v in values.items() if k != (part, layer)) > 1e-4


def test_measured_importance_is_one_minus_alpha_of_single_unit_masks() -> None:
    masks = [SkipMask.from_layers(4, [1]), SkipMask(4, attn={2}), SkipMask(4, mlp={2})]
    measured = measured_importance(4, dict(zip(masks, [0.25, 0.5, 0.875], strict=True)))
    assert (measured.layer[1], measured.attn[2], measured.mlp[2]) == (0.75, 0.5, 0.125)
    assert measured.layer[2] is None
    with pytest.raises(ConfigError, match="no value for the layer of layer 2"):
        measured.of(2, attn=True, mlp=True)
    with pytest.raises(ConfigError, match="not a single-unit mask"):
        measured_importance(4, {SkipMask.from_layers(4, [1, 2]): 0.5})
