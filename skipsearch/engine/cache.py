"""The one KV cache that draft and verify share, its rollback and its length invariant.

Invariant (checked after every round, reference 001 §3.3): with a sequence of `n` committed
tokens (prompt + output), every layer holds the K/V of positions `0 .. n-2` — length `n - 1`.
The last committed token is *pending*: the next round feeds it (first draft step, or the verify
pass), which writes its K/V. Between rounds per-layer lengths differ (a draft that skips a
layer's attention writes nothing there), so lengths are set and checked layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import DynamicCache

from skipsearch.models.runner import LayerwiseRunner


def prefilled_cache(runner: LayerwiseRunner, prompt: Sequence[int]) -> DynamicCache:
    """A cache holding the prompt's K/V except its last token's, which the first round feeds.

    Sliding-window layers record their past so rollback can restore states beyond the window.
    """
    cache = DynamicCache(config=runner.config)
    if len(prompt) > 1:
        ids = torch.tensor([list(prompt[:-1])], device=runner.device)
        positions = torch.arange(ids.shape[1], device=runner.device)[None]
        runner.run_layers(runner.embed(ids), 0, runner.num_layers, positions, cache=cache)
    cache.activate_past_recording()
    return cache


def layer_lengths(cache: DynamicCache) -> list[int]:
    return [layer.get_seq_length() for layer in cache.layers]


def crop(cache: DynamicCache, length: int, layers: Iterable[int] | None = None) -> None:
    """Cut `layers` (default: all) back to at most `length` positions; shorter layers stay as they are.

    transformers >= 5 `crop(n)` takes minus the number of positions to remove (a positive
    argument, the absolute length of 4.x, raises), so the count is per layer. `crop(0)` is still
    called: it trims a sliding-window layer's recorded past back to the window.
    """
    for index in range(len(cache.layers)) if layers is None else layers:
        layer = cache.layers[index]
        layer.crop(min(0, length - layer.get_seq_length()))


def check_lengths(cache: DynamicCache, expected: int) -> None:
    """Raise AssertionError unless every layer holds exactly `expected` positions."""
    lengths = layer_lengths(cache)
    wrong = {index: n for index, n in enumerate(lengths) if n != expected}
    if wrong:
        raise AssertionError(
            f"KV cache out of step: expected {expected} positions in every layer "
            f"(committed tokens - 1), got {wrong} (layer: length)"
        )
