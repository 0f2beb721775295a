"""The residual-stream proxy importance: no mask evaluation, and a JSON round trip."""

from skipsearch.acceptance.importance import SublayerImportance
from tests.conftest import tiny_model
from tests.unit.acceptance.conftest import LAYERS, importance_of


def test_proxy_needs_no_mask_evaluation_and_round_trips() -> None:
    importance = importance_of(tiny_model("llama", layers=LAYERS, seed=2))
    assert importance.source == "proxy" and importance.num_layers == LAYERS
    assert all(
        0.0 <= v <= 2.0 for table in (importance.attn, importance.mlp, importance.layer) for v in table
    )
    assert SublayerImportance.from_dict(importance.to_dict()) == importance
    assert importance.of(3, attn=True, mlp=True) == importance.layer[3]
    assert importance.of(3, attn=False, mlp=True) == importance.mlp[3]
