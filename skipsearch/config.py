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
from skipsearch.options import check
from skipsearch.store import write_text_atomic
from skipsearch.tree_shapes import parse_tree


def check_context(context: int | None) -> None:
    """A scoring context is a positive number of tokens (None: the default)."""
    check("context", context)


def check_graphs(device: str) -> None:
    """A LatencyProfile of CUDA-graph replays (`--graphs`) is measured, and scored with, on a GPU only:
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
    `trees`: the token trees each draft is also scored as (`tree_shapes.TreeShape`, `tree_shapes.DynamicTree`
    strings; none: chains only), from the space file's `tree:` or `--tree`, resolved the same way.
    `context`: the context length the calibrated cost model scores at (None: its default);
    `importance`: what ranks sub-layers for the ranking and knapsack strategies (`proxy`, from the
    reference cache, or `measured`, one single-unit mask per free unit, counted in the budget).
    `graphs`: score with the LatencyProfile of CUDA-graph replays (`skipsearch profile --graphs`),
    what a graphed engine pays, instead of the eager one.
    `gamma_min`, `gamma_max`: the draft lengths a mask's best γ is chosen from; None until the run
    resolves them from the space file (`gamma_min:`, `gamma_max:`) where `--gamma-max` left them.
    Every number is checked against its declared bound (`skipsearch.options`).
    """

    measure: MeasureConfig = field(default_factory=MeasureConfig)
    space: str = "sparse"
    strategy: str = "learned"
    sampler: str = "tpe"
    budget: int = 60
    seed: int = 0
    gamma_max: int | None = None
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
    gamma_min: int | None = None
    trees: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("budget", "seed", "gamma_min", "gamma_max", "temperature", "context"):
            check(name, getattr(self, name))
        if self.gamma_min is not None and self.gamma_max is not None and self.gamma_min > self.gamma_max:
            raise ConfigError(
                f"the shortest draft scored, gamma_min={self.gamma_min}, is above --gamma-max "
                f"{self.gamma_max}: pass --gamma-max {self.gamma_min} or more, or lower the space's gamma_min"
            )
        if self.graphs:
            check_graphs(self.measure.device)
        for shape in self.trees or ():
            parse_tree(shape)  # a bad shape is one line, before anything is written
        if self.importance not in IMPORTANCE_SOURCES:
            raise ConfigError(
                f"unknown importance {self.importance!r}: use one of {', '.join(IMPORTANCE_SOURCES)}"
            )

    def with_budget(self, budget: int) -> RunConfig:
        return replace(self, budget=budget)

    def to_dict(self) -> dict:
        labels = None if self.draft_vocab is None else [vocab_label(k) for k in self.draft_vocab]
        patterns = None if self.kv is None else [kv_label(kv) for kv in self.kv]
        trees = None if self.trees is None else list(self.trees)
        return {
            **asdict(self),
            "measure": self.measure.to_dict(),
            "draft_vocab": labels,
            "kv": patterns,
            "trees": trees,
        }

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
                "trees": None if data.get("trees") is None else tuple(str(s) for s in data["trees"]),
            }
        )

    def save(self, path: Path, provenance: dict, compare: CompareSettings | None = None) -> None:
        """`run.yaml`: the run's kind (`run`, or `compare` with its `CompareSettings`), every setting
        and the provenance. Written atomically: a kill leaves the old file or the new one."""
        data: dict = {"kind": RUN_KIND if compare is None else COMPARE_KIND, "config": self.to_dict()}
        if compare is not None:
            data["compare"] = compare.to_dict()
        write_text_atomic(path, yaml.safe_dump({**data, "provenance": provenance}, sort_keys=False))

    @classmethod
    def load(cls, path: Path) -> tuple[RunConfig, dict]:
        """The config and provenance of `path`; a damaged file is one `ConfigError` naming it."""
        config, provenance, _ = load_run_file(path)
        return config, provenance


RUN_KIND, COMPARE_KIND = "run", "compare"
COMPARED_STRATEGIES = (
    "random",
    "uniform",
    "ranking",
    "knapsack",
    "learned",
    "knapsack+tpe",
)  # compare's default


@dataclass(frozen=True)
class CompareSettings:
    """What a `compare` directory runs besides its `RunConfig`: the strategies side by side, the
    seeds each gets (`seed`, `seed + 1`, ...) and random search at `random_multiple` times the
    budget (0: none), stored in `run.yaml` so `compare --resume` restores them exactly."""

    strategies: tuple[str, ...]
    seeds: int = 3
    random_multiple: int = 0

    def __post_init__(self) -> None:
        check("seeds", self.seeds)
        check("random_multiple", self.random_multiple)
        if self.random_multiple == 1:
            raise ConfigError(
                "--random-multiple 1 is the budget the strategies already get: pass 0 (none) or 2 or more"
            )
        if not self.strategies:
            raise ConfigError("--strategies is empty: name at least one, e.g. --strategies random,learned")

    def to_dict(self) -> dict:
        return {
            "strategies": list(self.strategies),
            "seeds": self.seeds,
            "random_multiple": self.random_multiple,
        }

    @classmethod
    def from_dict(cls, data: dict) -> CompareSettings:
        return cls(tuple(data["strategies"]), int(data["seeds"]), int(data.get("random_multiple", 0)))

    @classmethod
    def from_labels(cls, labels: list[str], seeds: int) -> CompareSettings:
        """A `run.yaml` written before it had a kind: its provenance listed the study labels, random
        search at M times the budget as `random@Mx`."""
        multiples = [int(label[len("random@") : -1]) for label in labels if label.startswith("random@")]
        strategies = tuple(label for label in labels if not label.startswith("random@"))
        return cls(strategies, seeds, multiples[0] if multiples else 0)


def load_run_file(path: Path) -> tuple[RunConfig, dict, CompareSettings | None]:
    """`run.yaml`: the config, the provenance and, for a `compare` directory, its settings (None for
    a run); a damaged file is one `ConfigError` naming it."""
    if not path.is_file():
        raise ConfigError(f"{path} not found: pass the directory of a `skipsearch run`")
    try:
        data = yaml.safe_load(path.read_text())
        config, provenance = RunConfig.from_dict(data["config"]), dict(data.get("provenance") or {})
        kind = data.get("kind")
        if kind is None:  # written before run.yaml said its kind
            legacy = "strategies" in provenance
            compare = (
                CompareSettings.from_labels(provenance["strategies"], provenance["seeds"]) if legacy else None
            )
        elif kind in (RUN_KIND, COMPARE_KIND):
            compare = CompareSettings.from_dict(data["compare"]) if kind == COMPARE_KIND else None
        else:
            raise ValueError(f"kind {kind!r} is neither {RUN_KIND} nor {COMPARE_KIND}")
        return config, provenance, compare
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"{path} is damaged or not a skipsearch run file ({reason}): restore it, or start a new "
            "run in another --out"
        ) from None
