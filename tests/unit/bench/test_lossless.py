"""The lossless check tells a numerical near-tie flip from a real divergence.

A perturbation is injected into the verify pass's logits at one output position, just large
enough to flip the target's argmax to its runner-up there; the check must call that flip numerical
when the gap to the top logit is within epsilon, and a divergence when it is not — whatever the
rank of the token taken.
"""

from dataclasses import replace

import pytest
import torch

from skipsearch.bench.lossless import (
    check_lossless,
    check_runs,
    first_divergence,
    measure_tolerance,
    tie_epsilon,
)
from skipsearch.engine import autoregressive_decode, speculative_decode, steps
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

PROMPT = (5, 17, 3, 42, 8, 23, 11)

NEW_TOKENS = 16

FLIP_AT = 6  # output position whose verify logits are perturbed


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=6))


def top_two(runner: LayerwiseRunner, ids: list[int]) -> tuple[float, int]:
    """(top-1 minus top-2 logit, the runner-up token) of the full model after `ids`."""
    logits = runner.forward(torch.tensor([ids]))[0, -1]
    top = logits.topk(2)
    return float(top.values[0] - top.values[1]), int(top.indices[1])


def perturbed_decode(runner: LayerwiseRunner, monkeypatch: pytest.MonkeyPatch, ar: tuple[int, ...]) -> tuple:
    """SSD whose verify logits at output FLIP_AT favour the runner-up by a hair more than the margin."""
    margin, runner_up = top_two(runner, [*PROMPT, *ar[:FLIP_AT]])
    position = len(PROMPT) + FLIP_AT - 1  # the input position whose logits choose output FLIP_AT
    verify = steps.verify

    def nudged(runner, mask, cache, proposal, pending, start, kv=None, pillars=None):
        logits = verify(runner, mask, cache, proposal, pending, start, kv, pillars)
        if start <= position <= start + len(proposal.tokens):
            logits[position - start, runner_up] += margin * 1.001
        return logits

    monkeypatch.setattr(steps, "verify", nudged)
    mask = SkipMask.from_layers(6, [4])
    out = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=3).tokens
    monkeypatch.undo()
    return out, margin, runner_up


def wrong_at_flip(runner, rank: int) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """(AR output, the same with the token of `rank` at FLIP_AT, that token's gap to the top logit)."""
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    logits = runner.forward(torch.tensor([[*PROMPT, *ar[:FLIP_AT]]]))[0, -1]
    order = logits.argsort(descending=True)
    token = int(order[rank])
    return ar, (*ar[:FLIP_AT], token, *ar[FLIP_AT + 1 :]), float(logits[order[0]] - logits[token])


def test_a_flip_within_epsilon_is_numerical_and_beyond_it_a_divergence(runner, monkeypatch) -> None:
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    flipped, margin, runner_up = perturbed_decode(runner, monkeypatch, ar)
    assert flipped[:FLIP_AT] == ar[:FLIP_AT] and flipped[FLIP_AT] == runner_up != ar[FLIP_AT]

    below = first_divergence(runner, PROMPT, ar, flipped, epsilon=2 * margin)
    assert below.index == FLIP_AT and below.rank == 1 and below.margin == pytest.approx(margin, rel=1e-4)
    assert below.numerical
    above = first_divergence(runner, PROMPT, ar, flipped, epsilon=margin / 2)
    assert not above.numerical

    assert (
        check_lossless(runner, [PROMPT], [ar], [flipped], epsilon=2 * margin).verdict().startswith("PASS (1")
    )
    assert check_lossless(runner, [PROMPT], [ar], [flipped], epsilon=margin / 2).verdict() == (
        "FAIL (0 numerical near-tie flip(s), 1 real divergence(s))"
    )


def test_a_flip_below_the_runner_up_is_numerical_only_within_epsilon(runner) -> None:
    ar, third, gap = wrong_at_flip(runner, rank=2)
    within = first_divergence(runner, PROMPT, ar, third, epsilon=gap * 1.01)
    assert within.index == FLIP_AT and within.rank == 2 and within.numerical
    assert within.margin == pytest.approx(gap, rel=1e-4)
    assert not first_divergence(runner, PROMPT, ar, third, epsilon=gap * 0.99).numerical


def test_a_token_far_below_the_top_is_never_numerical(runner) -> None:
    ar, last, gap = wrong_at_flip(runner, rank=runner.config.vocab_size - 1)
    divergence = first_divergence(runner, PROMPT, ar, last)
    assert divergence.index == FLIP_AT and divergence.rank == runner.config.vocab_size - 1
    assert gap > divergence.epsilon and not divergence.numerical


def test_identical_outputs_pass_and_an_early_stop_does_not(runner) -> None:
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    check = check_lossless(runner, [PROMPT, PROMPT], [ar, ar], [ar, ar[:-3]])
    assert check.divergences[0] is None and check.divergences[1].index == len(ar) - 3
    assert not check.passed and check.to_dict()["divergences"][1]["numerical"] is False


def test_epsilon_is_a_few_ulps_of_the_top_logit() -> None:
    assert tie_epsilon(torch.float32, 20.0) == pytest.approx(8 * 20 * 2**-23)
    assert tie_epsilon(torch.bfloat16, 20.0) == pytest.approx(8 * 20 * 2**-7)
    assert tie_epsilon(torch.bfloat16, 0.1) == pytest.approx(8 * 2**-7)


def test_the_tolerance_is_measured_between_the_decoding_paths(runner) -> None:
    """fp32 paths differ in their last bits only; the same model in bf16 differs by far more, and
    the epsilon it judges by covers both gaps twice (module docstring of bench.lossless)."""
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    fp32 = measure_tolerance(runner, [PROMPT], [ar], width=4)
    assert (fp32.positions, fp32.prompts, fp32.width) == (len(ar), 1, 4)
    assert fp32.verify_gap < 1e-4 and fp32.judge_gap < 1e-4
    half = LayerwiseRunner(tiny_model("llama", layers=6).to(torch.bfloat16))
    bf16 = measure_tolerance(half, [PROMPT], [autoregressive_decode(half, PROMPT, NEW_TOKENS).tokens], 4)
    assert bf16.verify_gap > 100 * max(fp32.verify_gap, 1e-7)
    assert bf16.epsilon == 2 * (bf16.verify_gap + bf16.judge_gap)


def test_a_decode_check_judges_by_its_measured_tolerance(runner, monkeypatch) -> None:
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS)
    flipped, margin, _ = perturbed_decode(runner, monkeypatch, ar.tokens)
    ssd_run = replace(ar, tokens=flipped)
    check = check_runs(runner, [PROMPT], [ar], [ssd_run], width=4)
    assert check.tolerance is not None and check.tolerance.epsilon < margin  # fp32: a flip is real
    assert check.real_divergences == 1 and check.verdict().startswith("FAIL")
    assert check.to_dict()["tolerance"]["epsilon"] == check.tolerance.epsilon
    same = check_runs(runner, [PROMPT], [ar], [ar], width=4)
    assert same.identical and "tolerance" in same.verdict()
