"""Cost model: how much faster speculative decoding is than plain decoding (DESIGN §5).

Pure arithmetic, no model. Every speedup here has the same shape,

    S(γ) = E(γ) / round_cost(γ),

tokens committed per round over the cost of one round in units of one autoregressive step. `E`
comes from an acceptance rate, per-depth rates or a measured `AcceptanceProfile`; the round cost
comes from a *cost form*: the closed forms of reference 000 §3–§5 (separate draft, self-speculative
general and contiguous, each with the verify overhead `f(γ) = 1 + εγ`) or the calibrated form,
which prices one round with a device-measured `LatencyProfile`. The serving memory model of
reference 000 §6 (batch-size gain `β`) closes the module.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from skipsearch.acceptance import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask, SublayerWeights

Acceptance = float | Sequence[float] | AcceptanceProfile
"""A per-token acceptance rate `α`, per-depth rates `α_1..α_n`, or a measured profile."""

# -- validation ----------------------------------------------------------------------------------


def _check_gamma(gamma: int) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, Integral) or gamma < 1:
        raise ConfigError(f"draft length gamma must be an integer >= 1, got {gamma!r}")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1] (it is an acceptance probability), got {value}")


def _check_epsilon(epsilon: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ConfigError(f"verify overhead epsilon must be a finite number >= 0, got {epsilon}")


# -- tokens per round ----------------------------------------------------------------------------


def tokens_per_round_iid(alpha: float, gamma: int) -> float:
    """`E(γ) = (1 - α^(γ+1)) / (1 - α)` (reference 000 §3.2): accepted drafts plus the target's token.

    With i.i.d. acceptance, draft `j` survives with probability `α^j`, so `E = Σ_{j=0..γ} α^j`;
    at `α = 1` every draft is accepted and `E = γ + 1`.
    """
    _check_probability("alpha", alpha)
    _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def tokens_per_round_by_depth(alphas: Sequence[float], gamma: int) -> float:
    """`E(γ) = 1 + Σ_{k=1..γ} Π_{j=1..k} α_j` (reference 000 §5.2): acceptance that varies by depth.

    `α_j` is the probability that draft `j` is accepted given the first `j - 1` were, so the
    round reaches depth `k` with probability `Π_{j≤k} α_j`.
    """
    _check_gamma(gamma)
    if len(alphas) < gamma:
        raise ConfigError(
            f"depth-wise acceptance needs alpha_1..alpha_{gamma} for gamma={gamma}, got {len(alphas)} "
            "values: give more rates or a smaller gamma"
        )
    for depth, alpha in enumerate(alphas[:gamma], start=1):
        _check_probability(f"alpha_{depth}", alpha)
    return 1.0 + float(np.sum(np.cumprod(np.asarray(alphas[:gamma], dtype=float))))


def expected_tokens(acceptance: Acceptance, gamma: int) -> float:
    """Tokens committed per round: i.i.d. closed form, depth-wise product, or measured by simulation."""
    if isinstance(acceptance, AcceptanceProfile):
        _check_gamma(gamma)
        return acceptance.tokens_per_round(gamma)
    if isinstance(acceptance, Real):
        return tokens_per_round_iid(float(acceptance), gamma)
    return tokens_per_round_by_depth(acceptance, gamma)


# -- closed-form cost forms ----------------------------------------------------------------------


def verify_overhead(gamma: int, epsilon: float) -> float:
    """`f(γ) = 1 + εγ` (reference 000 §5.1): verifying `γ+1` positions costs more than one step."""
    return 1.0 + epsilon * gamma


class CostForm(Protocol):
    """Cost of one speculative round of draft length `γ`, in units of one autoregressive step."""

    name: str

    def round_cost(self, gamma: int) -> float: ...


@dataclass(frozen=True)
class SeparateDraft:
    """Speculative decoding with a separate draft model of relative cost `c` (reference 000 §3.3).

    One round is `γ` draft steps and one verify pass: `γc + f(γ)`, so `S = E(γ) / (γc + 1)` at ε = 0.
    """

    c: float
    epsilon: float = 0.0
    name: str = field(default="sd", init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.c) and self.c > 0.0):
            raise ConfigError(f"draft cost ratio c must be a finite number > 0, got {self.c}")
        _check_epsilon(self.epsilon)

    def round_cost(self, gamma: int) -> float:
        _check_gamma(gamma)
        return gamma * self.c + verify_overhead(gamma, self.epsilon)


@dataclass(frozen=True)
class SelfSpeculative:
    """Self-speculative decoding, any skip pattern (reference 000 §4.3).

    The draft runs a share `r_draft` of the model; verify skips the share `r_reuse` whose KV the
    draft wrote exactly: `γ r_draft + (1 - r_reuse) f(γ)`, so `S = E / (γ r_draft + 1 - r_reuse)` at
    ε = 0. With `r_reuse = 0` this is `SeparateDraft(c=r_draft)`: no KV reuse, no SSD advantage.
    """

    r_draft: float
    r_reuse: float
    epsilon: float = 0.0
    name: str = field(default="ssd", init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.r_draft <= 1.0:
            raise ConfigError(f"r_draft must be in (0, 1] (a share of the full forward), got {self.r_draft}")
        if not 0.0 <= self.r_reuse <= self.r_draft:
            raise ConfigError(
                f"r_reuse must be in [0, r_draft={self.r_draft}] (verify can only reuse what the draft "
                f"ran), got {self.r_reuse}"
            )
        _check_epsilon(self.epsilon)

    @classmethod
    def from_mask(cls, mask: SkipMask, epsilon: float = 0.0) -> SelfSpeculative:
        """Shares by sub-layer count: `r_draft` from the mask, `r_reuse` = reused sub-layers / 2L."""
        return cls(mask.r_draft(), mask.reused_sublayers / (2 * mask.num_layers), epsilon)

    def round_cost(self, gamma: int) -> float:
        _check_gamma(gamma)
        return gamma * self.r_draft + (1.0 - self.r_reuse) * verify_overhead(gamma, self.epsilon)


@dataclass(frozen=True)
class Contiguous:
    """Contiguous-prefix SSD, draft = the first share `r` of the layers (reference 000 §4.4).

    Written as the reference writes it, `1 + (γ - 1) r`; with verify overhead the convention is
    `γ r + (1 - r) f(γ)`: only the `1 - r` layers verify computes pay the extra positions.
    """

    r: float
    epsilon: float = 0.0
    name: str = field(default="ssd_contiguous", init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.r <= 1.0:
            raise ConfigError(f"draft share r must be in (0, 1], got {self.r}")
        _check_epsilon(self.epsilon)

    def round_cost(self, gamma: int) -> float:
        _check_gamma(gamma)
        return 1.0 + (gamma - 1) * self.r + (1.0 - self.r) * self.epsilon * gamma


# -- speedup and the best draft length -----------------------------------------------------------


@dataclass(frozen=True)
class Optimum:
    """The best draft length in `1..γ_max` and the speedup there."""

    gamma: int
    speedup: float


def speedup(acceptance: Acceptance, form: CostForm, gamma: int) -> float:
    """`S(γ) = E(γ) / round_cost(γ)`: tokens per round over the round's cost in plain-decoding steps."""
    return expected_tokens(acceptance, gamma) / form.round_cost(gamma)


