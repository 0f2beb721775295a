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

How close is close enough is measured, not assumed (`measure_tolerance`): on the decode's own
prompts and outputs, the largest logit difference between the one-position path (autoregressive
decoding, draft steps) and the γ + 1-position path (verify), and between the one-position path
and the whole-sequence pass that judges a flip. If autoregressive decoding takes `a` and verify
takes `b`, then `L1[a] - L1[b] <= 2 g_verify`, and the judge's margin `LF[top] - LF[b]` is at most
that plus `2 g_judge`: so a flip whose judged margin is within `2 (g_verify + g_judge)` can be
numerical, and one beyond it cannot. Without a measurement, `epsilon` defaults to a few units in
the last place of the top logit in the model's dtype (`TIE_ULPS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from skipsearch.engine.result import DecodeTrace
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
class Tolerance:
    """How far logits move between the paths that decode, measured on `positions` output positions
    (module docstring); `epsilon` is the judged margin below which a flip can be numerical."""

    width: int  # positions per verify-style pass (γ + 1)
    verify_gap: float  # max |logit| difference, one-position vs `width`-position passes
    judge_gap: float  # max |logit| difference, one-position vs the whole-sequence pass
    positions: int
    prompts: int

    @property
    def epsilon(self) -> float:
        return 2 * (self.verify_gap + self.judge_gap)

    def describe(self) -> str:
        return (
            f"tolerance {self.epsilon:.3g} logits = 2 x ({self.verify_gap:.3g} + {self.judge_gap:.3g}), the "
            f"largest logit differences measured between 1- and {self.width}-position passes and the judging "
            f"pass over {self.positions} output positions of {self.prompts} prompts"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "epsilon": self.epsilon}


@dataclass(frozen=True)
class LosslessCheck:
    """Per prompt, None (identical outputs) or the first divergence; the tolerance it was judged by."""

    divergences: tuple[Divergence | None, ...]
    tolerance: Tolerance | None = None

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

    @property
    def real_divergences(self) -> int:
        return sum(d is not None and not d.numerical for d in self.divergences)

    def verdict(self) -> str:
        judged = "" if self.tolerance is None else f"; {self.tolerance.describe()}"
        if self.identical:
            return f"PASS (identical{judged})"
        counts = f"{self.near_ties} numerical near-tie flip(s), {self.real_divergences} real divergence(s)"
        return f"{'PASS' if self.passed else 'FAIL'} ({counts}{judged})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "passed": self.passed,
            "near_ties": self.near_ties,
            "real_divergences": self.real_divergences,
            "tolerance": None if self.tolerance is None else self.tolerance.to_dict(),
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
    tolerance: Tolerance | None = None,
) -> LosslessCheck:
    """`first_divergence` of every prompt (outputs in the same prompt order), judged by the measured
    `tolerance` when given, else by `epsilon`."""
    limit = tolerance.epsilon if tolerance is not None else epsilon
    return LosslessCheck(
        tuple(first_divergence(runner, p, a, s, limit) for p, a, s in zip(prompts, ar, ssd, strict=True)),
        tolerance,
    )


def _at(tokens: Sequence[int], index: int) -> int | None:
    return tokens[index] if index < len(tokens) else None


@torch.no_grad()
def path_gaps(
    runner: LayerwiseRunner, prompt: Sequence[int], output: Sequence[int], width: int
) -> tuple[float, float]:
    """(verify gap, judge gap) at every output position of one prompt: the logits that chose
    `output` computed one position at a time, `width` at a time, and in one whole-sequence pass."""
    fed = [*prompt, *output][len(prompt) - 1 : -1]  # the inputs whose logits choose each output token
    device = runner.device

    def passes(step: int) -> torch.Tensor:
        cache = runner.prefill(prompt)
        chunks = [fed[i : i + step] for i in range(0, len(fed), step)]
        return torch.cat(
            [runner.forward(torch.tensor([c], device=device), cache=cache)[0] for c in chunks]
        ).float()

    single = passes(1)
    whole = runner.forward(torch.tensor([[*prompt, *output][:-1]], device=device))[
        0, len(prompt) - 1 :
    ].float()
    return float((single - passes(width)).abs().max()), float((single - whole).abs().max())


def measure_tolerance(
    runner: LayerwiseRunner, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], width: int
) -> Tolerance:
    """The largest path gaps over the prompts' autoregressive outputs (module docstring)."""
    gaps = [
        path_gaps(runner, p, o, width) for p, o in zip(prompts, outputs, strict=True) if len(p) and len(o)
    ]
    return Tolerance(
        width=width,
        verify_gap=max((v for v, _ in gaps), default=0.0),
        judge_gap=max((j for _, j in gaps), default=0.0),
        positions=sum(len(o) for o in outputs),
        prompts=len(gaps),
    )


def check_runs(
    runner: LayerwiseRunner,
    prompts: Sequence[Sequence[int]],
    ar: Sequence[DecodeTrace],
    ssd: Sequence[DecodeTrace],
    width: int | None = None,
) -> LosslessCheck:
    """`check_lossless` over benchmark results, which come in (repeat, prompt) order; with `width`
    (γ + 1, the widest verify pass), judged by a tolerance measured on the first repeat's outputs."""
    cycled = [prompts[k % len(prompts)] for k in range(len(ssd))]
    tolerance = None
    if width is not None:
        tolerance = measure_tolerance(runner, prompts, [r.tokens for r in ar[: len(prompts)]], width)
    return check_lossless(
        runner, cycled, [r.tokens for r in ar], [r.tokens for r in ssd], tolerance=tolerance
    )
