"""Whether a draft pays off: the rule a run's verdict applies to the speedup its cost model predicts.

A predicted speedup below `PAYS_OFF` is too small to survive what the cost model leaves out
(sampling, cache bookkeeping); at or above it, the draft is worth deploying (docs/theory.md,
"When SSD does not pay"). The rule judges the best draft by the cost model the run ranked with,
or, where the run's finalists were re-scored exactly by the rounds estimator, by that exact score.
Pure arithmetic: how the verdict reads is `run.summary_text`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PAYS_OFF = 1.05  # below this predicted speedup, overheads the model ignores eat the gain


@dataclass(frozen=True)
class Verdict:
    """The best draft's speedup the verdict judges by; `cost`: the cost model that priced it
    (`closed-form` or `calibrated`); `exact_gamma`: the γ of its exact re-score (None: the
    search's own prediction)."""

    speedup: float
    cost: str
    exact_gamma: int | None = None

    @property
    def pays(self) -> bool:
        return self.speedup >= PAYS_OFF


def judge(
    cost: str,
    predicted: Mapping[str, float | None],
    exact: float | None = None,
    exact_gamma: int | None = None,
) -> Verdict:
    """The verdict on a draft: `predicted` holds its speedup by each cost model (`closed_form`,
    `calibrated`), of which `cost` is the one the run ranked by; an `exact` re-score at
    `exact_gamma` replaces that prediction."""
    if exact is not None:
        return Verdict(float(exact), cost, exact_gamma)
    speedup = predicted[cost.replace("-", "_")]
    if speedup is None:
        raise ValueError(f"no {cost} prediction to judge: the run ranked by a cost model it did not price")
    return Verdict(float(speedup), cost)
