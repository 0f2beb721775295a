"""The synthetic landscape (a fixed damage per sub-layer) and a counting evaluator: search tests with exact
answers and no model."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.executors.base import LocalExecutor
from skipsearch.masks import SkipMask
from skipsearch.search import (
    EvaluationCache,
    Score,
    SearchConfig,
    Strategy,
    StudyOutcome,
    make_strategy,
    run_study,
)
from skipsearch.search.space_files import load_space
from skipsearch.search.spaces import ConcreteSpace


def write_space(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


NUM_LAYERS = 12

_DAMAGE = np.random.default_rng(123)

ATTN_DAMAGE = _DAMAGE.lognormal(-2.5, 1.2, NUM_LAYERS)

MLP_DAMAGE = _DAMAGE.lognormal(-2.5, 1.2, NUM_LAYERS)

DRAWS = np.random.default_rng(7).random((4, 64))

GAMMAS = range(1, 7)


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal fsyncs every write: ~90% of these tests' time. A killed process loses no
    written data without it (the page cache outlives the process); only power loss would."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def synthetic_profile(mask: SkipMask) -> AcceptanceProfile:
    """Each skipped sub-layer costs its damage, one at int8 or int4 `2^-bits` of it."""
    damage = sum(ATTN_DAMAGE[i] for i in mask.attn) + sum(MLP_DAMAGE[i] for i in mask.mlp)
    for bits in (8, 4):
        damage += 2.0**-bits * sum(ATTN_DAMAGE[i] for i in getattr(mask, f"attn_int{bits}"))
        damage += 2.0**-bits * sum(MLP_DAMAGE[i] for i in getattr(mask, f"mlp_int{bits}"))
    accept = float(np.exp(-damage))
    matches = tuple(tuple(bool(d < accept) for d in row) for row in DRAWS)
    return AcceptanceProfile(str(mask), matches, tuple((accept,) * len(row) for row in DRAWS), 0.0)


def synthetic_score(mask: SkipMask, profile: AcceptanceProfile) -> Score:
    """Closed-form SSD speedup (docs/theory.md, "Speedup") at the best gamma."""
    per_gamma = {g: profile.tokens_per_round(g) / (g * mask.r_draft() + 1 - mask.r_reuse) for g in GAMMAS}
    gamma = max(per_gamma, key=per_gamma.__getitem__)
    return Score(per_gamma[gamma], gamma, per_gamma, {"alpha": profile.alpha})


@dataclass
class CountingEvaluator:
    """Counts calls; optionally logs them to a file and hangs (to be killed) at call `hang_at`."""

    log: Path | None = None
    hang_at: int | None = None
    calls: list[str] = field(default_factory=list)

    def __call__(self, mask: SkipMask) -> AcceptanceProfile:
        self.calls.append(str(mask))
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(f"{mask}\n")
        if self.hang_at is not None and len(self.calls) == self.hang_at:
            (self.log or Path()).with_suffix(".hanging").touch()
            time.sleep(600)
        return synthetic_profile(mask)


def search(
    run_dir: Path,
    strategy: Strategy | str,
    evaluate: CountingEvaluator,
    *,
    space: ConcreteSpace | str = "sparse",
    cache_dir: Path | None = None,
    resume: bool = False,
    **config: Any,
) -> StudyOutcome:
    """One study with the synthetic scorer: the tests' (and the crash subprocess's) entry point."""
    if isinstance(space, str):
        space = load_space(space).resolve(NUM_LAYERS)
    if isinstance(strategy, str):
        strategy = make_strategy(strategy)
    cache = EvaluationCache(cache_dir) if cache_dir else None
    with LocalExecutor(evaluate) as executor:
        return run_study(
            space,
            strategy,
            executor,
            synthetic_score,
            run_dir,
            SearchConfig(**{"budget": 20, **config}),
            cache=cache,
            resume=resume,
        )
