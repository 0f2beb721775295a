"""Tier sets: K skip masks plus a runtime policy that picks one per round (DESIGN §3, `tiers`).

A single mask has to be right for the whole sequence; code and prose alternate between easy
stretches, where a cheap draft is accepted anyway, and hard ones, where only a rich draft is.
A tier set keeps K masks (tier 0 skips least, tier K-1 most), each with its own draft length γ
(a cheap draft that is only used where it is accepted can afford longer drafts), each a fixed
shape that is pre-captured as CUDA graphs (reference 000 §7.6: multi-graph pre-capture, tier
switching on the CPU), and moves between them on the acceptance of the last `window` rounds.

Everything here is pure arithmetic. A tier set is scored by *simulating* its policy over the
calibration trajectories: every tier's AcceptanceProfile holds, per prompt and per continuation
position, whether that tier's draft matches the target (teacher-forced, so the trajectory is the
target's own greedy continuation whatever tier drafts). A round at position `k` with tier `t`
accepts the leading run of `t`'s matches from `k`, up to `γ_t`, and commits one more token — exactly
`acceptance.simulate_rounds`, with the tier chosen per round. No model work beyond evaluating each
tier's mask once, which the search's evaluation cache already did.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from skipsearch.acceptance import AcceptanceProfile
from skipsearch.costmodel import Calibrated, CostForm, LatencyProfile, SelfSpeculative, optimal_gamma
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.spaces import TierPolicy

CostModel = Callable[[SkipMask], CostForm]
"""Prices a tier's round: the closed form by default, the calibrated form with a LatencyProfile."""

MANIFEST_VERSION = 1
TIERS_FILE = "tiers.json"


def closed_form(mask: SkipMask) -> CostForm:
    """`γ r_draft + 1 - r_reuse` in autoregressive steps (reference 000 §4.3)."""
    return SelfSpeculative.from_mask(mask)


def calibrated(latency: LatencyProfile, context: float = 512) -> CostModel:
    """Round time from a device-measured LatencyProfile, in autoregressive steps (DESIGN §5)."""
    return lambda mask: Calibrated(latency, mask, context)


def cost_model(name: str, latency: LatencyProfile | None = None, context: float = 512) -> CostModel:
    """The cost form a run's `cost` setting names (`closed-form` or `calibrated`)."""
    if name == "closed-form":
        return closed_form
    if name != "calibrated":
        raise ConfigError(f"unknown cost model {name!r}: use closed-form or calibrated")
    if latency is None:
        raise ConfigError("calibrated tier costs need a latency profile: run `skipsearch profile --model M`")
    return calibrated(latency, context)


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


# -- simulation ------------------------------------------------------------------------------------
def match_runs(matches: Sequence[bool]) -> np.ndarray:
    """`runs[k]`: consecutive matches from position `k` (0 at a mismatch), so a round is O(1)."""
    runs = np.zeros(len(matches) + 1, dtype=np.int64)
    for k in range(len(matches) - 1, -1, -1):
        runs[k] = runs[k + 1] + 1 if matches[k] else 0
    return runs[:-1]


@dataclass(frozen=True)
class Trajectories:
    """Every tier's match runs on the same calibration prompts: `runs[tier][prompt][position]`."""

    runs: tuple[tuple[np.ndarray, ...], ...]

    @classmethod
    def of(cls, profiles: Sequence[AcceptanceProfile]) -> Trajectories:
        lengths = {tuple(len(row) for row in p.greedy_match) for p in profiles}
        if len(lengths) != 1:
            raise ConfigError(
                "the tiers' acceptance profiles cover different prompts or continuation lengths: "
                "take every tier from one run's evaluation cache (one model, one prompt set)"
            )
        return cls(tuple(tuple(match_runs(row) for row in p.greedy_match) for p in profiles))

    @property
    def num_tiers(self) -> int:
        return len(self.runs)


@dataclass(frozen=True)
class Simulation:
    """Rounds the policy ran over all calibration prompts; time is in autoregressive steps."""

    gammas: tuple[int, ...]
    rounds: int
    tokens: int
    time: float
    tier_rounds: tuple[int, ...]

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 1.0

    @property
    def time_per_round(self) -> float:
        return self.time / self.rounds if self.rounds else 1.0

    @property
    def speedup(self) -> float:
        """Committed tokens over the time plain decoding needs for them (one step each)."""
        return self.tokens / self.time if self.time else 1.0

    @property
    def tier_share(self) -> tuple[float, ...]:
        return tuple(r / self.rounds if self.rounds else 0.0 for r in self.tier_rounds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gammas": list(self.gammas),
            "rounds": self.rounds,
            "tokens": self.tokens,
            "time": self.time,
            "tokens_per_round": self.tokens_per_round,
            "time_per_round": self.time_per_round,
            "speedup": self.speedup,
            "tier_share": list(self.tier_share),
        }


