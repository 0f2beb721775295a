"""SkipMask: how the self-speculative draft runs each sub-layer, and what that costs.

A SkipMask says how the draft runs each attention and MLP sub-layer (docs/theory.md, "The skip
mask: r_draft, s1 and r_reuse"): at the model's own precision, with its weights at lower precision
(int8 or int4 copies of the same checkpoint's weights, `w8:` / `w4:`), or not at all (skipped: the
residual stream passes through unchanged). The mask also answers the two cost questions the cost
model needs: how much of a full forward the draft runs (`r_draft`) and how many leading layers keep
exactly the full model's KV, so that verify can reuse it (`r_reuse`): only the layers before the
first sub-layer that is skipped or runs at lower precision.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipsearch.errors import InvalidMaskError, SettingTypeError

if TYPE_CHECKING:
    from skipsearch.masks.sublayer_weights import SublayerWeights


def parse_layer_list(text: str, distinct: bool = True) -> list[int]:
    """Parse `"4,14,20-23"` into `[4, 14, 20, 21, 22, 23]`; an empty string is no layers.

    A backwards range (`20-10`) is an error, not the empty range it would be in Python: taken
    silently, it measured the empty mask; so is a layer named twice (`1,1`, `4-6,5`), which reads
    as a typo, not as a mask (`distinct=False` lists them, for a caller that names the option)."""
    if not isinstance(text, str):
        raise SettingTypeError(f"a layer list is a string such as '4,14,20-23', got {text!r}")
    layers: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                start, end = (int(x) for x in part.split("-", 1))
                layers.extend(range(start, end + 1))
            else:
                layers.append(int(part))
        except ValueError:
            raise InvalidMaskError(
                f"cannot read layer list {text!r}: use comma-separated indices or ranges, e.g. 4,14,20-23"
            ) from None
        if "-" in part and end < start:
            raise InvalidMaskError(
                f"layer range {part!r} in {text!r} runs backwards: write it low-high, e.g. {end}-{start}"
            )
    twice = sorted({layer for layer in layers if layers.count(layer) > 1})
    if twice and distinct:
        raise InvalidMaskError(f"layer list {text!r} names layer {twice[0]} twice: name each layer once")
    return layers


FULL_BITS = 16  # a sub-layer at the model's own precision (the plan's weights)
LOW_BITS = (8, 4)  # the lower precisions a draft's sub-layer may read its weights at
INT4_GROUP = 32  # inputs that share an int4 scale and zero by default (`models.draft_weights`)
# The share of the model's weight bytes a sub-layer at each precision reads (`bytes_share`): int8 one
# byte a weight (a row's float32 scale aside), int4 half a byte plus a bf16 scale and zero a group.
BYTES_SHARE = {FULL_BITS: 1.0, 8: 8 / FULL_BITS, 4: (4 + 32 / INT4_GROUP) / FULL_BITS, 0: 0.0}
_LOW_FIELDS = ("attn_int8", "attn_int4", "mlp_int8", "mlp_int4")
_MASK_KEYS = {"a", "m"} | {f"w{bits}{kind}" for bits in LOW_BITS for kind in ("", "a", "m")}


def check_parse_arguments(text: Any, num_layers: Any) -> None:
    """The Python API's misuse of `parse` (`Draft.parse(None, 30)`, `Draft.parse('a:1', 'thirty')`)
    as one line naming the argument, not an AttributeError from inside."""
    if not isinstance(text, str):
        raise SettingTypeError(f"text must be a draft string such as 'a:4,14|m:4,14', got {text!r}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise SettingTypeError(f"num_layers must be an integer (the model's depth), got {num_layers!r}")
    if num_layers < 1:
        raise InvalidMaskError(f"num_layers must be >= 1, got {num_layers}")


def _format_layers(layers: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(layers))


def _ranges(layers: Iterable[int]) -> str:
    """`0,1,2,3,7` as `0-3,7`: runs of three or more layers as ranges (`parse_layer_list` reads both)."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs)


