"""A round's time by phase, measured by the engine and predicted by the cost model, in
autoregressive steps; and decode time without the prefill both decoders share."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.closed_forms import SelfSpeculative
from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.timing import RoundTiming


def phase_costs(
    rounds: Sequence[RoundTiming],
    ar_step: float,
    closed: SelfSpeculative,
    calibrated: Calibrated,
    gamma: int,
) -> dict[str, float]:
    """A γ-round's draft, verify and overhead (accept/sample + cache + other), in autoregressive steps.

    Measured from the engine's timings; calibrated from `Calibrated.round_time`; closed form
    `γ r_draft`, `1 - r_reuse` and no overhead.
    """
    step = calibrated.latency.step_time(calibrated.context)
    predicted = calibrated.round_time(gamma)
    return {
        "draft_measured": statistics.fmean(t.draft for t in rounds) / ar_step,
        "draft_calibrated": predicted.draft / step,
        "draft_closed": gamma * closed.r_draft,
        "verify_measured": statistics.fmean(t.verify for t in rounds) / ar_step,
        "verify_calibrated": predicted.verify / step,
        "verify_closed": 1.0 - closed.r_reuse,
        "overhead_measured": statistics.fmean(t.sample + t.cache + t.other for t in rounds) / ar_step,
        "overhead_calibrated": predicted.overhead / step,
    }


def decode_seconds(result: DecodeTrace, prefill: float) -> float:
    """Wall time after the prefill: total minus the prefill the decoder measured; for a result
    without one, the sum of round times for SSD, total minus the estimate `prefill` otherwise.

    Cost-model predictions are per decode step; the prompt's prefill is common to both decoders
    and would only dilute the ratio.
    """
    if result.prefill_seconds is not None:
        return result.seconds - result.prefill_seconds
    if result.timings:
        return sum(t.total for t in result.timings)
    return max(result.seconds - prefill, 1e-9)


def prefill_estimate(results: Sequence[DecodeTrace]) -> float:
    """Median of `seconds - sum(round times)` over SSD decodes of one prompt: the prefill + setup time."""
    return statistics.median(r.seconds - sum(t.total for t in r.timings) for r in results)
