"""Sub-layer importance: how much the draft loses by skipping each attention, MLP or whole layer.

The ranking and knapsack strategies (docs/theory.md, "Importance, ranking and knapsack") order skips
by it. Two sources:
- `proxy` (`acceptance.stream_proxy`): from the reference cache, `1 − cos(stream before, stream
  after)` of every sub-layer of the full model, averaged over the prediction positions. No mask is
  measured. A sub-layer that barely turns the residual stream can be skipped with little change to
  what the layers above see; one whose weights are zero does not turn it at all and scores 0.
- `measured`: `1 − α` of the mask that skips only that unit (one evaluation per unit), the exact
  first-order damage, at the price of the evaluations.

Pure data (no torch), so the strategies that read it stay model-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask

IMPORTANCE_SOURCES = ("proxy", "measured")


@dataclass(frozen=True)
class SublayerImportance:
    """Importance of every attention and MLP sub-layer and of every whole layer (None: not
    measured; a `measured` importance only has the units of the space it was measured for).

    `layer[l]` is its own number, not `attn[l] + mlp[l]`: skipping both sub-layers of a layer
    changes the stream by `h_{l+1} − h_l`, which is not the sum of the two changes alone.
    """

    source: str
    attn: tuple[float | None, ...]
    mlp: tuple[float | None, ...]
    layer: tuple[float | None, ...]

    def __post_init__(self) -> None:
        if self.source not in IMPORTANCE_SOURCES:
            raise ConfigError(
                f"unknown importance source {self.source!r}: use one of {', '.join(IMPORTANCE_SOURCES)}"
            )
        if not len(self.attn) == len(self.mlp) == len(self.layer) >= 1:
            raise ConfigError(
                f"importance must cover the same layers for attn, mlp and layer, got "
                f"{len(self.attn)}, {len(self.mlp)}, {len(self.layer)}"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layer)

    def of(self, layer: int, attn: bool, mlp: bool) -> float:
        """The importance of skipping the attention and/or MLP of `layer`."""
        table = self.layer if attn and mlp else self.attn if attn else self.mlp
        value = table[layer]
        if value is None:
            part = "layer" if attn and mlp else "attention" if attn else "MLP"
            raise ConfigError(
                f"{self.source} importance has no value for the {part} of layer {layer}: measure it "
                "for the space being searched, or use --importance proxy"
            )
        return value

    def check_fits(self, num_layers: int) -> None:
        if self.num_layers != num_layers:
            raise ConfigError(
                f"importance covers {self.num_layers} layers but the space has {num_layers}: "
                "compute it for the model being searched"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "attn": list(self.attn),
            "mlp": list(self.mlp),
            "layer": list(self.layer),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SublayerImportance:
        def values(key: str) -> tuple[float | None, ...]:
            return tuple(None if v is None else float(v) for v in data[key])

        try:
            return cls(str(data["source"]), values("attn"), values("mlp"), values("layer"))
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"importance data is malformed ({error}): delete the file to recompute it"
            ) from None


def measured_importance(num_layers: int, alphas: Mapping[SkipMask, float]) -> SublayerImportance:
    """`1 − α` of single-unit masks: each mask must skip one whole layer or one sub-layer."""
    tables: dict[str, list[float | None]] = {key: [None] * num_layers for key in ("attn", "mlp", "layer")}
    for mask, alpha in alphas.items():
        mask.check_fits(num_layers)
        units = mask.attn | mask.mlp
        if len(units) != 1:
            raise ConfigError(f"mask {mask} is not a single-unit mask: it must skip one layer or sub-layer")
        (layer,) = units
        key = "layer" if mask.attn and mask.mlp else "attn" if mask.attn else "mlp"
        tables[key][layer] = 1.0 - alpha
    return SublayerImportance("measured", *(tuple(tables[k]) for k in ("attn", "mlp", "layer")))
