"""LatencyProfile: the device-measured cost table that the calibrated cost model reads
(docs/theory.md, "Calibrated cost").

Pure data and interpolation: the profiler (`skipsearch.bench.latency_profiler`) fills it, the calibrated
form prices rounds with it. What its tables must hold, checked when a profile is built, and the
tables of a lower precision (`PrecisionCosts`) are `cost.latency_schema`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np

from skipsearch.cost.latency_schema import PrecisionCosts, check_profile, tuples
from skipsearch.errors import ConfigError
from skipsearch.masks import LOW_BITS, SkipMask, SublayerWeights
from skipsearch.store import write_text_atomic

log = logging.getLogger(__name__)
# Kernels a profile records since they joined the plan (2026-12-03): a profile taken before ran
# transformers' own operators and modules there.
PREDATES = {"norms": "torch", "rotary": "torch", "layers": "modules"}


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
class PrecisionFloor:
    """A one-position decode step with every layer at `bits`, against what it must read: `seconds`
    measured, `floor` = `read_bytes` over the copy bandwidth (None where the profile lacks either),
    and the bandwidth the step reached (`read_bytes / seconds`)."""

    bits: int
    context: float
    seconds: float | None
    read_bytes: float | None
    floor: float | None

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second the step read at."""
        if self.seconds is None or self.read_bytes is None or self.seconds <= 0:
            return None
        return self.read_bytes / self.seconds

    @property
    def over_floor(self) -> float | None:
        """`seconds / floor`: 1 is a step at the memory's speed."""
        if self.seconds is None or not self.floor:
            return None
        return self.seconds / self.floor


