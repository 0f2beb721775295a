"""Run configuration: what to measure (a MeasureConfig) and how to search.

Import-light on purpose (no torch): the CLI validates a whole configuration before it loads a
model, and `run.yaml` in every run directory is this dataclass written out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from skipsearch.acceptance.importance import IMPORTANCE_SOURCES
from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, kv_label, parse_draft_vocab, vocab_label
from skipsearch.store import write_text_atomic


def check_context(context: int | None) -> None:
    """A scoring context is a positive number of tokens (None: the default)."""
    if context is not None and context < 1:
        raise ConfigError(
            f"--context must be a positive number of tokens, got {context}: pass --context >= 1"
        )


def check_graphs(device: str) -> None:
    """A profile of CUDA-graph replays (`--graphs`) is measured, and scored with, on a GPU only:
    refused elsewhere in one line, before any model loads."""
    if device.split(":", 1)[0] != "cuda":
        raise ConfigError(
            f"--graphs: CUDA graphs need a GPU, and --device is {device}: use --device cuda, or drop --graphs"
        )


@dataclass(frozen=True)
class RunConfig:
    """One search run; `budget` is the number of distinct masks measured.

    `draft_vocab`: the draft vocabularies each mask is scored with (None in it: the full one);
    None until the run resolves it from the space file or `--draft-vocab` (`run.pipeline`).
    `kv`: the KV patterns each mask is scored with (None in it: every key), resolved the same way
    from the space file's `kv:` or `--kv-window`.
    `context`: the context length the calibrated cost model scores at (None: its default);
    `importance`: what ranks sub-layers for the ranking and knapsack strategies (`proxy`, from the
    reference cache, or `measured`, one single-unit mask per free unit, counted in the budget).
    `graphs`: score with the latency profile of CUDA-graph replays (`skipsearch profile --graphs`),
    what a graphed engine pays, instead of the eager one.
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
    draft_vocab: tuple[int | None, ...] | None = None
    kv: tuple[KVPattern | None, ...] | None = None
    context: int | None = None
    extrapolate_context: bool = False
    importance: str = "proxy"
    graphs: bool = False

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ConfigError(f"--budget must be a positive number of evaluations, got {self.budget}")
        if self.gamma_max < 1:
            raise ConfigError(f"--gamma-max must be >= 1, got {self.gamma_max}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        check_context(self.context)
        if self.graphs:
            check_graphs(self.measure.device)
        if self.importance not in IMPORTANCE_SOURCES:
            raise ConfigError(
                f"unknown importance {self.importance!r}: use one of {', '.join(IMPORTANCE_SOURCES)}"
            )

    def with_budget(self, budget: int) -> RunConfig:
        return replace(self, budget=budget)

    def to_dict(self) -> dict:
        labels = None if self.draft_vocab is None else [vocab_label(k) for k in self.draft_vocab]
        patterns = None if self.kv is None else [kv_label(kv) for kv in self.kv]
        return {**asdict(self), "measure": self.measure.to_dict(), "draft_vocab": labels, "kv": patterns}

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """Reads run.yaml files written before draft vocabularies or KV patterns existed too
        (`draft_vocab`, `kv` absent)."""
        labels, patterns = data.get("draft_vocab"), data.get("kv")
        return cls(
            **{
                **data,
                "measure": MeasureConfig.from_dict(data["measure"]),
                "draft_vocab": None if labels is None else tuple(parse_draft_vocab(k) for k in labels),
                "kv": None if patterns is None else tuple(KVPattern.parse(kv) for kv in patterns),
            }
        )

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