def simulate(
    trajectories: Trajectories, round_costs: Sequence[float], policy: TierPolicy, gammas: Sequence[int]
) -> Simulation:
    """Run the policy over every calibration prompt, each from tier 0 with an empty window.

    `round_costs[t]`: one round of tier `t` at its draft length `gammas[t]`, in autoregressive
    steps. A round whose
    window runs past the continuation while every observed draft matched is censored (its length
    is unknown) and ends that prompt, as in `simulate_rounds`; with one tier (or K copies of one
    mask) the result is that mask's `tokens_per_round(γ)` and speedup exactly.
    """
    if min(gammas) < 1:
        raise ConfigError(f"draft lengths must be >= 1, got {list(gammas)}")
    if not len(round_costs) == len(gammas) == trajectories.num_tiers:
        raise ConfigError(
            f"{len(round_costs)} round costs and {len(gammas)} draft lengths for "
            f"{trajectories.num_tiers} tiers"
        )
    rounds = tokens = 0
    time = 0.0
    usage = [0] * trajectories.num_tiers
    for prompt in range(len(trajectories.runs[0])):
        controller = TierController(policy)
        length = len(trajectories.runs[0][prompt])
        k = 0
        while k < length:
            tier = controller.tier
            gamma = gammas[tier]
            accepted = min(int(trajectories.runs[tier][prompt][k]), gamma)
            if accepted < gamma and k + accepted >= length:
                break
            rounds += 1
            tokens += accepted + 1
            time += round_costs[tier]
            usage[tier] += 1
            controller.update(accepted, gamma)
            k += accepted + 1
    return Simulation(tuple(gammas), rounds, tokens, time, tuple(usage))


# -- scoring a tier set ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Tier:
    """One tier: a mask and its measured acceptance on the calibration prompts."""

    mask: SkipMask
    profile: AcceptanceProfile


def order_tiers(tiers: Sequence[Tier]) -> list[Tier]:
    """Richest draft (largest r_draft) first: tier 0 is the one the policy starts from."""
    return sorted(tiers, key=lambda t: (-t.mask.r_draft(), str(t.mask)))


@dataclass(frozen=True)
class Single:
    """One mask alone at its best γ: the baseline a tier set has to beat."""

    mask: str
    gamma: int
    speedup: float


@dataclass(frozen=True)
class TierScore:
    """A tier set's simulated result, next to the best of its masks alone at its best γ."""

    simulation: Simulation
    singles: tuple[Single, ...]

    @property
    def speedup(self) -> float:
        return self.simulation.speedup

    @property
    def gammas(self) -> tuple[int, ...]:
        return self.simulation.gammas

    @property
    def best_single(self) -> Single:
        return max(self.singles, key=lambda s: s.speedup)

    @property
    def gain(self) -> float:
        """Relative gain over the best single mask: 0.05 = 5% faster."""
        return self.speedup / self.best_single.speedup - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.simulation.to_dict(),
            "best_single": vars(self.best_single),
            "gain_over_best_single": self.gain,
        }


class TierScorer:
    """Scores many policies over one ordered tier set: runs and round costs are computed once."""

    def __init__(self, tiers: Sequence[Tier], cost: CostModel = closed_form, gamma_max: int = 8) -> None:
        if gamma_max < 1:
            raise ConfigError(f"gamma_max must be >= 1, got {gamma_max}")
        self.tiers = tuple(tiers)
        self.gamma_max = gamma_max
        self.trajectories = Trajectories.of([t.profile for t in self.tiers])
        forms = [cost(t.mask) for t in self.tiers]
        self.costs = {g: [f.round_cost(g) for f in forms] for g in range(1, gamma_max + 1)}
        self.singles = tuple(
            Single(str(t.mask), best.gamma, best.speedup)
            for t, form in zip(self.tiers, forms, strict=True)
            for best in [optimal_gamma(t.profile, form, gamma_max)]
        )

    def score(self, policy: TierPolicy, gammas: Sequence[int] | None = None) -> TierScore:
        """The set under `policy` with draft lengths `gammas` (default: each mask's best alone)."""
        check_policy(policy, len(self.tiers))
        gammas = tuple(gammas) if gammas is not None else tuple(s.gamma for s in self.singles)
        if len(gammas) != len(self.tiers) or not all(1 <= g <= self.gamma_max for g in gammas):
            raise ConfigError(f"need one draft length in 1..{self.gamma_max} per tier, got {list(gammas)}")
        costs = [self.costs[g][t] for t, g in enumerate(gammas)]
        return TierScore(simulate(self.trajectories, costs, policy, gammas), self.singles)


