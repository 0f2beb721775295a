"""The decode benchmark harness: every decoder on the same prompts, interleaved and paired.

`skipsearch decode`, `decode --from tiers.json` and the engine experiments all time decoders
through `benchmark`, so a ratio between two decoders is always measured side by side in one run
(drift hits both alike).
"""

from __future__ import annotations

import torch

from skipsearch.bench.decoders import Decoder
from skipsearch.engine.result import DecodeResult
from skipsearch.progress import progress_bar


def benchmark(
    decoders: dict[str, Decoder],
    prompts: list[tuple[int, ...]],
    repeats: int,
    seed: int,
    device: torch.device,
) -> dict[str, list[DecodeResult]]:
    """Every decoder on every prompt, `repeats` times, interleaved so drift hits all alike.

    One untimed warm-up per decoder first; the decoder order rotates from prompt to prompt.
    Results are in (repeat, prompt) order, so index `k` is the same prompt for every decoder.
    """
    names = list(decoders)
    for name in names:
        decoders[name](prompts[0], torch.Generator(device=device).manual_seed(seed))
    runs: dict[str, list[DecodeResult]] = {name: [] for name in names}
    with progress_bar("decode: interleaved runs", repeats * len(prompts)) as bar:
        for repeat in range(repeats):
            for index, prompt in enumerate(prompts):
                turn = repeat * len(prompts) + index
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + turn)
                    runs[name].append(decoders[name](prompt, generator))
                bar.advance(bar.task_ids[0])
    return runs
