"""The decode benchmark harnesses: every decoder on the same prompts, interleaved and paired.

`skipsearch decode`, `decode --from tiers.json` and the engine experiments all time decoders
through `benchmark`, so a ratio between two decoders is always measured side by side in one run
(drift hits both alike). `bracketed_runs` times many masks against one baseline: each prompt's
autoregressive decode brackets every few SSD decodes (the fidelity comparison).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from skipsearch.bench.decoders import Decoder
from skipsearch.engine.autoregressive import autoregressive_decode
from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.ssd import speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.progress import progress_bar


def benchmark(
    decoders: dict[str, Decoder],
    prompts: list[tuple[int, ...]],
    repeats: int,
    seed: int,
    device: torch.device,
) -> dict[str, list[DecodeTrace]]:
    """Every decoder on every prompt, `repeats` times, interleaved so drift hits all alike.

    One untimed warm-up per decoder first; the decoder order rotates from prompt to prompt.
    Results are in (repeat, prompt) order, so index `k` is the same prompt for every decoder.
    """
    names = list(decoders)
    for name in names:
        decoders[name](prompts[0], torch.Generator(device=device).manual_seed(seed))
    runs: dict[str, list[DecodeTrace]] = {name: [] for name in names}
    with progress_bar("decode: interleaved runs", repeats * len(prompts)) as bar:
        for repeat in range(repeats):
            for index, prompt in enumerate(prompts):
                turn = repeat * len(prompts) + index
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + turn)
                    runs[name].append(decoders[name](prompt, generator))
                bar.advance(bar.task_ids[0])
    return runs


@dataclass
class EngineRuns:
    """SSD decodes per mask label (index = prompt) and the autoregressive decodes of every prompt."""

    ssd: dict[str, list[DecodeTrace]] = field(default_factory=dict)
    ar: list[list[DecodeTrace]] = field(default_factory=list)


def bracketed_runs(
    runner: LayerwiseRunner,
    prompts: Sequence[tuple[int, ...]],
    masks: dict[str, SkipMask],
    gamma: int,
    new_tokens: int,
    eos_ids: Collection[int],
    every: int,
) -> EngineRuns:
    """Every mask on every prompt once, with autoregressive runs bracketing blocks of SSD runs.

    Per prompt the mask order rotates and an autoregressive decode of the same prompt precedes
    every block of `every` SSD decodes, so each SSD run is compared with baseline runs made
    minutes apart at most, under the same background load.
    """
    labels = list(masks)

    def ssd(label: str, prompt: tuple[int, ...], new: int) -> DecodeTrace:
        return speculative_decode(runner, prompt, masks[label], new, gamma, eos_ids=eos_ids)

    def ar(prompt: tuple[int, ...], new: int) -> DecodeTrace:
        return autoregressive_decode(runner, prompt, new, eos_ids=eos_ids)

    ar(prompts[0], 8)  # warm-up, untimed
    ssd(labels[0], prompts[0], 8)
    runs = EngineRuns({label: [] for label in labels}, [])
    blocks = -(-len(labels) // every)
    with progress_bar("fidelity: interleaved engine runs", len(prompts) * (len(labels) + blocks)) as bar:
        for index, prompt in enumerate(prompts):
            order = labels[index % len(labels) :] + labels[: index % len(labels)]
            runs.ar.append([])
            for begin in range(0, len(order), every):
                runs.ar[-1].append(ar(prompt, new_tokens))
                bar.advance(bar.task_ids[0])
                for label in order[begin : begin + every]:
                    runs.ssd[label].append(ssd(label, prompt, new_tokens))
                    bar.advance(bar.task_ids[0])
    return runs
