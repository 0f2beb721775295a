"""The tier policy: which tier drafts the next round, from recent acceptance (docs/theory.md, "Tier
sets and CUDA graphs").

Pure and shared: the engine runs `TierController` while decoding, the simulation runs the very
same controller over the calibration trajectories, so what is scored is what is decoded.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from skipsearch.errors import ConfigError


@dataclass(frozen=True)
class TierPolicy:
    """Runtime tier choice: over the last `window` rounds, acceptance at or above
    `thresholds[i]` moves the draft to tier `i + 1` (tier 0 skips least)."""

    window: int
    thresholds: tuple[float, ...]


def check_policy(policy: TierPolicy, num_tiers: int) -> None:
    """The rules the tiers YAML enforces, for policies that come from elsewhere (a manifest, a search)."""
    if not 2 <= num_tiers <= 4:
        raise ConfigError(f"a tier set has 2..4 tiers, got {num_tiers}: drop or add masks")
    thresholds = policy.thresholds
    if (
        len(thresholds) != num_tiers - 1
        or not all(0 < t < 1 for t in thresholds)
        or any(a >= b for a, b in itertools.pairwise(thresholds))
    ):
        raise ConfigError(
            f"tier policy thresholds {list(thresholds)} must be {num_tiers - 1} increasing acceptance "
            "levels in (0, 1), one per tier after the first: e.g. [0.5, 0.8] for three tiers"
        )
    if policy.window < 1:
        raise ConfigError(f"tier policy window must be >= 1 round, got {policy.window}")


class TierController:
    """Picks the tier of the next round from the acceptance of the last `window` rounds.

    A round's acceptance is the share of its draft that was accepted, `n / γ`; the policy reads
    the mean over the window, each round weighted alike. (Pooling judged tokens instead, as the γ
    controller does, lets one long accepted draft outweigh several rejected ones, so a cheap tier
    that starts failing is dropped rounds too late.) The tier is the number of thresholds the
    mean reaches: tier 0 below the first, tier `i + 1` or cheaper at `thresholds[i]` or more.
    Every sequence starts at tier 0, the safest, and stays there until `window` rounds were seen;
    the window mixes rounds of whatever tier drafted them, so a cheap tier whose drafts get
    rejected drags the mean down and the policy back.
    """

    def __init__(self, policy: TierPolicy) -> None:
        self.policy = policy
        self.tier = 0
        self._rates: deque[float] = deque(maxlen=policy.window)

    @property
    def acceptance(self) -> float | None:
        return sum(self._rates) / len(self._rates) if self._rates else None

    def update(self, accepted: int, drafted: int) -> int:
        """Record one round; return the tier of the next. A round that drafted nothing is skipped."""
        if drafted > 0:
            self._rates.append(accepted / drafted)
            if len(self._rates) == self.policy.window:
                self.tier = sum(self.acceptance >= t for t in self.policy.thresholds)
        return self.tier
