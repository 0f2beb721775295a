"""What a measured `LatencyProfile` says about the closed forms' two assumptions (docs/theory.md,
"Calibrated cost").

Pure arithmetic over the profile: `skipsearch profile` prints it, the experiments tabulate it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile, PrecisionFloor
from skipsearch.cost.verdict import Verdict, judge
from skipsearch.masks import SkipMask

SUMMARY_GAMMAS = tuple(range(1, 9))


@dataclass(frozen=True)
class ProfileSummary:
    """The two numbers the closed forms assume away, per context length (docs/theory.md, "Calibrated cost").

    `draft_cost[i][E - 1]` is `c` of the contiguous draft `[0, E)` at `context_lengths[i]`: its
    one-position step, embedding and head included, over a full step; the closed forms assume
    `E / L`. `verify_cost[i][γ - 1]` is `f(γ)`: a full pass over `γ + 1` positions over one step.
    `head_ratio[i]` is the draft head with `head_rows[i]` rows over the full head: `k / V` if time
    were proportional to rows (empty for a profile without the table).

    For each lower precision the profile timed, `precision_cost[bits][i]` is `c` of the draft
    that keeps every layer at `bits` (the closed forms assume its bytes: `masks.BYTES_SHARE` of the
    layers), and `precision_floor[bits][i]` that step against its memory floor (`PrecisionFloor`:
    seconds, bytes read, floor, bandwidth reached); `precision_floor[16]` is the full step's.
    """

    context_lengths: tuple[int, ...]
    num_layers: int
    draft_cost: tuple[tuple[float, ...], ...]
    gammas: tuple[int, ...]
    verify_cost: tuple[tuple[float, ...], ...]
    head_rows: tuple[int, ...] = ()
    head_ratio: tuple[float, ...] = ()
    precision_cost: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    precision_floor: Mapping[int, tuple[PrecisionFloor, ...]] = field(default_factory=dict)

    @property
    def exits(self) -> range:
        return range(1, self.num_layers + 1)

    def naive(self, exit_layer: int) -> float:
        """`E / L`: the draft cost if time were proportional to layers."""
        return exit_layer / self.num_layers


def summary(profile: LatencyProfile, gammas: Iterable[int] = SUMMARY_GAMMAS) -> ProfileSummary:
    """Effective draft cost `c` per exit layer and verify cost `f(γ)` at every measured context length."""
    gammas = tuple(gammas)
    layers = profile.num_layers
    prefixes = [SkipMask.prefix(layers, exit_layer) for exit_layer in range(1, layers + 1)]
    every_layer = {bits: every_layer_at(bits, layers) for bits in sorted(profile.precisions)}

    def draft_costs(context: int) -> tuple[float, ...]:
        step = profile.weights(context)
        return tuple(mask.r_draft(step) for mask in prefixes)

    def verify_costs(context: int) -> tuple[float, ...]:
        return tuple(profile.weights(context, g + 1).total / profile.step_time(context) for g in gammas)

    return ProfileSummary(
        context_lengths=profile.context_lengths,
        num_layers=layers,
        draft_cost=tuple(draft_costs(c) for c in profile.context_lengths),
        gammas=gammas,
        verify_cost=tuple(verify_costs(c) for c in profile.context_lengths),
        head_rows=profile.head_rows,
        head_ratio=tuple(t / profile.head_by_rows[-1] for t in profile.head_by_rows),
        precision_cost={
            bits: tuple(every_layer[bits].r_draft(profile.weights(c)) for c in profile.context_lengths)
            for bits in every_layer
        },
        precision_floor={
            bits: tuple(profile.precision_floor(bits, c) for c in profile.context_lengths)
            for bits in (16, *every_layer)
        },
    )


def every_layer_at(bits: int, num_layers: int) -> SkipMask:
    """The draft that skips nothing and reads every layer's weights at `bits`."""
    return SkipMask.parse(f"w{bits}:0-{num_layers - 1}", num_layers)


def precision_ceilings(
    profile: LatencyProfile, context: float, gammas: Iterable[int] = SUMMARY_GAMMAS
) -> dict[int, Verdict]:
    """For each lower precision the profile timed, the verdict (`cost.verdict`) on the draft that
    keeps every layer at it as if every drafted token were accepted: its best speedup over `gammas`,
    `(γ + 1) / round cost` (`cost.calibrated`, at `context`, clamped to the profiled range). No
    acceptance does better, so a precision whose ceiling does not pay cannot pay at all, while one
    whose ceiling pays is worth searching (what it pays is the search's call, by its acceptance)."""
    low, high = profile.context_lengths[0], profile.context_lengths[-1]
    at = min(max(context, low), high)
    ceilings = {}
    for bits in sorted(profile.precisions):
        form = Calibrated(profile, every_layer_at(bits, profile.num_layers), at)
        best = max((g + 1) / form.round_cost(g) for g in gammas)
        ceilings[bits] = judge("calibrated", {"calibrated": best})
    return ceilings
