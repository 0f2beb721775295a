"""The precision a draft reads its weights at, as search spaces name and choose it (docs/theory.md,
"Drafts at lower precision"): `full`, `int8`, `int4`, and the masks that carry one or several.

A space with one precision for every kept sub-layer (`spaces.ConcreteSpace`) reads its skips and
sets their precision with `with_bits`; the `mixed` space (`subset_spaces.MixedSpace`) chooses per
sub-layer and builds its masks with `mask_from_bits`.
"""

from __future__ import annotations

from collections.abc import Sequence

from skipsearch.masks import FULL_BITS, SkipMask

PRECISIONS = {"full": FULL_BITS, "int8": 8, "int4": 4}
"""The precisions a space file names, and the bits the draft reads each at."""
SKIP = "skip"
"""A `mixed` space's choice for a sub-layer the draft does not run."""
PRECISION_PARAM = "precision"


def precision_name(bits: int) -> str:
    """`full`, `int8` or `int4`: how space files and trial params name a precision."""
    return next(name for name, value in PRECISIONS.items() if value == bits)


def uniform_bits(mask: SkipMask) -> int | None:
    """The one precision every sub-layer `mask` runs reads its weights at (`FULL_BITS` when none
    is quantized); None when they differ."""
    used = {mask.attn_bits(i) for i in range(mask.num_layers)} | {
        mask.mlp_bits(i) for i in range(mask.num_layers)
    }
    used.discard(0)
    return used.pop() if len(used) == 1 else None if used else FULL_BITS


def precision_label(mask: SkipMask) -> str:
    """`full`, `int8`, `int4`, or `mixed`: the precision of the draft's kept sub-layers."""
    bits = uniform_bits(mask)
    return "mixed" if bits is None else precision_name(bits)


def skips_of(mask: SkipMask) -> SkipMask:
    """`mask`'s skips alone, every kept sub-layer at full precision."""
    return SkipMask(mask.num_layers, mask.attn, mask.mlp)


def with_bits(mask: SkipMask, bits: int) -> SkipMask:
    """`mask`'s skips with every sub-layer it keeps at `bits` (its own precisions dropped)."""
    if bits == FULL_BITS:
        return skips_of(mask)
    kept = range(mask.num_layers)
    attn = frozenset(i for i in kept if i not in mask.attn)
    mlp = frozenset(i for i in kept if i not in mask.mlp)
    return SkipMask(mask.num_layers, mask.attn, mask.mlp, **{f"attn_int{bits}": attn, f"mlp_int{bits}": mlp})


def mask_from_bits(num_layers: int, attn: Sequence[int], mlp: Sequence[int]) -> SkipMask:
    """The mask whose layer `l` reads its attention at `attn[l]` bits and its MLP at `mlp[l]` (0: skipped)."""
    chosen: dict[str, set[int]] = {}
    for kind, bits_of in (("attn", attn), ("mlp", mlp)):
        for layer, bits in enumerate(bits_of):
            if bits != FULL_BITS:
                chosen.setdefault(kind if bits == 0 else f"{kind}_int{bits}", set()).add(layer)
    return SkipMask(num_layers, **{name: frozenset(layers) for name, layers in chosen.items()})