def readable(text: str) -> str:
    """A draft string as a person reads it: layer lists with ranges, and the empty `a:`/`m:` lists
    left out where the draft has other parts (`a:|m:|w4:0,1,...,29|v:16384` reads `w4:0-29|v:16384`).
    It parses to the same draft; the stable form (`str(SkipMask)`) stays the key of caches and
    journals. Text that is not a draft string is returned as it is."""
    parts = []
    for part in text.split("|"):
        key, colon, value = part.partition(":")
        if colon and key in _MASK_KEYS:
            try:
                layers = parse_layer_list(value)
            except (InvalidMaskError, SettingTypeError):
                return text
            if not layers and key in ("a", "m"):
                continue
            part = f"{key}:{_ranges(layers)}"
        parts.append(part)
    return "|".join(parts) if parts else "a:|m:"


@dataclass(frozen=True)
class SkipMask:
    """Immutable, hashable draft mask over `num_layers` decoder layers.

    `attn` / `mlp` hold the indices of skipped attention / MLP sub-layers; a layer-level skip has
    its index in both. `attn_int8`, `attn_int4`, `mlp_int8`, `mlp_int4` hold the sub-layers the
    draft runs with its weights at int8 or int4 (`attn_bits`, `mlp_bits`); every other sub-layer
    runs at the model's own precision. The string form `a:4,14|m:4,14,20` is stable and
    round-trips; lower precisions add `w8:0-3` (both sub-layers of layers 0-3 at int8), `w4a:5`
    (layer 5's attention at int4) or `w8m:6` (its MLP at int8), written only where present, so
    every mask string from before precisions existed reads the same.
    """

    num_layers: int
    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()
    attn_int8: frozenset[int] = frozenset()
    attn_int4: frozenset[int] = frozenset()
    mlp_int8: frozenset[int] = frozenset()
    mlp_int4: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for name in ("attn", "mlp", "attn_int8", "attn_int4", "mlp_int8", "mlp_int4"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        if self.num_layers < 1:
            raise InvalidMaskError(f"num_layers must be >= 1, got {self.num_layers}")
        kinds = (
            ("attention", self.attn),
            ("MLP", self.mlp),
            ("int8 attention", self.attn_int8),
            ("int4 attention", self.attn_int4),
            ("int8 MLP", self.mlp_int8),
            ("int4 MLP", self.mlp_int4),
        )
        for kind, indices in kinds:
            bad = sorted(i for i in indices if not 0 <= i < self.num_layers)
            if bad:
                raise InvalidMaskError(
                    f"{kind} index {bad[0]} is out of range: the model has {self.num_layers} layers, "
                    f"use indices 0..{self.num_layers - 1}"
                )
        for kind, choices in (
            ("attention", (self.attn, self.attn_int8, self.attn_int4)),
            ("MLP", (self.mlp, self.mlp_int8, self.mlp_int4)),
        ):
            skipped, int8, int4 = choices
            twice = sorted((skipped & int8) | (skipped & int4) | (int8 & int4))
            if twice:
                raise InvalidMaskError(
                    f"the {kind} of layer {twice[0]} is given two ways (skipped, int8, int4): "
                    "give each sub-layer one of them"
                )
        if len(self.skipped_layers) == self.num_layers:
            raise InvalidMaskError(
                "the mask skips every layer, so the draft computes nothing: keep at least one layer"
            )

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_layers(cls, num_layers: int, layers: Iterable[int]) -> SkipMask:
        """Layer-level mask: attention and MLP of every listed layer are skipped."""
        chosen = frozenset(layers)
        return cls(num_layers, chosen, chosen)

    @classmethod
    def prefix(cls, num_layers: int, exit_layer: int) -> SkipMask:
        """Contiguous draft `[0, exit_layer)`: LayerSkip-style early exit."""
        if not 1 <= exit_layer <= num_layers:
            raise InvalidMaskError(f"exit layer must be in 1..{num_layers}, got {exit_layer}")
        return cls.from_layers(num_layers, range(exit_layer, num_layers))

    @classmethod
    def parse(cls, text: str, num_layers: int) -> SkipMask:
        """Read the stable string form (`a:4,14|m:4,14,20`, lower precisions `|w8:0-3|w4a:5`) or a
        plain layer list (`4,14`)."""
        check_parse_arguments(text, num_layers)
        text = text.strip()
        if ":" not in text and "|" not in text:
            return cls.from_layers(num_layers, parse_layer_list(text))
        pieces = text.split("|")
        parts = dict(piece.split(":", 1) for piece in pieces if ":" in piece)
        if set(parts) - _MASK_KEYS or not parts or len(parts) != len(pieces):
            raise InvalidMaskError(
                f"cannot read mask {text!r}: expected the form a:4,14|m:4,14,20 (a: attention, m: MLP "
                "sub-layers skipped; w8:, w4: layers at int8 or int4, w8a:/w8m:/w4a:/w4m: one sub-layer "
                "kind), or a plain layer list like 4,14"
            )
        lists = {key: set(parse_layer_list(value)) for key, value in parts.items()}
        low = {
            f"{kind}_int{bits}": lists.get(f"w{bits}", set()) | lists.get(f"w{bits}{kind[0]}", set())
            for bits in LOW_BITS
            for kind in ("attn", "mlp")
        }
        return cls(num_layers, lists.get("a", set()), lists.get("m", set()), **low)

    @classmethod
    def from_dict(cls, data: dict) -> SkipMask:
        low = {name: data.get(name, []) for name in _LOW_FIELDS}
        return cls(int(data["num_layers"]), data.get("attn", []), data.get("mlp", []), **low)

    @classmethod
    def from_json(cls, text: str) -> SkipMask:
        return cls.from_dict(json.loads(text))

    # -- serialisation ------------------------------------------------------------------------
    def __str__(self) -> str:
        text = f"a:{_format_layers(self.attn)}|m:{_format_layers(self.mlp)}"
        for bits in LOW_BITS:
            attn, mlp = getattr(self, f"attn_int{bits}"), getattr(self, f"mlp_int{bits}")
            for key, layers in (
                (f"w{bits}", attn & mlp),
                (f"w{bits}a", attn - mlp),
                (f"w{bits}m", mlp - attn),
            ):
                if layers:
                    text += f"|{key}:{_format_layers(layers)}"
        return text

    def to_dict(self) -> dict:
        data = {"num_layers": self.num_layers, "attn": sorted(self.attn), "mlp": sorted(self.mlp)}
        return data | {name: sorted(getattr(self, name)) for name in _LOW_FIELDS if getattr(self, name)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    # -- structure ----------------------------------------------------------------------------
    @property
    def skipped_layers(self) -> frozenset[int]:
        """Layers whose attention and MLP are both skipped."""
        return self.attn & self.mlp

    @property
    def is_empty(self) -> bool:
        """Whether the draft is the full model: nothing skipped, nothing at lower precision."""
        return not self.attn and not self.mlp and not self.quantized

    @property
    def quantized(self) -> bool:
        """Whether any sub-layer runs with its weights at lower precision."""
        return bool(self.attn_int8 or self.attn_int4 or self.mlp_int8 or self.mlp_int4)

    @property
    def changed_attn(self) -> frozenset[int]:
        """Attention sub-layers the draft skips or runs at lower precision: not the full model's."""
        return self.attn | self.attn_int8 | self.attn_int4

    @property
    def changed_mlp(self) -> frozenset[int]:
        """MLP sub-layers the draft skips or runs at lower precision: not the full model's."""
        return self.mlp | self.mlp_int8 | self.mlp_int4

    @property
    def is_layer_level(self) -> bool:
        return self.attn == self.mlp

    @property
    def exit_layer(self) -> int | None:
        """`E` when the draft is the contiguous prefix `[0, E)` (empty mask: `L`), else None."""
        exit_layer = self.first_divergent_layer
        expected = frozenset(range(exit_layer, self.num_layers))
        contiguous = self.attn == expected and self.mlp == expected
        return exit_layer if contiguous and not self.quantized else None

    @property
    def first_divergent_layer(self) -> int:
        """`s1`: the first layer whose input differs from the full model's (docs/theory.md, "The
        skip mask: r_draft, s1 and r_reuse").

        A skipped attention at `l` means layer `l` writes no exact KV, so `s1 <= l`; a skipped MLP
        at `l` leaves layer `l`'s KV exact and first changes the input of layer `l + 1`. A sub-layer
        at lower precision counts as a skipped one: its output is not the full model's.
        """
        candidates = [self.num_layers]
        if self.changed_attn:
            candidates.append(min(self.changed_attn))
        if self.changed_mlp:
            candidates.append(min(self.changed_mlp) + 1)
        return min(candidates)

    @property
    def first_skipped_layer(self) -> int:
        """The first layer with any sub-layer skipped or at lower precision (`L` for the empty mask).

        The draft's input to this layer equals the full model's, so evaluation can start here
        from cached states; it is `s1 - 1` when the first change is an MLP, whose layer still
        writes exact KV but no longer produces the full model's output.
        """
        return min(self.changed_attn | self.changed_mlp, default=self.num_layers)

    @property
    def reused_sublayers(self) -> int:
        """Sub-layers, in execution order `attn_0, mlp_0, attn_1, ...`, before the first one skipped.

        Their outputs are exactly the full model's, so verify needs them only for positions the
        draft never ran. This is `2 s1` except when the first skip is an MLP at layer `l`: then
        `s1 = l + 1` (layer `l`'s KV is exact) but verify must still rerun that MLP for every
        position, because the draft's output of layer `l` is not the full model's.
        """
        candidates = [2 * self.num_layers]
        if self.changed_attn:
            candidates.append(2 * min(self.changed_attn))
        if self.changed_mlp:
            candidates.append(2 * min(self.changed_mlp) + 1)
        return min(candidates)

    def check_fits(self, num_layers: int) -> None:
        """Refuse a mask made for another depth: its indices would name the wrong layers."""
        if self.num_layers != num_layers:
            raise InvalidMaskError(
                f"mask {self} is for {self.num_layers} layers but the model has {num_layers}: "
                "use a mask made for this model (--model)"
            )

    def runs_attn(self, layer: int) -> bool:
        return layer not in self.attn

    def runs_mlp(self, layer: int) -> bool:
        return layer not in self.mlp

    def attn_bits(self, layer: int) -> int:
        """The bits the draft reads layer `layer`'s attention weights at: `FULL_BITS` (the model's
        own), 8 or 4; 0 where it skips the sub-layer."""
        if layer in self.attn:
            return 0
        return 8 if layer in self.attn_int8 else 4 if layer in self.attn_int4 else FULL_BITS

    def mlp_bits(self, layer: int) -> int:
        """As `attn_bits`, for the MLP."""
        if layer in self.mlp:
            return 0
        return 8 if layer in self.mlp_int8 else 4 if layer in self.mlp_int4 else FULL_BITS

    def exact_mlp(self, layer: int) -> bool:
        """Whether the draft runs layer `layer`'s MLP as the full model does."""
        return self.mlp_bits(layer) == FULL_BITS

    # -- cost shares --------------------------------------------------------------------------
    @property
    def r_reuse(self) -> float:
        """Share of layers whose KV the draft writes exactly, so verify can reuse it: `s1 / L`."""
        return self.first_divergent_layer / self.num_layers

    def r_draft(self, weights: SublayerWeights | None = None) -> float:
        """Share of one full forward's cost that the draft runs.

        With `weights` (from a LatencyProfile) the share is by measured time, embedding and head
        included; without, it is the share of sub-layers the draft runs, a sub-layer at lower
        precision counted by the share of the weight bytes it reads (`BYTES_SHARE`).
        """
        if weights is None:
            run = (self.attn_bits(i) for i in range(self.num_layers))
            shares = [*run, *(self.mlp_bits(i) for i in range(self.num_layers))]
            return sum(BYTES_SHARE.get(bits, 0.0) for bits in shares) / (2 * self.num_layers)
        return weights.share(self)
