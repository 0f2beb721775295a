"""Reading a study back: one `TrialRecord` per scored trial, the trials table, best and Pareto front.

Records are rebuilt from the Optuna user attrs the study loop writes, so a run directory (or
optuna-dashboard) is all one needs; infeasible and failed trials are bookkeeping and left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from skipsearch.masks import SkipMask

DETAIL_PREFIX = "detail_"


@dataclass(frozen=True)
class TrialRecord:
    """One scored trial. `repeat` marks a mask the study had already scored (it cost nothing)."""

    number: int
    mask: str
    num_layers: int
    score: float
    gamma_best: int
    per_gamma: Mapping[int, float]
    r_draft: float
    strategy: str
    origin: str
    cache_hit: bool
    repeat: bool
    eval_seconds: float
    details: Mapping[str, Any]

    @property
    def skip_mask(self) -> SkipMask:
        return SkipMask.parse(self.mask, self.num_layers)

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialRecord:
        attrs = trial.user_attrs
        return cls(
            number=trial.number,
            mask=attrs["mask"],
            num_layers=attrs["num_layers"],
            score=attrs["score"],
            gamma_best=attrs["gamma_best"],
            per_gamma={int(g): v for g, v in attrs["per_gamma"].items()},
            r_draft=attrs["r_draft"],
            strategy=attrs["strategy"],
            origin=attrs["origin"],
            cache_hit=attrs["cache_hit"],
            repeat=attrs["repeat"],
            eval_seconds=attrs["eval_seconds"],
            details={
                k.removeprefix(DETAIL_PREFIX): v for k, v in attrs.items() if k.startswith(DETAIL_PREFIX)
            },
        )

    def row(self) -> dict[str, Any]:
        """Flat columns for the trials table: `gamma_<g>` per draft length, then each detail by
        name (`detail_<name>` where the name is already a column)."""
        row = {k: v for k, v in vars(self).items() if k not in ("per_gamma", "details")}
        row.update({f"gamma_{g}": v for g, v in sorted(self.per_gamma.items())})
        row.update({(f"{DETAIL_PREFIX}{k}" if k in row else k): v for k, v in self.details.items()})
        return row


def trial_records(study: optuna.Study) -> list[TrialRecord]:
    """Every scored trial (repeats included), in trial order."""
    return [
        TrialRecord.from_trial(t)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("feasible")
    ]


def study_trials_frame(study: optuna.Study) -> pd.DataFrame:
    """The trials table: one row per scored trial; `repeat` rows cost no budget."""
    return pd.DataFrame([r.row() for r in trial_records(study)])


def best_trial(study: optuna.Study) -> TrialRecord | None:
    """The highest-scoring trial (the first one on a tie); None before any is scored."""
    return max(trial_records(study), key=lambda r: (r.score, -r.number), default=None)


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """Masks no other beats on both speed (score, higher) and cost (r_draft, lower), cheapest first.

    Computed from the records, so single-objective studies have a front too; each mask once.
    """
    unique = [r for r in trial_records(study) if not r.repeat]
    front = [
        r
        for r in unique
        if not any(
            o.score >= r.score and o.r_draft <= r.r_draft and (o.score, o.r_draft) != (r.score, r.r_draft)
            for o in unique
        )
    ]
    return sorted(front, key=lambda r: (r.r_draft, -r.score, r.number))
