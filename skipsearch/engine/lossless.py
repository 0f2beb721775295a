"""Greedy losslessness as it can be checked on real hardware: exact, or a numerical near-tie.

The engine commits only tokens that are the verify pass's own argmax, so greedy SSD reproduces
the target exactly in exact arithmetic. On a GPU the verify pass runs γ + 1 positions and
autoregressive decoding one: the kernels differ, bf16 logits differ in their last bits, and where
the target's two best tokens are nearly tied the argmax can flip — after which the sequences part
for good although neither decoder is wrong. So the check compares SSD with autoregressive decoding
and, at the first divergence, asks the full model how close the call was: if SSD took the
autoregressive runner-up and the top-2 margin is within `epsilon`, the flip is numerical; any other
divergence is a bug.

`epsilon` defaults to a few units in the last place of the top logit in the model's dtype
(`TIE_ULPS`): about 1e-5 logits in float32, about 1 in bfloat16 at logits near 20.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from skipsearch.engine.result import DecodeResult
from skipsearch.models.runner import LayerwiseRunner

TIE_ULPS = 8


@dataclass(frozen=True)
class Divergence:
    """Where one prompt's SSD output first differs from autoregressive decoding, and how close it was.

    `margin` is the autoregressive top-1 minus top-2 logit (float32) at that output position;
    `runner_up` says SSD's token was the autoregressive second choice; NaN margin: one output
    stopped early while the tokens agreed.
    """

    index: int
    ar_token: int | None
    ssd_token: int | None
    margin: float
    epsilon: float
    runner_up: bool

    @property
    def numerical(self) -> bool:
        """A near-tie flip: the runner-up taken where the top two were within `epsilon`."""
        return self.runner_up and self.margin <= self.epsilon


@dataclass(frozen=True)
class LosslessCheck:
    """Per prompt, None (identical outputs) or the first divergence."""

    divergences: tuple[Divergence | None, ...]

    @property
    def identical(self) -> bool:
        return all(d is None for d in self.divergences)

    @property
    def passed(self) -> bool:
        """Identical, or parted only at numerical near-ties."""
        return all(d is None or d.numerical for d in self.divergences)

    @property
    def near_ties(self) -> int:
        return sum(d is not None and d.numerical for d in self.divergences)

    def verdict(self) -> str:
        if self.identical:
            return "PASS"
        if self.passed:
            return f"PASS ({self.near_ties} numerical near-tie flip(s))"
        return "FAIL"

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "passed": self.passed,
            "near_ties": self.near_ties,
            "divergences": [
                None if d is None else {**asdict(d), "numerical": d.numerical} for d in self.divergences
            ],
        }


def tie_epsilon(dtype: torch.dtype, top_logit: float) -> float:
    """`TIE_ULPS` units in the last place of `top_logit` in `dtype`."""
    return TIE_ULPS * torch.finfo(dtype).eps * max(abs(top_logit), 1.0)


@torch.no_grad()
def first_divergence(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    ar: Sequence[int],
    ssd: Sequence[int],
    epsilon: float | None = None,
) -> Divergence | None:
    """None when `ssd == ar`; else the first differing output position, judged by the full model."""
    index = next((i for i, (a, s) in enumerate(zip(ar, ssd, strict=False)) if a != s), None)
    if index is None:
        if len(ar) == len(ssd):
            return None
        index = min(len(ar), len(ssd))
        return Divergence(index, _at(ar, index), _at(ssd, index), math.nan, epsilon or 0.0, False)
    ids = torch.tensor([[*prompt, *ar[:index]]], device=runner.device)
    logits = runner.forward(ids)[0, -1].float()
    top = logits.topk(2)
    best, second = top.values.tolist()
    limit = tie_epsilon(runner.model.lm_head.weight.dtype, best) if epsilon is None else epsilon
    runner_up = int(top.indices[1]) == ssd[index]
    return Divergence(index, ar[index], ssd[index], best - second, limit, runner_up)


def check_lossless(
    runner: LayerwiseRunner,
    prompts: Sequence[Sequence[int]],
    ar: Sequence[Sequence[int]],
    ssd: Sequence[Sequence[int]],
    epsilon: float | None = None,
) -> LosslessCheck:
    """`first_divergence` of every prompt (outputs in the same prompt order)."""
    return LosslessCheck(
        tuple(first_divergence(runner, p, a, s, epsilon) for p, a, s in zip(prompts, ar, ssd, strict=True))
    )


def _at(tokens: Sequence[int], index: int) -> int | None:
    return tokens[index] if index < len(tokens) else None


def check_runs(
    runner: LayerwiseRunner,
    prompts: Sequence[Sequence[int]],
    ar: Sequence[DecodeResult],
    ssd: Sequence[DecodeResult],
) -> LosslessCheck:
    """`check_lossless` over benchmark results, which come in (repeat, prompt) order."""
    cycled = [prompts[k % len(prompts)] for k in range(len(ssd))]
    return check_lossless(runner, cycled, [r.tokens for r in ar], [r.tokens for r in ssd])
