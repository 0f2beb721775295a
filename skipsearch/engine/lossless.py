"""Greedy losslessness as it can be checked on real hardware: exact, or a numerical near-tie.

The engine commits only tokens that are the verify pass's own argmax, so greedy SSD reproduces
the target exactly in exact arithmetic. On a GPU the verify pass runs γ + 1 positions and
autoregressive decoding one: the kernels differ, bf16 logits differ in their last bits, and where
the target's two best tokens are nearly tied the argmax can flip — after which the sequences part
for good although neither decoder is wrong. So the check compares SSD with autoregressive decoding
and, at the first divergence, asks the full model how close the call was: if SSD's token scores
within `epsilon` of the top logit, the flip is numerical; any other divergence is a bug. The token
need not be the runner-up: where several logits lie within a few ulps (random weights in bf16 give
whole clusters of them) a flip to the third is as numerical as a flip to the second — the first
GPU check saw exactly that, for HF `generate` against our autoregressive path too.

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

    `margin` is the full model's top logit minus the logit of SSD's token (float32) at that output
    position: how far the flip had to reach; `rank` is SSD's token's place among the full model's
    logits (1 = the runner-up); NaN margin: one output stopped early while the tokens agreed.
    """

    index: int
    ar_token: int | None
    ssd_token: int | None
    margin: float
    epsilon: float
    rank: int | None

    @property
    def numerical(self) -> bool:
        """A near-tie flip: SSD's token scored within `epsilon` of the top logit."""
        return self.margin <= self.epsilon


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
        return Divergence(index, _at(ar, index), _at(ssd, index), math.nan, epsilon or 0.0, None)
    ids = torch.tensor([[*prompt, *ar[:index]]], device=runner.device)
    logits = runner.forward(ids)[0, -1].float()
    best = float(logits.max())
    chosen = float(logits[ssd[index]])
    limit = tie_epsilon(runner.model.lm_head.weight.dtype, best) if epsilon is None else epsilon
    rank = int((logits > chosen).sum())
    return Divergence(index, ar[index], ssd[index], best - chosen, limit, rank)


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