def speedup_curve(acceptance: Acceptance, form: CostForm, gamma_max: int) -> tuple[float, ...]:
    """`S(1), ..., S(γ_max)`."""
    _check_gamma(gamma_max)
    return tuple(speedup(acceptance, form, gamma) for gamma in range(1, gamma_max + 1))


def best_of(curve: Sequence[float]) -> Optimum:
    """Argmax of a speedup curve indexed from γ = 1; ties go to the smaller γ (cheaper, less waste)."""
    index = max(range(len(curve)), key=lambda i: (curve[i], -i))
    return Optimum(index + 1, curve[index])


def optimal_gamma(acceptance: Acceptance, form: CostForm, gamma_max: int = 8) -> Optimum:
    """Grid search over integer γ: reference 000 §8 notes the optimum has no closed form."""
    return best_of(speedup_curve(acceptance, form, gamma_max))


# -- calibrated cost -----------------------------------------------------------------------------


def _bracket(xs: Sequence[float], x: float, extrapolate: bool) -> tuple[int, int, float]:
    """Indices `i, j` and weight `t` so that `y(x) = (1 - t) y[i] + t y[j]` linearly interpolates.

    Exact at measured points. Outside the range: clamp, or continue the end segment's line.
    """
    n = len(xs)
    if n == 1:
        return 0, 0, 0.0
    j = int(np.searchsorted(xs, x, side="right"))
    if not extrapolate and (j == 0 or j == n):
        end = 0 if j == 0 else n - 1
        return end, end, 0.0
    j = min(max(j, 1), n - 1)
    i = j - 1
    return i, j, (x - xs[i]) / (xs[j] - xs[i])


