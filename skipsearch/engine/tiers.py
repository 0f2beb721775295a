"""Tiered self-speculative decoding: the draft mask of each round is picked by the tier policy.

Same round as `engine.ssd` — draft, crop the scratch K/V, verify reusing the exact prefix, accept,
roll back, check the cache invariant — with two differences: the mask (and so `s1`) comes from
`TierController` round by round, and the forward passes come from a `TierSteps` object. Every
round starts from a cache that holds exactly the full model's K/V, so switching tiers between
rounds costs nothing: no state of one tier's draft survives into the next round.

`EagerSteps` runs `ssd.draft` / `ssd.verify` over a DynamicCache; `engine.graphs.GraphSteps`
runs the same passes over static buffers and a StaticCache, replayed from pre-captured CUDA
graphs on a GPU (one draft graph per tier, one verify graph per tier and draft length).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from skipsearch.engine import ssd
from skipsearch.engine.cache import crop, prefilled_cache
from skipsearch.engine.result import DecodeResult, new_tokens
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.timing import RoundClock, RoundTiming
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.spaces import TierPolicy
from skipsearch.tiers import TierController, check_policy


@dataclass(frozen=True)
class Round:
    """Where a round starts: its tier, the shared cache, the pending token (`[1, 1]`, at position
    `start`) and how many tokens it drafts."""

    tier: int
    cache: Any
    pending: torch.Tensor
    start: int
    gamma: int


class TierSteps(Protocol):
    """The forward passes of a tiered decode; `mode` says how they run (for logs and reports)."""

    mode: str

    def prefill(self, prompt: Sequence[int]) -> Any:
        """A cache holding the prompt's K/V except the last token's (see `engine.cache`)."""

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> ssd.Proposal:
        """`at.gamma` draft tokens of tier `at.tier` (`ssd.draft`)."""

    def verify(self, at: Round, proposal: ssd.Proposal) -> torch.Tensor:
        """Full-model logits `[γ + 1, V]` of the round (`ssd.verify`)."""


class EagerSteps:
    """`ssd.draft` and `ssd.verify` with the tier's mask over a DynamicCache: the reference path."""

    mode = "eager"

    def __init__(self, runner: LayerwiseRunner, masks: Sequence[SkipMask]) -> None:
        self.runner, self.masks = runner, tuple(masks)

    def prefill(self, prompt: Sequence[int]) -> Any:
        return prefilled_cache(self.runner, prompt)

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> ssd.Proposal:
        mask = self.masks[at.tier]
        return ssd.draft(self.runner, mask, at.cache, at.pending, at.start, at.gamma, sampling, generator)

    def verify(self, at: Round, proposal: ssd.Proposal) -> torch.Tensor:
        return ssd.verify(self.runner, self.masks[at.tier], at.cache, proposal, at.pending, at.start)


@dataclass(frozen=True)
class TieredResult:
    """One prompt's tiered decode: the usual result plus the tier of every round."""

    result: DecodeResult
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
    wrong = next((m for m in masks if m.num_layers != runner.num_layers), None)
    if wrong is not None:
        raise ConfigError(
            f"tier mask {wrong} is for {wrong.num_layers} layers but the model has {runner.num_layers}: "
            "decode with the model the tiers were searched on (--model)"
        )


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
    steps: TierSteps | None = None,
) -> TieredResult:
    """Decode up to `max_new_tokens` after `prompt`, drafting each round `gammas[t]` tokens with
    the mask of the policy's tier `t`.

    Lossless like `speculative_decode`: greedy output equals `autoregressive_decode`'s token for
    token, sampled output follows the target's distribution, whatever tier drafts.
    """
    check_tiers(runner, masks, gammas, policy)
    if max_new_tokens < 1 or not prompt:
        raise ConfigError(f"need a non-empty prompt and max_new_tokens >= 1, got {max_new_tokens}")
    began = time.perf_counter()
    steps = steps if steps is not None else EagerSteps(runner, masks)
    controller = TierController(policy)
    clock = RoundClock(runner.device)
    cache = steps.prefill(prompt)
    tokens = list(prompt)
    tiers: list[int] = []
    drafted: list[int] = []
    accepted: list[int] = []
    timings: list[RoundTiming] = []
    ended = False
    while len(tokens) - len(prompt) < max_new_tokens and not ended:
        clock.start()
        tier, start = controller.tier, len(tokens) - 1
        g = min(gammas[tier], max_new_tokens - (len(tokens) - len(prompt)) - 1)
        at = Round(tier, cache, torch.tensor([[tokens[-1]]], device=runner.device), start, g)
        with clock.phase("draft"):
            proposal = steps.draft(at, sampling, generator)
        with clock.phase("cache"):
            crop(cache, start, range(masks[tier].first_divergent_layer, runner.num_layers))
        with clock.phase("verify"):
            logits = steps.verify(at, proposal)
        n, committed = ssd.settle(cache, tokens, proposal, logits, sampling, generator, clock)
        controller.update(n, g)
        ended = any(token in eos_ids for token in committed)
        tiers.append(tier)
        drafted.append(g)
        accepted.append(n)
        timings.append(clock.finish(start + 1, g, n))
    result = DecodeResult(
        prompt_length=len(prompt),
        tokens=new_tokens(tokens, len(prompt), eos_ids),
        seconds=time.perf_counter() - began,
        gammas=tuple(drafted),
        accepted=tuple(accepted),
        timings=tuple(timings),
    )
    return TieredResult(result, tuple(tiers), steps.mode)
