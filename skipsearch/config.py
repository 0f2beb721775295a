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
from skipsearch.store import write_text_atomic

ESTIMATOR_MODES = ("shared-kv", "self")


def check_device(device: str) -> None:
    """Refuse a device this torch cannot use, in one line, before any model is loaded on it.

    Imports torch (the only torch use in this module), so callers check everything else first."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a torch device: use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"--device {device}: this torch {torch.__version__} sees no CUDA device: use --device cpu, "
                "or install a CUDA build of torch (README, Installing on a GPU)"
            )
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(f"--device {device}: only {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available here: use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device}: skipsearch runs on cpu, cuda or mps")


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
    """One search run; `budget` is the number of distinct masks measured."""

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

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ConfigError(f"--budget must be a positive number of evaluations, got {self.budget}")
        if self.gamma_max < 1:
            raise ConfigError(f"--gamma-max must be >= 1, got {self.gamma_max}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")

    def with_budget(self, budget: int) -> RunConfig:
        return replace(self, budget=budget)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        return cls(**{**data, "measure": MeasureConfig.from_dict(data["measure"])})

    def save(self, path: Path, provenance: dict) -> None:
        """Written atomically: a kill leaves the old `run.yaml` or the new one, never half of one."""
        write_text_atomic(
            path, yaml.safe_dump({"config": self.to_dict(), "provenance": provenance}, sort_keys=False)
        )

    @classmethod
    def load(cls, path: Path) -> tuple[RunConfig, dict]:
        """The config and provenance of `path`; a damaged file is one `ConfigError` naming it."""
        if not path.is_file():
            raise ConfigError(f"{path} not found: pass the directory of a `skipsearch run`")
        try:
            data = yaml.safe_load(path.read_text())
            return cls.from_dict(data["config"]), dict(data.get("provenance") or {})
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
        except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ConfigError(
                f"{path} is damaged or not a skipsearch run file ({reason}): restore it, or start a new "
                "run in another --out"
            ) from None
