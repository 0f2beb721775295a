"""Serving memory (docs/theory.md, "Serving memory"): the batch-size gain `β` of holding one set of
weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

from skipsearch.errors import ConfigError

# -- serving memory (docs/theory.md, "Serving memory") ------------------------------------------


@dataclass(frozen=True)
class MemoryBudget:
    """Accelerator memory for serving, in any one unit (bytes, GiB): what bounds the batch size.

    Whatever the weights leave free holds KV caches, so `B_max = (M_total - M_weight) / kv per
    sequence`, rounded down: SD holds `M_big + M_draft`, SSD only `M_big`.
    """

    total: float
    big_weights: float
    draft_weights: float
    kv_per_sequence: float

    def __post_init__(self) -> None:
        for name in ("total", "big_weights", "kv_per_sequence"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"memory {name} must be > 0, got {getattr(self, name)}")
        if not self.draft_weights >= 0:
            raise ConfigError(f"memory draft_weights must be >= 0, got {self.draft_weights}")

    def max_batch(self, weights: float) -> int:
        """Sequences whose KV cache fits beside `weights`; at least one must, or nothing can serve."""
        batch = math.floor((self.total - weights) / self.kv_per_sequence)
        if batch < 1:
            raise ConfigError(
                f"weights of {weights} leave {self.total - weights} of {self.total} memory, less than one "
                f"sequence's KV cache ({self.kv_per_sequence}): use more memory, a smaller model or "
                "shorter sequences"
            )
        return batch

    @property
    def batch_sd(self) -> int:
        return self.max_batch(self.big_weights + self.draft_weights)

    @property
    def batch_ssd(self) -> int:
        return self.max_batch(self.big_weights)

    @property
    def beta(self) -> float:
        """`β = B_max^SSD / B_max^SD >= 1`: the batch-size gain of holding one set of weights."""
        return self.batch_ssd / self.batch_sd


def throughput_ratio(memory: MemoryBudget, speedup_ssd: float, speedup_sd: float) -> float:
    """Throughput of SSD over SD when both serve their largest batch: `β × S_SSD / S_SD`."""
    if not (speedup_ssd > 0 and speedup_sd > 0):
        raise ConfigError(f"speedups must be > 0, got SSD {speedup_ssd} and SD {speedup_sd}")
    return memory.beta * speedup_ssd / speedup_sd
