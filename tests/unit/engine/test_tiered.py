"""Tier decoding equals autoregressive decoding, eager or with static buffers."""

from __future__ import annotations

import pytest
import torch

from skipsearch.engine import Sampling, autoregressive_decode
from skipsearch.engine.graphs import GraphSteps, make_steps
from skipsearch.engine.steps import EagerSteps
from skipsearch.engine.tiered import tiered_decode
from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.tiers.policy import TierController, TierPolicy
from tests.unit.tiers.conftest import (
    CHEAP,
    GAMMAS,
    MASKS,
    NEW_TOKENS,
    POLICY,
    PROMPT,
    RICH,
    ROOM,
    runner,
)

# Fixtures of another folder's conftest.py, imported: listed so that they count as used.
__all__ = ["runner"]


@pytest.fixture(scope="module")
def reference(runner):
    return autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens


@pytest.mark.parametrize("gammas", [GAMMAS, (1, 1, 1), (6, 6, 6)], ids=str)
def test_greedy_tier_decoding_equals_autoregressive(runner, reference, gammas):
    out = tiered_decode(runner, PROMPT, MASKS, gammas, POLICY, NEW_TOKENS)
    assert out.result.tokens == reference and out.mode == "eager"
    assert len(set(out.tiers)) > 1  # the policy did switch
    controller = TierController(POLICY)  # and it switched as the policy says
    for tier, g, n in zip(out.tiers, out.result.gammas, out.result.accepted, strict=True):
        assert tier == controller.tier and g <= gammas[tier]
        controller.update(n, g)


@pytest.mark.parametrize("bucket", [1, 2])
def test_static_buffers_decode_like_the_eager_path(runner, reference, bucket):
    """The graph code path run without capture: same tokens, same tier choices, reusable."""
    steps = GraphSteps(runner, MASKS, GAMMAS, ROOM, bucket=bucket, capture=False)
    eager = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS)
    static = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS, steps=steps)
    assert static.result.tokens == reference and static.tiers == eager.tiers
    short = (9, *PROMPT[:4])
    again = tiered_decode(runner, short, MASKS, GAMMAS, POLICY, 20, steps=steps)
    assert again.result.tokens == autoregressive_decode(runner, short, 20).tokens
    with pytest.raises(ConfigError, match="cache slots"):
        tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS + 10, steps=steps)


def test_sampled_tier_decoding_is_reproducible(runner):
    def run() -> tuple[int, ...]:
        generator = torch.Generator().manual_seed(11)
        sampling = Sampling(0.8, top_p=0.9)
        return tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, 24, sampling, generator).result.tokens

    assert run() == run() and len(run()) == 24


def test_without_cuda_the_steps_run_eagerly_and_say_so(runner, caplog):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    steps, reason = make_steps(runner, MASKS, GAMMAS, ROOM)
    assert isinstance(steps, EagerSteps) and "no CUDA device" in reason
    assert "no CUDA device" in caplog.text
    with pytest.raises(ConfigError, match=r"--require-graphs, but .* no CUDA device"):
        make_steps(runner, MASKS, GAMMAS, ROOM, require_graphs=True)
    with pytest.raises(ConfigError, match="CUDA graphs need a CUDA device"):
        GraphSteps(runner, MASKS, GAMMAS, ROOM, capture=True)


def test_tiers_for_another_depth_are_rejected(runner):
    with pytest.raises(InvalidMaskError, match="8 layers"):
        tiered_decode(runner, PROMPT, (RICH, CHEAP), (1, 2), TierPolicy(2, (0.5,)), 8)


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
def test_rounds_over_a_static_cache_read_its_lengths_only_when_timed(runner, reference, traffic, timed):
    """A static cache's lengths live on the device (`engine.shared_kv`): each check reads them. Untimed,
    the rounds check them once, after the last round, so a greedy round reads once (`greedy_commit`);
    timed, after the prefill and every round (`Traffic`: what is counted)."""
    steps = GraphSteps(runner, MASKS, GAMMAS, ROOM, capture=False)
    out, seen = traffic(
        lambda: tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS, steps=steps, timed=timed)
    )
    rounds = len(out.tiers)
    assert out.result.tokens == reference and len(out.result.timings) == (rounds if timed else 0)
    checks = 1 + rounds if timed else 1
    assert (seen.reads, seen.checks) == (rounds + checks, checks)
