"""Run configuration: what to measure (model, prompts, estimator) and how to search.

Import-light on purpose (no torch): the CLI validates a whole configuration before it loads a
model, and `run.yaml` in every run directory is this dataclass written out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.errors import ConfigError

ESTIMATOR_MODES = ("shared-kv", "self")
IMPORTANCE_SOURCES = ("proxy", "measured")


@dataclass(frozen=True)
class MeasureConfig:
    """What defines a measurement: the model, the prompts and the estimator mode."""

    model: str = "smollm2-135m"
    prompts: PromptSpec = field(default_factory=PromptSpec)
    mode: str = "shared-kv"
    device: str = "cpu"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in ESTIMATOR_MODES:
            raise ConfigError(
                f"unknown estimator mode {self.mode!r}: use one of {', '.join(ESTIMATOR_MODES)}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MeasureConfig:
        return cls(**{**data, "prompts": PromptSpec.from_dict(data["prompts"])})


@dataclass(frozen=True)
class RunConfig:
    """One search run; `budget` is the number of distinct masks measured.

    `context`: the context length the calibrated cost model scores at (None: its default);
    `importance`: what ranks sub-layers for the ranking and knapsack strategies (`proxy`, from the
    reference cache, or `measured`, one single-unit mask per free unit, counted in the budget).
    """

    measure: MeasureConfig = field(default_factory=MeasureConfig)
    space: str = "sparse"
    strategy: str = "learned"
    sampler: str = "tpe"
    budget: int = 60
    seed: int = 0
    gamma_max: int = 8
    objective: str = "speedup"
    cost: str = "closed-form"
    pareto: bool = False
    warm_start: bool = False
    temperature: float = 1.0
    context: int | None = None
    extrapolate_context: bool = False
    importance: str = "proxy"

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ConfigError(f"--budget must be a positive number of evaluations, got {self.budget}")
        if self.gamma_max < 1:
            raise ConfigError(f"--gamma-max must be >= 1, got {self.gamma_max}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if self.context is not None and self.context < 1:
            raise ConfigError(f"--context must be a positive number of tokens, got {self.context}")
        if self.importance not in IMPORTANCE_SOURCES:
            raise ConfigError(
                f"unknown importance {self.importance!r}: use one of {', '.join(IMPORTANCE_SOURCES)}"
            )

    def with_budget(self, budget: int) -> RunConfig:
        return replace(self, budget=budget)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        return cls(**{**data, "measure": MeasureConfig.from_dict(data["measure"])})

    def save(self, path: Path, provenance: dict) -> None:
        path.write_text(yaml.safe_dump({"config": self.to_dict(), "provenance": provenance}, sort_keys=False))

    @classmethod
    def load(cls, path: Path) -> tuple[RunConfig, dict]:
        if not path.is_file():
            raise ConfigError(f"{path} not found: pass the directory of a `skipsearch run`")
        data = yaml.safe_load(path.read_text())
        return cls.from_dict(data["config"]), data.get("provenance", {})
