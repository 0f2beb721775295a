"""Decoding on captured CUDA graphs (`engine.graphs.GraphSteps`): the autoregressive baseline and
one mask's speculative rounds, so a graphed SSD is timed against a graphed baseline.

A graph replay costs the host a few microseconds, so a graphed decode is as fast as its host reads:
each one waits for every queued kernel. The autoregressive loop therefore chooses each token on the
device, writes it into the step's static input there and moves the position on the device
(`GraphSteps.advance_full_step`); it reads the tokens back once every `check_every` tokens, to see
an end of sequence. The tokens it decodes past one (at most `check_every - 1`) are dropped, as the
output stops at the first end-of-sequence token like `autoregressive_decode`'s.

The speculative rounds are `engine.ssd.run_rounds` over the graphed steps, with one mask and the
γ controller (`speculative_decode`'s schedule); an untimed greedy round reads the host once, to
accept. Token-tree rounds on the same steps' cache and pool: `engine.graphed_tree`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch

from skipsearch.engine.gamma import GammaController, GammaPolicy
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.result import DecodeTrace, new_tokens
from skipsearch.engine.sampling import GREEDY, Sampling, sample
from skipsearch.engine.ssd import OneMask, run_rounds
from skipsearch.errors import ConfigError
from skipsearch.models.device import device_sync

CHECK_EVERY = 16  # tokens between end-of-sequence checks: one host read per 16 graphed steps


@torch.no_grad()
def graphed_autoregressive_decode(
    steps: GraphSteps,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    check_every: int = CHECK_EVERY,
) -> DecodeTrace:
    """`autoregressive_decode` on the γ = 0 verify graph of `steps`: the same tokens (greedy), one
    host read per `check_every` tokens instead of one per token."""
    if max_new_tokens < 1 or not prompt:
        raise ConfigError(f"need a non-empty prompt and max_new_tokens >= 1, got {max_new_tokens}")
    if check_every < 1:
        raise ConfigError(f"check_every must be >= 1, got {check_every}")
    steps.check_room(len(prompt) + max_new_tokens)
    began = time.perf_counter()
    steps.prefill(prompt)
    device_sync(steps.runner.device)()
    prefilled = time.perf_counter()
    chosen = torch.empty(max_new_tokens, dtype=torch.long, device=steps.runner.device)
    steps.point_full_step(prompt[-1], len(prompt) - 1)
    output: list[int] = []
    ended = False
    while len(output) < max_new_tokens and not ended:
        first = len(output)
        last = min(first + check_every, max_new_tokens)
        for index in range(first, last):
            logits = steps.full_step()[-1]
            if sampling.greedy:
                chosen[index] = logits.argmax()
            else:
                chosen[index] = sample(sampling.probs(logits), generator)[0]
            steps.advance_full_step(chosen[index])
        fresh = chosen[first:last].tolist()  # the one host read of the chunk
        output += fresh
        ended = any(token in eos_ids for token in fresh)
    tokens = new_tokens([*prompt, *output], len(prompt), eos_ids)
    return DecodeTrace(len(prompt), tokens, time.perf_counter() - began, prefill_seconds=prefilled - began)


@torch.no_grad()
def graphed_speculative_decode(
    steps: GraphSteps,
    prompt: Sequence[int],
    max_new_tokens: int,
    policy: GammaPolicy,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    timed: bool = False,
) -> DecodeTrace:
    """`speculative_decode` with mask 0 of `steps` (and its draft head), on their graphs; `timed`
    records the rounds' phases, at a device sync per phase boundary (`engine.timing.RoundClock`).

    The graphs cover draft lengths up to the one `steps` was built for; a policy that could ask for
    more, or that stops drafts early (`stop_below`, which reads each draft token's confidence on
    the host), is refused."""
    widest = policy.initial if policy.is_fixed else policy.gamma_max
    captured = max(g for tier, g in steps.verifies if tier == 0)
    if widest > captured:
        raise ConfigError(
            f"the draft may run {widest} tokens but the graphs were captured up to {captured}: "
            f"build GraphSteps with gamma {widest}"
        )
    if policy.stop_below:
        raise ConfigError("graphed drafts run their full length: a draft stop needs the eager engine")
    schedule = OneMask(GammaController(policy))
    result, _ = run_rounds(
        steps.runner, prompt, max_new_tokens, steps, schedule, sampling, generator, eos_ids, timed
    )
    return result
