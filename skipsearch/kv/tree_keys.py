"""Which keys each row of a token tree's pass sees (docs/drafts.md, "Token trees").

A tree's nodes sit in consecutive cache slots from the root's (`base`), in draft order, so a
node's ancestors are earlier slots but not all earlier slots are its ancestors: the causal mask
does not hold. Each row sees the prefix (slots before `base`) and the slots `base + j` of its
ancestors and itself: at most 32 slots (a verify of `tree_shapes.MAX_NODES + 1` rows), one bit each.

`TreeKeys` gives the same mask two ways: `bits`, one 32-bit pattern a row, which the float32
decode-attention kernel reads in place of causality (`cpu.decode_attention`, the fused layers),
and `dense`, the boolean mask the modules' SDPA reads where the kernel does not run (built only
then: a pass on the kernel never pays for it). A KV
pattern's sink and window restrict the prefix in both, measured from the row's position (the
root's plus its depth), as they restrict a chain draft's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from skipsearch.masks import KVPattern

MAX_SLOTS = 32  # bits of a row's pattern


@dataclass(frozen=True)
class TreeKeys:
    """A tree pass's mask over `keys` slots: each row sees the prefix (slots before `base`, under
    `pattern`'s sink and window from position `base + depths[i]`) and the slots `base + j` for `j`
    in `ancestors[i]`. `bits` (int32 `[rows]`, bit j: slot `base + j`) is what the kernel reads;
    `dense`, the boolean `[1, 1, rows, keys]` (True where the row attends), is built on first use,
    where a pass leaves the kernel."""

    base: int
    ancestors: tuple[tuple[int, ...], ...]
    depths: tuple[int, ...]
    keys: int
    device: torch.device
    pattern: KVPattern | None = None

    def __post_init__(self) -> None:
        if self.keys - self.base > MAX_SLOTS or any(
            j >= self.keys - self.base for row in self.ancestors for j in row
        ):
            raise ValueError(
                f"a tree pass covers {self.keys - self.base} slots, over the {MAX_SLOTS} a row's bits hold"
            )

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
        return cls(base, tuple(tuple(row) for row in rows), tuple(depths), keys, device, pattern)

    @cached_property
    def bits(self) -> torch.Tensor:
        patterns = [sum(1 << j for j in row) for row in self.ancestors]
        return torch.tensor(patterns, dtype=torch.int64).to(torch.int32)  # two's complement keeps bit 31

    @cached_property
    def dense(self) -> torch.Tensor:
        allowed = torch.zeros(self.rows, self.keys, dtype=torch.bool)
        slots = torch.arange(self.base)
        for i, row in enumerate(self.ancestors):
            position = self.base + self.depths[i]
            allowed[i, : self.base] = True if self.pattern is None else self.pattern.sees(slots, position)
            allowed[i, [self.base + j for j in row]] = True
        return allowed[None, None].to(self.device)

    def rows_from(self, first: int) -> TreeKeys:
        """The mask of rows `first ..` alone (a verify's leaves, over the same keys)."""
        return TreeKeys(
            self.base, self.ancestors[first:], self.depths[first:], self.keys, self.device, self.pattern
        )

    @property
    def rows(self) -> int:
        return len(self.ancestors)
