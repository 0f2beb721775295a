"""SublayerWeights: what each part of one forward costs, so a mask's `r_draft` is a share of
measured time (docs/theory.md, "The skip mask: r_draft, s1 and r_reuse").

A sub-layer at lower precision is priced by its measured time where the profile has one, else by
the share of the weight bytes it reads (`skip_mask.BYTES_SHARE`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skipsearch.errors import InvalidMaskError
from skipsearch.masks.skip_mask import BYTES_SHARE, FULL_BITS, LOW_BITS, SkipMask


@dataclass(frozen=True)
class SublayerWeights:
    """Cost of each part of one forward: embedding, per-layer attention and MLP, norm + head.

    `low_bits` gives, per lower precision, each layer's attention and MLP cost with its weights at
    that precision (`{8: (attn, mlp)}`); a precision it lacks is priced by its bytes
    (`BYTES_SHARE[bits]` of the sub-layer's cost), which `share` says through `priced_by_bytes`.
    """

    embed: float
    attn: Sequence[float]
    mlp: Sequence[float]
    head: float
    low_bits: Mapping[int, tuple[Sequence[float], Sequence[float]]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.embed + sum(self.attn) + sum(self.mlp) + self.head

    def priced_by_bytes(self, mask: SkipMask) -> bool:
        """Whether `share` prices some of `mask`'s lower-precision sub-layers by bytes, unmeasured."""
        used = {mask.attn_bits(i) for i in range(mask.num_layers)}
        used |= {mask.mlp_bits(i) for i in range(mask.num_layers)}
        return any(bits in LOW_BITS and bits not in self.low_bits for bits in used)

    def _cost(self, kind: str, layer: int, bits: int) -> float:
        full = (self.attn if kind == "attn" else self.mlp)[layer]
        if bits == FULL_BITS:
            return full
        if bits == 0:
            return 0.0
        if bits in self.low_bits:
            attn, mlp = self.low_bits[bits]
            return (attn if kind == "attn" else mlp)[layer]
        return full * BYTES_SHARE[bits]

    def share(self, mask: SkipMask) -> float:
        if len(self.attn) != mask.num_layers or len(self.mlp) != mask.num_layers:
            raise InvalidMaskError(
                f"cost weights cover {len(self.attn)} layers but the mask has {mask.num_layers}: "
                "profile the same model the mask was made for"
            )
        run = sum(
            self._cost("attn", i, mask.attn_bits(i)) + self._cost("mlp", i, mask.mlp_bits(i))
            for i in range(mask.num_layers)
        )
        return (self.embed + run + self.head) / self.total
