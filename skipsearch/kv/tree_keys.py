"""Which keys each row of a token tree's pass sees (docs/drafts.md, "Token trees").

A tree's nodes sit in consecutive cache slots from the root's (`base`), in draft order, so a
node's ancestors are earlier slots but not all earlier slots are its ancestors: the causal mask
does not hold. Each row sees the prefix (slots before `base`) and the slots `base + j` of its
ancestors and itself: at most 32 slots (a verify of `trees.MAX_NODES + 1` rows), one bit each.

`TreeKeys` carries the same mask twice: `bits`, one 32-bit pattern a row, which the float32
decode-attention kernel reads in place of causality (`cpu.decode_attention`, the fused layers),
and `dense`, the boolean mask the modules' SDPA reads where the kernel does not run. A KV
pattern's sink and window restrict the prefix in both, measured from the row's position (the
root's plus its depth), as they restrict a chain draft's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skipsearch.masks import KVPattern

MAX_SLOTS = 32  # bits of a row's pattern


@dataclass(frozen=True)
class TreeKeys:
    """A tree pass's mask: rows' `bits` (int32 `[rows]`, bit j: slot `base + j`), the `dense`
    boolean `[1, 1, rows, keys]` (True where the row attends), and the `pattern` whose sink and
    window `dense` folds in (None: the whole prefix)."""

    base: int
    bits: torch.Tensor
    dense: torch.Tensor
    pattern: KVPattern | None = None

    @classmethod
    def build(
        cls,
        base: int,
        rows: Sequence[Sequence[int]],
        depths: Sequence[int],
        keys: int,
        device: torch.device,
        pattern: KVPattern | None = None,
    ) -> TreeKeys:
        """The mask of rows that see slots `base + j` for `j` in `rows[i]` (relative slots,
        < `MAX_SLOTS`) and the prefix `0 .. base - 1` (its sink and window where `pattern` is
        given, from position `base + depths[i]`), over `keys` slots."""
        if keys - base > MAX_SLOTS or any(j >= keys - base for row in rows for j in row):
            raise ValueError(
                f"a tree pass covers {keys - base} slots, over the {MAX_SLOTS} a row's bits hold"
            )
        bits = torch.tensor([sum(1 << j for j in row) for row in rows], dtype=torch.int64).to(
            torch.int32
        )  # two's complement: bit 31 stays bit 31
        allowed = torch.zeros(len(rows), keys, dtype=torch.bool)
        slots = torch.arange(base)
        for i, row in enumerate(rows):
            allowed[i, :base] = True if pattern is None else pattern.sees(slots, base + depths[i])
            for j in row:
                allowed[i, base + j] = True
        return cls(base, bits, allowed[None, None].to(device), pattern)

    @property
    def rows(self) -> int:
        return self.bits.shape[0]
