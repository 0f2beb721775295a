"""Draft length γ per round: fixed, or adapted to recent acceptance like congestion control.

docs/theory.md, "Dynamic γ": keep the acceptance of the last 64 judged draft tokens; above 0.85
raise γ by one, below 0.7 lower it by one, γ in [2, 8]. Mixed traffic makes any fixed γ wrong for
half the requests. When speculation stops paying, switch it off and decode plainly. The default
switch-off threshold is the break-even acceptance of the smallest draft: at γ = 2 and draft cost c =
0.3, `E(γ) / (γ c + 1) = (1 + α + α²) / 1.6 = 1` gives α ≈ 0.42 (docs/theory.md, "Speedup").

Within a round, a draft may also stop early (`stop_below`, docs/theory.md, "The confidence stop"):
after a draft token its own probability puts below τ, the round goes to verify with the drafts it
has. A draft unsure of its token is often rejected, and every draft step after a rejection is
wasted; the stop depends only on the draft, so the output stays lossless.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from skipsearch.errors import ConfigError


@dataclass(frozen=True)
class GammaPolicy:
    """How the draft length evolves; `GammaPolicy.fixed(γ)` never changes it.

    `stop_below` τ ends a round after a draft token whose probability under the draft is below τ
    (0: never); γ is then the most drafts a round makes.
    """

    initial: int = 3
    gamma_min: int = 2
    gamma_max: int = 8
    window: int = 64
    raise_above: float = 0.85
    lower_below: float = 0.70
    off_below: float | None = 0.40
    min_samples: int = 16
    stop_below: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.stop_below < 1:
            raise ConfigError(
                f"the draft's stop threshold must be in [0, 1), got {self.stop_below}: "
                "0 never stops a round early"
            )
        if self.gamma_min < 1:
            raise ConfigError(f"gamma must be >= 1, got a minimum of {self.gamma_min}")
        if not self.gamma_min <= self.initial <= self.gamma_max:
            raise ConfigError(
                f"initial gamma {self.initial} is outside [{self.gamma_min}, {self.gamma_max}]: "
                "pick a gamma inside the controller's range"
            )
        if not 0 <= self.lower_below <= self.raise_above <= 1:
            raise ConfigError(
                f"thresholds must satisfy 0 <= lower ({self.lower_below}) <= raise ({self.raise_above}) <= 1"
            )
        if self.off_below is not None and not 0 <= self.off_below <= self.lower_below:
            raise ConfigError(
                f"switch-off threshold {self.off_below} must be in [0, lower threshold {self.lower_below}]"
            )
        if not 1 <= self.min_samples <= self.window:
            raise ConfigError(f"min_samples must be in [1, window={self.window}], got {self.min_samples}")

    @classmethod
    def fixed(cls, gamma: int, stop_below: float = 0.0) -> GammaPolicy:
        return cls(initial=gamma, gamma_min=gamma, gamma_max=gamma, off_below=None, stop_below=stop_below)

    @property
    def is_fixed(self) -> bool:
        """The controller never changes γ (a round may still stop early: `stops_early`)."""
        return self.gamma_min == self.gamma_max and self.off_below is None

    @property
    def stops_early(self) -> bool:
        return self.stop_below > 0


class GammaController:
    """Additive increase / additive decrease of γ on a sliding window of judged draft tokens.

    A round that accepts `n` of `γ` drafted tokens judged `n` matches and, when `n < γ`, one
    rejection; tokens after the first rejection were never judged. The window's mean is then the
    per-token acceptance α of docs/theory.md, "Measuring acceptance". Once switched off (γ = 0),
    decoding stays plain for the rest of the sequence: no draft runs, so no new evidence could
    switch it back on.
    """

    def __init__(self, policy: GammaPolicy) -> None:
        self.policy = policy
        self.gamma = policy.initial
        self.outcomes: deque[bool] = deque(maxlen=policy.window)

    @property
    def acceptance(self) -> float | None:
        """Mean of the window, or None before any draft token was judged."""
        return sum(self.outcomes) / len(self.outcomes) if self.outcomes else None

    def update(self, accepted: int, drafted: int) -> int:
        """Record one round and return the next round's γ (0 = speculation switched off)."""
        if drafted == 0 or self.gamma == 0:
            return self.gamma
        self.outcomes.extend([True] * accepted + [False] * (accepted < drafted))
        policy = self.policy
        rate = self.acceptance
        if rate is None or len(self.outcomes) < policy.min_samples:
            return self.gamma
        if policy.off_below is not None and rate < policy.off_below:
            self.gamma = 0
        elif rate > policy.raise_above:
            self.gamma = min(self.gamma + 1, policy.gamma_max)
        elif rate < policy.lower_below:
            self.gamma = max(self.gamma - 1, policy.gamma_min)
        return self.gamma
