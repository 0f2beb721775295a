"""The engine's round steps timed as CUDA graphs replay them (`engine.graphs`), and the rounds
they price (`cost.calibrated.MeasuredRound`).

A profile (`profiler`) times launched kernels, which at one position are host-bound; a deployment
replays graphs. Here each graphed call — the full step (the verify graph of an empty draft), each
mask's draft step, and its verify of `g` drafts for every `g` — is timed between device
synchronisations, the rounds interleaved, the first dropped as warm-up, the median kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from skipsearch.cost.calibrated import MeasuredRound
from skipsearch.engine.cache import crop
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.sampling import GREEDY
from skipsearch.engine.ssd import Proposal, Round
from skipsearch.masks import SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.random_weights import random_prompts
from skipsearch.models.runner import LayerwiseRunner


def time_graphed(
    runner: LayerwiseRunner, masks: Sequence[SkipMask], context: int, gammas: Sequence[int], repeats: int
) -> dict[str, float]:
    """Median seconds per call of each graphed step at `context`: `full`, `draft i` (max(gammas)
    draft steps of mask `i`) and `verify i g`."""
    gamma = max(gammas)
    steps = GraphSteps(runner, masks, [gamma] * len(masks), context + gamma + 2)
    prompt = random_prompts(1, context, runner.config.vocab_size, seed=2)[0]
    cache = steps.prefill(prompt)
    pending = torch.tensor([[prompt[-1]]], device=runner.device)
    nothing = Proposal(torch.empty(0, dtype=torch.long, device=runner.device), None, [])
    sync = device_sync(runner.device)
    samples: dict[str, list[float]] = {}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        sync()
        began = time.perf_counter()
        result = call()
        sync()
        samples.setdefault(name, []).append(time.perf_counter() - began)
        crop(cache, context - 1)  # a graph's work is fixed: the K/V it reads change values, not time
        return result

    for _ in range(repeats + 1):  # the first round warms up and is dropped below
        timed("full", lambda: steps.verify(Round(0, cache, pending, context - 1, 0), nothing))
        for tier in range(len(masks)):
            at = Round(tier, cache, pending, context - 1, gamma)
            proposal = timed(f"draft {tier}", lambda at=at: steps.draft(at, GREEDY, None))
            for g in gammas:
                part = replace(proposal, tokens=proposal.tokens[:g], exact=proposal.exact[:g])
                timed(f"verify {tier} {g}", lambda at=at, part=part: steps.verify(at, part))
    return {name: sorted(values[1:])[len(values[1:]) // 2] for name, values in samples.items()}


def graphed_round(
    times: dict[str, float],
    index: int,
    gammas: Sequence[int],
    overhead: Callable[[int], float] = lambda gamma: 0.0,
) -> MeasuredRound:
    """Mask `index`'s round from `time_graphed`'s medians, with the per-round `overhead(γ)` the
    engine spends outside the passes (a profile's `LatencyProfile.overhead`)."""
    draft_step = times[f"draft {index}"] / max(gammas)
    verify = {g: times[f"verify {index} {g}"] for g in gammas}
    return MeasuredRound(times["full"], draft_step, verify, overhead)
