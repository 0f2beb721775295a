"""Plain autoregressive decoding through the layer-wise runner: the baseline SSD must reproduce.

Same prefill, cache and length invariant as `speculative_decode`, one full-model step per token.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch

from skipsearch.engine.result import DecodeTrace, new_tokens
from skipsearch.engine.sampling import GREEDY, Sampling, sample
from skipsearch.engine.shared_kv import check_lengths
from skipsearch.errors import ConfigError
from skipsearch.models.device import device_sync
from skipsearch.models.kernels import engaged
from skipsearch.models.runner import LayerwiseRunner


@torch.no_grad()
def autoregressive_decode(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
) -> DecodeTrace:
    """Decode up to `max_new_tokens` after `prompt`, stopping after an end-of-sequence token."""
    if max_new_tokens < 1 or not prompt:
        raise ConfigError(f"need a non-empty prompt and max_new_tokens >= 1, got {max_new_tokens}")
    began = time.perf_counter()
    cache = runner.prefill(prompt)
    device_sync(runner.device)()
    prefilled = time.perf_counter()
    tokens = list(prompt)
    with engaged():  # the busy cores' helpers, where the kernel plan has them
        while len(tokens) - len(prompt) < max_new_tokens and (
            len(tokens) == len(prompt) or tokens[-1] not in eos_ids
        ):
            logits = runner.step(tokens[-1], len(tokens) - 1, cache)
            token = logits.argmax() if sampling.greedy else sample(sampling.probs(logits), generator)
            tokens.append(int(token))
            check_lengths(cache, len(tokens) - 1)
    decoded = new_tokens(tokens, len(prompt), eos_ids)
    return DecodeTrace(len(prompt), decoded, time.perf_counter() - began, prefill_seconds=prefilled - began)
