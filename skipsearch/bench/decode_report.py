"""What a decode check reports, as records: one draft (`DecodeReport`) or one tier set
(`TiersReport`), each decoder's speed (`DecoderSummary`), the estimator's prediction beside the
engine (`EstimatorCheck`), the graphed comparison (`GraphedComparison`) and the round time by phase
(`engine.timing.Bucket`).

`skipsearch decode --json` writes `to_json()` and `from_json` reads it back: the one place the
records meet their JSON keys, which are the keys the reports have always had, so files written
before read the same. What another module already serialises stays its JSON: the lossless check
(`bench.lossless.LosslessCheck.to_dict`) and the per-prompt traces (`engine.result.DecodeTrace`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from skipsearch.bench.decoders import AR, AR_GRAPHS, SSD, SSD_GRAPHS
from skipsearch.engine.result import Summary
from skipsearch.engine.sampling import Sampling
from skipsearch.engine.timing import Bucket, PhaseStats
from skipsearch.masks import FULL_KV
from skipsearch.tree_shapes import Tree, as_tree


@dataclass(frozen=True)
class DecoderSummary:
    """One decoder's tokens, time and rounds (`engine.result.Summary`), with its throughput over
    the report's baseline decoder (`speedup`, written `speedup_vs_<baseline>`)."""

    tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float
    rounds: int
    acceptance: float | None
    tokens_per_round: float | None
    mean_gamma: float | None

    @classmethod
    def of(cls, summary: Summary, baseline: Summary) -> DecoderSummary:
        return cls(
            tokens=summary.tokens,
            seconds=summary.seconds,
            tokens_per_second=summary.tokens_per_second,
            speedup=summary.tokens_per_second / baseline.tokens_per_second,
            rounds=summary.rounds,
            acceptance=summary.acceptance,
            tokens_per_round=summary.tokens_per_round,
            mean_gamma=summary.mean_gamma,
        )

    def to_json(self, baseline: str) -> dict[str, Any]:
        data = asdict(self)
        speedup = data.pop("speedup")
        return {
            "tokens": data.pop("tokens"),
            "seconds": data.pop("seconds"),
            "tokens_per_second": data.pop("tokens_per_second"),
            f"speedup_vs_{baseline}": speedup,
            **data,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], baseline: str) -> DecoderSummary:
        values = dict(data)
        return cls(speedup=values.pop(f"speedup_vs_{baseline}"), **values)


def summaries_of(summaries: dict[str, Summary], baseline: str) -> dict[str, DecoderSummary]:
    """Every decoder's summary against the decoder `baseline`."""
    return {name: DecoderSummary.of(s, summaries[baseline]) for name, s in summaries.items()}


@dataclass(frozen=True)
class EstimatorCheck:
    """One estimator's acceptance and tokens per round for the engine's γ next to what the engine
    measured, and the relative error (`bench.estimate.estimator_check`); `no_prediction` says why a
    setting has none."""

    mode: str
    alpha: float
    measured_acceptance: float | None
    tokens_per_round: float | None
    no_prediction: str | None
    measured_tokens_per_round: float | None
    relative_error: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GraphedComparison:
    """The graphed decoders: SSD against the graphed baseline (the ratio a deployment gets), the
    graphed baseline against the eager one, and whether both baselines gave the same tokens."""

    mode: str
    ssd_vs_graphed_autoregressive: float
    graphed_vs_eager_autoregressive: float
    graphed_autoregressive_matches: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DecodeConditions:
    """How every decoder of one check ran, with the caveats on its timing."""

    sampling: Sampling
    prompts: int
    repeats: int
    max_new_tokens: int
    timing_caveats: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "sampling": asdict(self.sampling),
            "prompts": self.prompts,
            "repeats": self.repeats,
            "max_new_tokens": self.max_new_tokens,
            "timing_caveats": list(self.timing_caveats),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodeConditions:
        return cls(
            Sampling(**data["sampling"]),
            data["prompts"],
            data["repeats"],
            data["max_new_tokens"],
            tuple(data.get("timing_caveats", ())),
        )


def breakdown_json(buckets: tuple[Bucket, ...]) -> list[dict[str, Any]]:
    return [b.to_dict() for b in buckets]


def breakdown_from_json(data: list[dict[str, Any]]) -> tuple[Bucket, ...]:
    return tuple(Bucket(**{**b, "phases": tuple(PhaseStats(**p) for p in b["phases"])}) for b in data or ())