# -- the capture manifest --------------------------------------------------------------------------
@dataclass(frozen=True)
class TierManifest:
    """`tiers.json`: what an engine pre-captures and how it switches (reference 000 §7.6).

    One draft-step graph per (tier, batch-size bucket) and one verify graph per (tier, draft
    length 0..γ_tier, bucket): the last round of a sequence drafts fewer so it never overshoots.
    The policy runs on the CPU between rounds; switching tiers is choosing which graph to replay.
    """

    model: str
    masks: tuple[SkipMask, ...]
    policy: TierPolicy
    gammas: tuple[int, ...]
    buckets: tuple[int, ...] = (1,)
    predicted: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_policy(self.policy, len(self.masks))
        if len({m.num_layers for m in self.masks}) != 1:
            raise ConfigError("every tier's mask must be for the same model depth")
        if len({str(m) for m in self.masks}) != len(self.masks):
            raise ConfigError("tier masks must be distinct: a repeated mask is one tier")
        if len(self.gammas) != len(self.masks) or min(self.gammas) < 1:
            raise ConfigError(f"need one draft length >= 1 per tier, got {list(self.gammas)}")
        buckets = list(self.buckets)
        if not buckets or buckets[0] < 1 or buckets != sorted(set(buckets)):
            raise ConfigError(f"buckets must be increasing batch sizes >= 1, got {list(self.buckets)}")

    @property
    def num_layers(self) -> int:
        return self.masks[0].num_layers

    def graphs(self) -> dict[str, list[dict[str, int]]]:
        """The graphs to capture, by kind."""
        tiers = range(len(self.masks))
        return {
            "draft": [{"tier": t, "bucket": b} for t in tiers for b in self.buckets],
            "verify": [
                {"tier": t, "gamma": g, "bucket": b}
                for t in tiers
                for g in range(self.gammas[t] + 1)
                for b in self.buckets
            ],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "skipsearch-tiers",
            "version": MANIFEST_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "tiers": [
                {
                    "tier": i,
                    "mask": str(m),
                    "gamma": self.gammas[i],
                    "skipped_attn": sorted(m.attn),
                    "skipped_mlp": sorted(m.mlp),
                    "exit_layer": m.exit_layer,
                    "first_divergent_layer": m.first_divergent_layer,
                    "r_draft": m.r_draft(),
                    "r_reuse": m.r_reuse,
                }
                for i, m in enumerate(self.masks)
            ],
            "policy": {
                "window": self.policy.window,
                "thresholds": list(self.policy.thresholds),
                "start_tier": 0,
            },
            "buckets": list(self.buckets),
            "graphs": self.graphs(),
            "predicted": dict(self.predicted),
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierManifest:
        try:
            num_layers = int(data["num_layers"])
            policy = data["policy"]
            return cls(
                model=str(data["model"]),
                masks=tuple(SkipMask.parse(t["mask"], num_layers) for t in data["tiers"]),
                policy=TierPolicy(int(policy["window"]), tuple(float(t) for t in policy["thresholds"])),
                gammas=tuple(int(t["gamma"]) for t in data["tiers"]),
                buckets=tuple(int(b) for b in data.get("buckets", (1,))),
                predicted=dict(data.get("predicted", {})),
                provenance=dict(data.get("provenance", {})),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"tier manifest is malformed ({type(error).__name__}: {error}): "
                "write it with `skipsearch export` or experiments/tiers_smollm2.py"
            ) from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> TierManifest:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read tier manifest {path}: {error}") from None
        if not _has_tiers(data):
            raise ConfigError(f"{path} is not a tier manifest (no 'tiers' list): pass a tiers.json")
        return cls.from_dict(data)


def is_tier_manifest(path: Path) -> bool:
    """Whether `path` is a `tiers.json` rather than a one-mask file such as best.json (an
    unreadable file is not: the one-mask reader reports it)."""
    try:
        return _has_tiers(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError):
        return False


def _has_tiers(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("tiers"), list)