@dataclass(frozen=True)
class LatencyProfile:
    """Device-calibrated cost table, measured by `skipsearch profile` (docs/theory.md, "Calibrated cost").

    Median seconds of each part of one forward pass, by context length (`context_lengths`) and by
    the number of positions in the pass (`positions`: 1 for a draft step, γ+1 for verify):
    `embed[c][k]`, `head[c][k]` (final norm + LM head), `attn[layer][c][k]`, `mlp[layer][c][k]`.
    `spread` holds the same four tables as interquartile ranges; `round_overhead[γ]` is the
    per-round cost outside the forward passes (sampling, acceptance, cache crop).

    `head_by_rows[i]` is a draft head with only `head_rows[i]` rows of the LM head (final norm +
    the product with a gathered contiguous matrix) at one position; the last row count is the
    whole vocabulary. It does not depend on context. Profiles from before draft vocabularies lack
    the table and stay readable (see `draft_head_time`).

    `pillar_choice[c]` is what a round with a pillar draft pays beyond its passes at context
    `context_lengths[c]`: the choice of every layer's pillars from the verify's scores and their
    gather for the next round's draft (`kv.pillars`). Profiles from before it lack it and price
    pillars as free (`pillar_choice_time`).

    `precisions[bits]` (`PrecisionCosts`) holds each sub-layer's cost with its weights at a lower
    precision (int8, int4) and the step's measured time and bytes there; `weights()` hands them to
    `SublayerWeights.low_bits`. A precision the profile lacks is priced by its bytes (`masks.BYTES_SHARE` of
    the full-precision sub-layer), and `check_precisions` says so once. Profiles from before lack
    the table and stay readable.

    Between measured context lengths the tables are interpolated linearly; outside them they are
    clamped to the nearest end, unless `extrapolate_context` (see `for_context`) continues the end
    segment's line, as attention time grows linearly with context (KnapSpec's `t_attn = c2·ctx + c3`).
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
    head_rows: tuple[int, ...] = ()
    head_by_rows: tuple[float, ...] = ()
    pillar_choice: tuple[float, ...] = ()
    precisions: Mapping[int, PrecisionCosts] = field(default_factory=dict)
    extrapolate_context: bool = field(default=False, compare=False)
    _weights: dict[tuple[float, float], SublayerWeights] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _warned: set[str] = field(default_factory=set, init=False, compare=False, repr=False)

    TABLES = ("embed", "head", "attn", "mlp")
    VERSION = 1

    def __post_init__(self) -> None:
        check_profile(self)

    def with_precision(self, bits: int, costs: PrecisionCosts) -> LatencyProfile:
        """This profile with the measured costs of `bits`-bit drafts (replacing any it had): what
        the profiler calls once per lower precision it times (checked like the rest of the table)."""
        return replace(self, precisions={**self.precisions, int(bits): costs})

    @property
    def num_layers(self) -> int:
        return len(self.attn)

    def for_context(self, context: float, extrapolate: bool = False) -> LatencyProfile:
        """This profile, checked to price `context`: a context outside the measured range is an
        error unless `extrapolate`, which returns a copy that extends the end segments' lines.

        Clamping silently would score a 32k-token context like the longest one measured, so the
        caller must ask for extrapolation (or re-profile with that context) knowingly.
        """
        low, high = self.context_lengths[0], self.context_lengths[-1]
        if extrapolate:
            return replace(self, extrapolate_context=True)
        if not low <= context <= high:
            raise ConfigError(
                f"context {context:g} is outside the profiled range {low}..{high}: pass a context in that "
                "range, re-profile with --context-lengths covering it, or pass --extrapolate-context"
            )
        return self

    # -- lookups ------------------------------------------------------------------------------
    def _at(
        self, table: Any, context: float, positions: float, axis: Sequence[int] | None = None
    ) -> np.ndarray:
        """Linear in context length (clamped to the measured range unless `extrapolate_context`),
        then in positions (extrapolated) along `axis` (the profile's `positions` unless given)."""
        values = np.asarray(table, dtype=float)
        i, j, t = _bracket(self.context_lengths, context, extrapolate=self.extrapolate_context)
        values = _interpolate(values, i, j, t, axis=-2)
        i, j, t = _bracket(axis or self.positions, positions, extrapolate=True)
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
                low_bits={
                    bits: (
                        self._low_bits_at(costs.attn, costs, context, positions),
                        self._low_bits_at(costs.mlp, costs, context, positions),
                    )
                    for bits, costs in sorted(self.precisions.items())
                },
            )
        return self._weights[key]

    def _low_bits_at(
        self, table: Any, costs: PrecisionCosts, context: float, positions: float
    ) -> tuple[float, ...]:
        """Every layer's seconds in one of `costs`' tables, on the position counts they were timed at."""
        return tuple(self._at(table, context, positions, costs.timed_positions(self.positions)).tolist())

    def check_precisions(self, mask: SkipMask) -> bool:
        """Whether this profile prices some of `mask`'s lower-precision sub-layers by their bytes
        (`masks.BYTES_SHARE` of the full-precision time) because it did not time that precision; said
        once per profile."""
        used = {mask.attn_bits(i) for i in range(mask.num_layers)}
        used |= {mask.mlp_bits(i) for i in range(mask.num_layers)}
        missing = sorted(used & set(LOW_BITS) - set(self.precisions), reverse=True)
        if missing:
            self._warn_once(
                "latency profile of %s has no int"
                + "/int".join(map(str, missing))
                + " timings: those sub-layers are priced by the bytes they read (masks.BYTES_SHARE of full "
                "precision), not by a measurement"
            )
        return bool(missing)

    def precision_floor(self, bits: int, context: float) -> PrecisionFloor:
        """A one-position step with every layer at `bits` (16: the model's own precision) at
        `context`: its measured seconds, the bytes it reads and their floor (`PrecisionFloor`)."""
        bandwidth = self.meta.get("copy_bandwidth")
        read = self.read_bytes(context)
        if bits == 16:
            seconds: float | None = self.step_time(context)
            weight_bytes = None if read is None else read[0]
        elif bits in self.precisions:
            costs = self.precisions[bits]
            weight_bytes = costs.weight_bytes
            seconds = None
            if costs.step:
                i, j, t = _bracket(self.context_lengths, context, extrapolate=self.extrapolate_context)
                seconds = max((1.0 - t) * costs.step[i] + t * costs.step[j], 0.0)
        else:
            timed = ", ".join(f"int{b}" for b in sorted(self.precisions)) or "none"
            raise ConfigError(
                f"this latency profile has no int{bits} timings (it has {timed}): re-run `skipsearch profile`"
            )
        total = None if weight_bytes is None or read is None else weight_bytes + read[1]
        floor = None if total is None or bandwidth is None else total / bandwidth
        return PrecisionFloor(bits, context, seconds, total, floor)

    @property
    def vocab_size(self) -> int | None:
        """Rows of the full LM head: the head table's last row count, else what meta records."""
        return self.head_rows[-1] if self.head_rows else self.meta.get("vocab_size")

    def draft_head_time(self, k: int | None, context: float, vocab_size: int | None = None) -> float:
        """Seconds of a draft head with the top `k` rows at one position (None: the full head).

        The full head at `context` times the measured ratio `t(k) / t(V)`, `t` piecewise linear in
        `k` between the measured row counts and held at the fewest below them (fixed costs do not
        shrink with rows, and nothing says how they behave there); `k >= V` is the full head. A
        profile without the table scales by `k / V` — time ∝ rows assumed, not measured — and
        says so once. `vocab_size` is needed only when the profile records no `V`.
        """
        full = self.head_time(context, 1)
        if k is None:
            return full
        vocab = self._draft_vocab_size(k, vocab_size)
        if k >= vocab:
            return full
        if not self.head_rows:
            self._warn_once(
                "latency profile of %s has no draft-head timings: a head of k rows is priced as k/V of "
                "the full head; re-run `skipsearch profile` to measure it"
            )
            return full * k / vocab
        i, j, t = _bracket(self.head_rows, k, extrapolate=False)
        at_k = (1.0 - t) * self.head_by_rows[i] + t * self.head_by_rows[j]
        return full * at_k / self.head_by_rows[-1]

    def _warn_once(self, message: str) -> None:
        """Log `message` (`%s`: the model) the first time this profile prices around a missing table."""
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message, self.meta.get("model", "this model"))

    def _draft_vocab_size(self, k: int, vocab_size: int | None) -> int:
        """`V` for a draft head of `k` rows, checked against the profile's own and against `k`."""
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
            raise ConfigError(f"draft vocabulary must be an integer >= 1 or full, got {k!r}")
        own = self.vocab_size
        if own is not None and vocab_size is not None and own != vocab_size:
            raise ConfigError(
                f"the latency profile is for a vocabulary of {own} ids, the model has {vocab_size}: "
                "profile the model you score"
            )
        vocab = own if own is not None else vocab_size
        if vocab is None:
            raise ConfigError(
                "this latency profile predates draft-head timing and does not record the vocabulary "
                "size: re-run `skipsearch profile`, or give the vocabulary size"
            )
        return int(vocab)

    def pillar_choice_time(self, context: float) -> float:
        """Seconds a round spends choosing and gathering pillars at `context` (linear between the
        measured context lengths, as attention is); 0, said once, for a profile without the table."""
        if not self.pillar_choice:
            self._warn_once(
                "latency profile of %s has no pillar-choice timings: pillar drafts are priced without "
                "the choice; re-run `skipsearch profile` to measure it"
            )
            return 0.0
        i, j, t = _bracket(self.context_lengths, context, extrapolate=self.extrapolate_context)
        return max((1.0 - t) * self.pillar_choice[i] + t * self.pillar_choice[j], 0.0)

    def step_time(self, context: float) -> float:
        """One autoregressive step: a full forward over one position."""
        return self.weights(context).total

    def overhead(self, gamma: int) -> float:
        """Per-round overhead, linear in γ between (and beyond) the measured draft lengths."""
        gammas = sorted(self.round_overhead)
        i, j, t = _bracket(gammas, gamma, extrapolate=True)
        value = (1.0 - t) * self.round_overhead[gammas[i]] + t * self.round_overhead[gammas[j]]
        return max(value, 0.0)

    def read_bytes(self, context: float) -> tuple[float, float] | None:
        """(weight bytes, K/V bytes) a decode step must read at `context` cached positions; None
        for a profile taken before these were recorded."""
        weights, per_position = (self.meta.get(key) for key in ("weight_bytes", "kv_bytes_per_position"))
        if weights is None or per_position is None:
            return None
        return float(weights), float(per_position) * context

    def floor_time(self, context: float) -> float | None:
        """Seconds a decode step cannot beat at `context`: the bytes it must read (weights plus
        the K/V of `context` positions) over this machine's measured copy bandwidth; None for a
        profile taken before these were recorded."""
        read, bandwidth = self.read_bytes(context), self.meta.get("copy_bandwidth")
        if read is None or bandwidth is None:
            return None
        return sum(read) / bandwidth

    def warn_other_plan(self, running: dict[str, str], path: str | Path) -> bool:
        """Warn (and say so) when this profile timed other kernels than the `running` ones
        (`cpu.inventory.plan_kernels`: the attention path, the linear products, the norms, the
        rotary embedding): its costs, and so every predicted speedup, are another plan's. A profile
        older than the attention and product keys is not compared on them; one older than a
        kernel of `PREDATES` timed transformers' operators there."""
        recorded = {key: self.meta.get(key, PREDATES.get(key)) for key in running}
        other = {
            key: (recorded[key], kernel)
            for key, kernel in running.items()
            if recorded[key] is not None and recorded[key] != kernel
        }
        if not other:
            return False
        timed = ", ".join(
            f"{key} {profiled} where this plan runs {kernel}" for key, (profiled, kernel) in other.items()
        )
        log.warning(
            "the latency profile %s timed %s: its predictions are another plan's; "
            "run `skipsearch profile --model %s` again",
            path, timed, self.meta.get("model", "MODEL"),
        )  # fmt: skip
        return True

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
            "head_rows": list(self.head_rows),
            "head_by_rows": list(self.head_by_rows),
            "pillar_choice": list(self.pillar_choice),
            "precisions": {str(bits): costs.to_dict() for bits, costs in sorted(self.precisions.items())},
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
                **{name: tuples(data[name]) for name in cls.TABLES},
                spread={name: tuples(data["spread"][name]) for name in cls.TABLES},
                round_overhead={int(g): float(s) for g, s in data["round_overhead"].items()},
                head_rows=tuple(int(k) for k in data.get("head_rows", ())),
                head_by_rows=tuple(float(t) for t in data.get("head_by_rows", ())),
                pillar_choice=tuple(float(t) for t in data.get("pillar_choice", ())),
                precisions={
                    int(bits): PrecisionCosts.from_dict(costs)
                    for bits, costs in data.get("precisions", {}).items()
                },
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
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

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
