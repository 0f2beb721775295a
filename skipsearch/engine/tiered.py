"""Tiered self-speculative decoding: the draft mask of each round is picked by the tier policy.

The rounds are `engine.ssd`'s (`run_rounds`: draft, crop the scratch K/V, verify reusing the
exact prefix, accept, roll back, check the cache invariant); here the mask of each round (and so
`s1`) and its draft length come from `TierController`. Every round starts from a cache that holds
exactly the full model's K/V, so switching tiers between rounds costs nothing.

`engine.steps.EagerSteps` runs the passes over a DynamicCache; `engine.graphs.GraphSteps` runs
the same passes over static buffers and a StaticCache, replayed from pre-captured CUDA graphs on a
GPU (one draft graph per tier, one verify graph per tier and draft length).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from skipsearch.engine import ssd
from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.steps import EagerSteps, RoundSteps
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tiers.policy import TierController, TierPolicy, check_policy


@dataclass
class TierSchedule:
    """The policy's tier picks the mask of each round and its fixed draft length."""

    controller: TierController
    gammas: Sequence[int]

    def next_round(self) -> tuple[int, int]:
        tier = self.controller.tier
        return tier, self.gammas[tier]

    def update(self, accepted: int, drafted: int) -> None:
        self.controller.update(accepted, drafted)


@dataclass(frozen=True)
class TieredResult:
    """One prompt's tiered decode: the usual result plus the tier of every round."""

    result: DecodeTrace
    tiers: tuple[int, ...]
    mode: str

    def to_dict(self) -> dict:
        return {**self.result.to_dict(), "tiers": list(self.tiers), "mode": self.mode}


def check_tiers(
    runner: LayerwiseRunner, masks: Sequence[SkipMask], gammas: Sequence[int], policy: TierPolicy
) -> None:
    check_policy(policy, len(masks))
    if len(gammas) != len(masks) or min(gammas) < 1:
        raise ConfigError(f"need one draft length >= 1 per tier, got {list(gammas)} for {len(masks)} tiers")
    for mask in masks:
        mask.check_fits(runner.num_layers)


@torch.no_grad()
def tiered_decode(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    masks: Sequence[SkipMask],
    gammas: Sequence[int],
    policy: TierPolicy,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    steps: RoundSteps | None = None,
    timed: bool = True,
) -> TieredResult:
    """Decode up to `max_new_tokens` after `prompt`, drafting each round `gammas[t]` tokens with
    the mask of the policy's tier `t`.

    Lossless like `speculative_decode`: greedy output equals `autoregressive_decode`'s token for
    token, sampled output follows the target's distribution, whatever tier drafts. `timed` records
    each round's phase breakdown, at the cost of device syncs (`ssd.run_rounds`).
    """
    check_tiers(runner, masks, gammas, policy)
    steps = steps if steps is not None else EagerSteps(runner, masks)
    schedule = TierSchedule(TierController(policy), gammas)
    result, tiers = ssd.run_rounds(
        runner, prompt, max_new_tokens, steps, schedule, sampling, generator, eos_ids, timed
    )
    return TieredResult(result, tiers, steps.mode)