@dataclass(frozen=True)
class DecodeReport:
    """One draft against autoregressive decoding, HF `generate` and (for a contiguous prefix) HF's
    early exit (`bench.decode.decode_draft`). `summaries` are against HF `generate` (`BASELINE`);
    `speedup` is what the draft buys over autoregressive decoding on the same kernels (on CUDA
    graphs where the decode ran them). `tree`: None for a chain of `gamma`."""

    BASELINE: ClassVar[str] = "hf"

    model: str
    mask: str
    draft_vocab: int | str
    kv: str
    exit_layer: int | None
    gamma: int
    tree: Tree | None
    dynamic_gamma: bool
    draft_stop: float
    random_weights: bool
    kernel_plan_line: str
    kernel_plan: str
    conditions: DecodeConditions
    summaries: dict[str, DecoderSummary]
    estimators: tuple[EstimatorCheck, ...]
    lossless: bool
    lossless_check: dict[str, Any] = field(repr=False)
    hf_matches_autoregressive: bool | None
    breakdown: tuple[Bucket, ...] = field(repr=False)
    graphs: GraphedComparison | None
    runs: dict[str, list[dict[str, Any]]] = field(repr=False)

    @property
    def candidate(self) -> DecoderSummary:
        """The SSD decode checked lossless: the graphed one where the decode ran graphs."""
        return self.summaries[SSD if self.graphs is None else SSD_GRAPHS]

    @property
    def speedup(self) -> float:
        """SSD's tokens per second over autoregressive decoding's, on the same kernels."""
        baseline = self.summaries[AR if self.graphs is None else AR_GRAPHS]
        return self.candidate.tokens_per_second / baseline.tokens_per_second

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mask": self.mask,
            "draft_vocab": self.draft_vocab,
            "kv": self.kv,
            "exit_layer": self.exit_layer,
            "gamma": self.gamma,
            "tree": None if self.tree is None else str(self.tree),
            "dynamic_gamma": self.dynamic_gamma,
            "draft_stop": self.draft_stop,
            "random_weights": self.random_weights,
            "kernel_plan_line": self.kernel_plan_line,
            "kernel_plan": self.kernel_plan,
            **self.conditions.to_json(),
            "summaries": {name: s.to_json(self.BASELINE) for name, s in self.summaries.items()},
            "estimators": [e.to_json() for e in self.estimators],
            "lossless": self.lossless,
            "lossless_check": self.lossless_check,
            "hf_matches_autoregressive": self.hf_matches_autoregressive,
            "breakdown": breakdown_json(self.breakdown),
            "graphs": None if self.graphs is None else self.graphs.to_json(),
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodeReport:
        graphs = data.get("graphs")
        return cls(
            model=data["model"],
            mask=data["mask"],
            draft_vocab=data["draft_vocab"],
            kv=data.get("kv", FULL_KV),
            exit_layer=data.get("exit_layer"),
            gamma=data["gamma"],
            tree=as_tree(data.get("tree")),
            dynamic_gamma=data.get("dynamic_gamma", False),
            draft_stop=data.get("draft_stop", 0.0),
            random_weights=data.get("random_weights", False),
            kernel_plan_line=data.get("kernel_plan_line", ""),
            kernel_plan=data.get("kernel_plan", ""),
            conditions=DecodeConditions.from_json(data),
            summaries={n: DecoderSummary.from_json(s, cls.BASELINE) for n, s in data["summaries"].items()},
            estimators=tuple(EstimatorCheck(**e) for e in data.get("estimators", ())),
            lossless=data["lossless"],
            lossless_check=data["lossless_check"],
            hf_matches_autoregressive=data.get("hf_matches_autoregressive"),
            breakdown=breakdown_from_json(data.get("breakdown", [])),
            graphs=None if graphs is None else GraphedComparison(**graphs),
            runs=data.get("runs", {}),
        )


@dataclass(frozen=True)
class TiersReport:
    """A tier set against autoregressive decoding and the set's best single mask
    (`bench.decode.decode_tiers`): `summaries` against `baseline` (the graphed autoregressive decode
    on CUDA graphs, the eager one otherwise), how often each tier drafted (`tier_share`) and the
    tier simulation's prediction (`predicted`, as the tier set's file holds it)."""

    model: str
    manifest: str
    tiers: tuple[str, ...]
    window: int
    thresholds: tuple[float, ...]
    gammas: tuple[int, ...]
    best_single: dict[str, Any]
    mode: str
    eager_reason: str | None
    conditions: DecodeConditions
    baseline: str
    summaries: dict[str, DecoderSummary]
    tier_share: tuple[float, ...]
    predicted: dict[str, Any]
    lossless: bool
    lossless_check: dict[str, Any] = field(repr=False)
    breakdown: tuple[Bucket, ...] = field(repr=False)
    runs: dict[str, list[dict[str, Any]]] = field(repr=False)
    tier_runs: list[list[int]] = field(repr=False)

    SUMMARY_BASELINE: ClassVar[str] = "autoregressive"

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "manifest": self.manifest,
            "tiers": list(self.tiers),
            "policy": {"window": self.window, "thresholds": list(self.thresholds)},
            "gammas": list(self.gammas),
            "best_single": self.best_single,
            "mode": self.mode,
            "eager_reason": self.eager_reason,
            **self.conditions.to_json(),
            "baseline": self.baseline,
            "summaries": {n: s.to_json(self.SUMMARY_BASELINE) for n, s in self.summaries.items()},
            "tier_share": list(self.tier_share),
            "predicted": self.predicted,
            "lossless": self.lossless,
            "lossless_check": self.lossless_check,
            "breakdown": breakdown_json(self.breakdown),
            "runs": self.runs,
            "tier_runs": self.tier_runs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TiersReport:
        summaries = data["summaries"].items()
        return cls(
            model=data["model"],
            manifest=data["manifest"],
            tiers=tuple(data["tiers"]),
            window=data["policy"]["window"],
            thresholds=tuple(data["policy"]["thresholds"]),
            gammas=tuple(data["gammas"]),
            best_single=data["best_single"],
            mode=data["mode"],
            eager_reason=data.get("eager_reason"),
            conditions=DecodeConditions.from_json(data),
            baseline=data["baseline"],
            summaries={n: DecoderSummary.from_json(s, cls.SUMMARY_BASELINE) for n, s in summaries},
            tier_share=tuple(data["tier_share"]),
            predicted=data["predicted"],
            lossless=data["lossless"],
            lossless_check=data["lossless_check"],
            breakdown=breakdown_from_json(data.get("breakdown", [])),
            runs=data.get("runs", {}),
            tier_runs=data.get("tier_runs", []),
        )