def _interpolate(table: np.ndarray, i: int, j: int, t: float, axis: int) -> np.ndarray:
    return (1.0 - t) * np.take(table, i, axis=axis) + t * np.take(table, j, axis=axis)


@dataclass(frozen=True)
class LatencyProfile:
    """Device-calibrated cost table, measured by `skipsearch profile` (DESIGN §5).

    Median seconds of each part of one forward pass, by context length (`context_lengths`) and by
    the number of positions in the pass (`positions`: 1 for a draft step, γ+1 for verify):
    `embed[c][k]`, `head[c][k]` (final norm + LM head), `attn[layer][c][k]`, `mlp[layer][c][k]`.
    `spread` holds the same four tables as interquartile ranges; `round_overhead[γ]` is the
    per-round cost outside the forward passes (sampling, acceptance, cache crop).
    """

    meta: Mapping[str, Any]
    context_lengths: tuple[int, ...]
    positions: tuple[int, ...]
    embed: tuple[tuple[float, ...], ...]
    head: tuple[tuple[float, ...], ...]
    attn: tuple[tuple[tuple[float, ...], ...], ...]
    mlp: tuple[tuple[tuple[float, ...], ...], ...]
    spread: Mapping[str, Any]
    round_overhead: Mapping[int, float]
    _weights: dict[tuple[float, float], SublayerWeights] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    TABLES = ("embed", "head", "attn", "mlp")
    VERSION = 1

    def __post_init__(self) -> None:
        for name in ("context_lengths", "positions"):
            axis = getattr(self, name)
            if not axis or any(b <= a for a, b in itertools.pairwise(axis)) or axis[0] < 1:
                raise ConfigError(f"{name} must be a non-empty increasing list of integers >= 1, got {axis}")
        if not self.attn or len(self.mlp) != len(self.attn):
            raise ConfigError(
                f"attn and mlp must cover the same layers, got {len(self.attn)} and {len(self.mlp)}"
            )
        if self.meta.get("num_layers", self.num_layers) != self.num_layers:
            raise ConfigError(
                f"meta.num_layers is {self.meta['num_layers']} but the tables cover {self.num_layers}"
            )
        for table in self.TABLES:
            self._check_table(table, getattr(self, table))
            self._check_table(f"spread.{table}", self.spread.get(table))
        if not self.round_overhead or min(self.round_overhead) < 1:
            raise ConfigError(f"round_overhead needs entries for gamma >= 1, got {dict(self.round_overhead)}")
        if any(not (math.isfinite(s) and s >= 0.0) for s in self.round_overhead.values()):
            raise ConfigError("round_overhead seconds must be finite and >= 0")

    def _check_table(self, name: str, table: Any) -> None:
        layers = () if name.endswith(("embed", "head")) else (self.num_layers,)
        shape = (*layers, len(self.context_lengths), len(self.positions))
        try:
            values = np.asarray(table, dtype=float)
        except (TypeError, ValueError):
            values = np.empty(0)
        if values.shape != shape or not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ConfigError(
                f"latency table {name} must hold finite seconds >= 0 with shape {list(shape)} "
                "(layers x context lengths x positions); re-run `skipsearch profile`"
            )

    @property
    def num_layers(self) -> int:
        return len(self.attn)

    # -- lookups ------------------------------------------------------------------------------
    def _at(self, table: Any, context: float, positions: float) -> np.ndarray:
        """Linear in context length (clamped to the measured range), then in positions (extrapolated)."""
        values = np.asarray(table, dtype=float)
        i, j, t = _bracket(self.context_lengths, context, extrapolate=False)
        values = _interpolate(values, i, j, t, axis=-2)
        i, j, t = _bracket(self.positions, positions, extrapolate=True)
        return np.maximum(_interpolate(values, i, j, t, axis=-1), 0.0)

    def embed_time(self, context: float, positions: float = 1) -> float:
        return float(self._at(self.embed, context, positions))

    def head_time(self, context: float, positions: float = 1) -> float:
        return float(self._at(self.head, context, positions))

    def attn_time(self, layer: int, context: float, positions: float = 1) -> float:
        return float(self._at(self.attn[layer], context, positions))

    def mlp_time(self, layer: int, context: float, positions: float = 1) -> float:
        return float(self._at(self.mlp[layer], context, positions))

    def weights(self, context: float, positions: float = 1) -> SublayerWeights:
        """Seconds of every part of one pass over `positions` positions (cached: the search asks often)."""
        key = (float(context), float(positions))
        if key not in self._weights:
            self._weights[key] = SublayerWeights(
                embed=self.embed_time(context, positions),
                attn=tuple(self._at(self.attn, context, positions).tolist()),
                mlp=tuple(self._at(self.mlp, context, positions).tolist()),
                head=self.head_time(context, positions),
            )
        return self._weights[key]

    def step_time(self, context: float) -> float:
        """One autoregressive step: a full forward over one position."""
        return self.weights(context).total

    def overhead(self, gamma: int) -> float:
        """Per-round overhead, linear in γ between (and beyond) the measured draft lengths."""
        gammas = sorted(self.round_overhead)
        i, j, t = _bracket(gammas, gamma, extrapolate=True)
        value = (1.0 - t) * self.round_overhead[gammas[i]] + t * self.round_overhead[gammas[j]]
        return max(value, 0.0)

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": self.VERSION,
            "meta": dict(self.meta),
            "context_lengths": list(self.context_lengths),
            "positions": list(self.positions),
            **{name: np.asarray(getattr(self, name)).tolist() for name in self.TABLES},
            "spread": {name: np.asarray(self.spread[name]).tolist() for name in self.TABLES},
            "round_overhead": {str(g): s for g, s in sorted(self.round_overhead.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyProfile:
        if data.get("version", cls.VERSION) != cls.VERSION:
            raise ConfigError(
                f"latency profile version {data['version']} is not {cls.VERSION}: re-run profile"
            )
        try:
            return cls(
                meta=dict(data["meta"]),
                context_lengths=tuple(int(c) for c in data["context_lengths"]),
                positions=tuple(int(k) for k in data["positions"]),
                **{name: _tuples(data[name]) for name in cls.TABLES},
                spread={name: _tuples(data["spread"][name]) for name in cls.TABLES},
                round_overhead={int(g): float(s) for g, s in data["round_overhead"].items()},
            )
        except KeyError as missing:
            raise ConfigError(
                f"latency profile lacks the field {missing}: re-run `skipsearch profile`"
            ) from None
        except (TypeError, ValueError, AttributeError) as error:
            raise ConfigError(
                f"latency profile is malformed ({error}): re-run `skipsearch profile`"
            ) from None

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, model: str | None = None) -> LatencyProfile:
        """Read a profile; a missing file says how to make one."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"no latency profile at {path}: run "
                f"`skipsearch profile --model {model or 'MODEL'}` on this device"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"latency profile {path} is not valid JSON ({error}): re-run profile") from None
        try:
            return cls.from_dict(data)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None


def _tuples(nested: Any) -> Any:
    """Nested lists of numbers as nested tuples of floats (immutable, comparable)."""
    if isinstance(nested, list | tuple):
        return tuple(_tuples(item) for item in nested)
    return float(nested)


@dataclass(frozen=True)
class RoundTime:
    """Seconds of one speculative round, split the way the engine reports it (DESIGN §6)."""

    draft: float
    verify: float
    overhead: float

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.overhead


@dataclass(frozen=True)
class Calibrated:
    """One round priced with measured times instead of layer counts (DESIGN §5).

    `γ` draft steps run embed, the draft's sub-layers and the head over one position each. Verify
    runs over `γ + 1` positions every sub-layer from the first one the draft skipped (see
    `SkipMask.reused_sublayers`), and the sub-layers before it, with the embedding, only for the last draft
    token, which the draft never ran; then the head over `γ + 1` positions. Plus the measured
    per-round overhead. `round_cost = round time / step time`, so `S = E(γ) × step / round`.
    """

    latency: LatencyProfile
    mask: SkipMask
    context: float = 512
    name: str = field(default="calibrated", init=False)

    def round_time(self, gamma: int) -> RoundTime:
        _check_gamma(gamma)
        one = self.latency.weights(self.context, 1)
        full = self.latency.weights(self.context, gamma + 1)
        draft_step = one.total * self.mask.r_draft(one)
        reused = self.mask.reused_sublayers
        step_one, step_full = _in_order(one), _in_order(full)
        verify = one.embed + sum(step_one[:reused]) + sum(step_full[reused:]) + full.head
        return RoundTime(gamma * draft_step, verify, self.latency.overhead(gamma))

    def round_cost(self, gamma: int) -> float:
        return self.round_time(gamma).total / self.latency.step_time(self.context)


def _in_order(weights: SublayerWeights) -> list[float]:
    """Sub-layer times in execution order: `attn_0, mlp_0, attn_1, mlp_1, ...`."""
    return [t for pair in zip(weights.attn, weights.mlp, strict=True) for t in pair]


# -- scoring one mask ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Predicted speedup of one mask for γ = 1..γ_max: closed form and, with a profile, calibrated.

    Index `γ - 1` of each curve holds draft length `γ`. `r_reuse` is the sub-layer share verify
    reuses (`SkipMask.reused_sublayers / 2L`), the one the closed form used.
    """

    mask: str
    r_draft: float
    r_reuse: float
    context: float
    tokens_per_round: tuple[float, ...]
    closed_form: tuple[float, ...]
    calibrated: tuple[float, ...] | None = None

    @property
    def best_closed_form(self) -> Optimum:
        return best_of(self.closed_form)

    @property
    def best_calibrated(self) -> Optimum | None:
        return None if self.calibrated is None else best_of(self.calibrated)

    @property
    def best(self) -> Optimum:
        """The score DESIGN §5 asks for: calibrated when a profile was given, else the closed form."""
        return self.best_calibrated or self.best_closed_form

    def to_dict(self) -> dict:
        def optimum(best: Optimum | None) -> dict | None:
            return None if best is None else {"gamma": best.gamma, "speedup": best.speedup}

        return {
            "mask": self.mask,
            "r_draft": self.r_draft,
            "r_reuse": self.r_reuse,
            "context": self.context,
            "tokens_per_round": list(self.tokens_per_round),
            "closed_form": list(self.closed_form),
            "calibrated": None if self.calibrated is None else list(self.calibrated),
            "best_closed_form": optimum(self.best_closed_form),
            "best_calibrated": optimum(self.best_calibrated),
        }


def predict(
    profile: AcceptanceProfile,
    mask: SkipMask,
    gamma_max: int = 8,
    latency: LatencyProfile | None = None,
    context: float = 512,
    epsilon: float = 0.0,
) -> Prediction:
    """Score a mask from its measured acceptance: cheap enough to call for every search trial."""
    closed = SelfSpeculative.from_mask(mask, epsilon)
    return Prediction(
        mask=str(mask),
        r_draft=closed.r_draft,
        r_reuse=closed.r_reuse,
        context=context,
        tokens_per_round=tuple(expected_tokens(profile, g) for g in range(1, gamma_max + 1)),
        closed_form=speedup_curve(profile, closed, gamma_max),
        calibrated=None
        if latency is None
        else speedup_curve(profile, Calibrated(latency, mask, context), gamma_max),
    )


# -- serving memory (reference 000 §6) -----------------------------------------------------------


@dataclass(frozen=True)
class MemoryBudget:
    """Accelerator memory for serving, in any one unit (bytes, GiB): what bounds the batch size.

    Whatever the weights leave free holds KV caches, so `B_max = (M_total - M_weight) / kv per
    sequence`, rounded down: SD holds `M_big + M_draft`, SSD only `M_big`.
    """

    total: float
    big_weights: float
    draft_weights: float
    kv_per_sequence: float

    def __post_init__(self) -> None:
        for name in ("total", "big_weights", "kv_per_sequence"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"memory {name} must be > 0, got {getattr(self, name)}")
        if not self.draft_weights >= 0:
            raise ConfigError(f"memory draft_weights must be >= 0, got {self.draft_weights}")

    def max_batch(self, weights: float) -> int:
        """Sequences whose KV cache fits beside `weights`; at least one must, or nothing can serve."""
        batch = math.floor((self.total - weights) / self.kv_per_sequence)
        if batch < 1:
            raise ConfigError(
                f"weights of {weights} leave {self.total - weights} of {self.total} memory, less than one "
                f"sequence's KV cache ({self.kv_per_sequence}): use more memory, a smaller model or "
                "shorter sequences"
            )
        return batch

    @property
    def batch_sd(self) -> int:
        return self.max_batch(self.big_weights + self.draft_weights)

    @property
    def batch_ssd(self) -> int:
        return self.max_batch(self.big_weights)

    @property
    def beta(self) -> float:
        """`β = B_max^SSD / B_max^SD >= 1`: the batch-size gain of holding one set of weights."""
        return self.batch_ssd / self.batch_sd


def throughput_ratio(memory: MemoryBudget, speedup_ssd: float, speedup_sd: float) -> float:
    """Throughput of SSD over SD when both serve their largest batch: `β × S_SSD / S_SD` (000 §6.3)."""
    if not (speedup_ssd > 0 and speedup_sd > 0):
        raise ConfigError(f"speedups must be > 0, got SSD {speedup_ssd} and SD {speedup_sd}")
    return memory.beta * speedup_ssd / speedup_sd
