"""The CUDA paths: bf16 losslessness, CUDA-graph tiers and their host syncs, CUDA-event timing.

Sampling on CUDA is checked in distribution by tests/unit/engine/test_sampling.py (its `cuda` case).

Selected with `pytest -m gpu` (the `gpu_check` experiment runs them first); skipped without CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from skipsearch.bench.clock import CudaClock
from skipsearch.bench.lossless import check_lossless
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine.graphs import GraphSteps, make_steps
from skipsearch.engine.tiered import tiered_decode
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tiers.policy import TierPolicy
from tests.conftest import tiny_model
from tests.unit.tiers.conftest import GAMMAS as TIER_GAMMAS
from tests.unit.tiers.conftest import MASKS as TIER_MASKS
from tests.unit.tiers.conftest import NEW_TOKENS as TIER_NEW_TOKENS
from tests.unit.tiers.conftest import POLICY as TIER_POLICY
from tests.unit.tiers.conftest import PROMPT as TIER_PROMPT
from tests.unit.tiers.conftest import ROOM as TIER_ROOM

PROMPT = (5, 17, 3, 42, 8, 23, 11)

NEW_TOKENS = 32

LAYERS = 6

MASKS = [
    SkipMask.prefix(LAYERS, 4),
    SkipMask.from_layers(LAYERS, [1, 4]),
    SkipMask(LAYERS, [2], [2, 3]),
    SkipMask(LAYERS, [], [0]),
]


GAMMAS = (2, 3)

POLICY = TierPolicy(window=2, thresholds=(0.5,))

ROOM = len(PROMPT) + NEW_TOKENS + max(GAMMAS) + 2


def bf16_runner(family: str = "llama", **overrides) -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model(family, layers=LAYERS, **overrides).to("cuda", torch.bfloat16))


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_greedy_ssd_is_lossless_on_cuda_in_bf16(family: str, mask: SkipMask) -> None:
    """Exactly, or parted only at a numerical near-tie (`bench.lossless`)."""
    runner = bf16_runner(family)
    ar = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    ssd = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=3).tokens
    check = check_lossless(runner, [PROMPT], [ar], [ssd])
    assert check.passed, check.to_dict()


def test_a_sliding_window_model_is_captured_within_its_window() -> None:
    runner = bf16_runner("mistral", sliding_window=ROOM)
    masks = (MASKS[0], MASKS[1])
    steps, reason = make_steps(runner, masks, GAMMAS, ROOM, require_graphs=True)
    assert isinstance(steps, GraphSteps) and reason is None
    graphed = tiered_decode(runner, PROMPT, masks, GAMMAS, POLICY, NEW_TOKENS, steps=steps).result.tokens
    eager = tiered_decode(runner, PROMPT, masks, GAMMAS, POLICY, NEW_TOKENS).result.tokens
    assert check_lossless(runner, [PROMPT], [eager], [graphed]).passed


def cuda_syncs(decode: Callable[[], Any]) -> tuple[Any, int]:
    """The decode's result and how many times it made the host wait for the device: under the sync
    debug mode every device->host read and host->device copy warns (a device-wide synchronize does
    not, so the round clock's syncs are not counted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = decode()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, sum("synchroniz" in str(w.message) for w in caught)


def test_graphed_rounds_sync_a_bounded_number_of_times() -> None:
    """A timed round needs only a few."""
    runner = bf16_runner()
    masks = (MASKS[0], MASKS[1])
    steps, _ = make_steps(runner, masks, GAMMAS, ROOM, require_graphs=True)
    out, syncs = cuda_syncs(
        lambda: tiered_decode(runner, PROMPT, masks, GAMMAS, POLICY, NEW_TOKENS, steps=steps)
    )
    rounds = len(out.tiers)
    assert syncs <= 6 * rounds + 10, f"{syncs} syncs over {rounds} rounds"


def test_an_untimed_graphed_round_syncs_once() -> None:
    """Replayed graphs, untimed: a round syncs once, reading the accepted count with the committed
    tokens (`greedy_commit`); its pending token stays on the device. The decode adds three: the
    prompt's copy, its last token's, and the cache check after the last round."""
    runner = bf16_runner()
    masks = (MASKS[0], MASKS[1])
    steps, _ = make_steps(runner, masks, GAMMAS, ROOM, require_graphs=True)
    for new_tokens in (NEW_TOKENS // 2, NEW_TOKENS):
        out, syncs = cuda_syncs(
            lambda n=new_tokens: tiered_decode(
                runner, PROMPT, masks, GAMMAS, POLICY, n, steps=steps, timed=False
            )
        )
        assert out.result.timings == ()
        assert syncs == len(out.tiers) + 3


def test_cuda_events_time_the_kernels_not_the_launch() -> None:
    """A matmul chain queued in microseconds must be charged its device time."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def work() -> torch.Tensor:
        out = a
        for _ in range(20):
            out = out @ a
        return out

    CudaClock(a.device).time(work)  # warm-up
    _, seconds = CudaClock(a.device).time(work)
    flops = 20 * 2 * 4096**3
    assert flops / seconds < 2e15  # no GPU of today does bf16 faster: the time is real
    assert seconds > 1e-4


def test_cuda_graphs_decode_losslessly():
    runner = LayerwiseRunner(tiny_model("llama").to("cuda"))
    expected = autoregressive_decode(runner, TIER_PROMPT, TIER_NEW_TOKENS).tokens
    eager = tiered_decode(runner, TIER_PROMPT, TIER_MASKS, TIER_GAMMAS, TIER_POLICY, TIER_NEW_TOKENS)
    for bucket in (1, 4):
        steps, reason = make_steps(
            runner, TIER_MASKS, TIER_GAMMAS, TIER_ROOM, bucket=bucket, require_graphs=True
        )
        assert isinstance(steps, GraphSteps) and steps.mode.startswith("cuda-graphs") and reason is None
        for _ in range(2):  # the graphs are captured once and replayed for every sequence
            graphed = tiered_decode(
                runner, TIER_PROMPT, TIER_MASKS, TIER_GAMMAS, TIER_POLICY, TIER_NEW_TOKENS, steps=steps
            )
            assert graphed.result.tokens == expected and graphed.tiers == eager.tiers


def test_the_graphed_autoregressive_baseline_and_rounds_match_the_eager_engine() -> None:
    """fp32 on CUDA: the γ = 0 verify graph fed on the device gives the eager baseline's tokens, and
    one mask's graphed rounds give them too."""
    from skipsearch.engine import GammaPolicy
    from skipsearch.engine.graphed_decode import graphed_autoregressive_decode, graphed_speculative_decode

    runner = LayerwiseRunner(tiny_model("llama", layers=LAYERS).to("cuda"))
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    steps = GraphSteps(runner, [MASKS[1]], [3], ROOM)
    assert steps.mode.startswith("cuda-graphs")
    for check_every in (1, 4, 16):
        assert (
            graphed_autoregressive_decode(steps, PROMPT, NEW_TOKENS, check_every=check_every).tokens
            == expected
        )
    assert graphed_speculative_decode(steps, PROMPT, NEW_TOKENS, GammaPolicy.fixed(3)).tokens == expected


def test_graphed_kv_pattern_drafts_equal_the_eager_engine_on_cuda() -> None:
    """fp32 on CUDA, captured: the window gathered from the device-held position (a fixed-size
    buffer, `kv.patterns.StaticKeys`) gives the eager KV-pattern engine's rounds."""
    from skipsearch.cpu.attention_choice import choose_attention
    from skipsearch.engine import GammaPolicy
    from skipsearch.engine.graphed_decode import graphed_speculative_decode
    from skipsearch.masks import KVPattern
    from skipsearch.models.kernels import apply_attention

    model = tiny_model("llama", layers=LAYERS).to("cuda")
    apply_attention(model, choose_attention(torch.float32, "cuda"))
    runner = LayerwiseRunner(model)
    for kv in (KVPattern(2, 6), KVPattern(0, 4)):
        eager = speculative_decode(runner, PROMPT, MASKS[1], NEW_TOKENS, 3, kv=kv)
        steps = GraphSteps(runner, [MASKS[1]], [3], ROOM, kvs=[kv])
        graphed = graphed_speculative_decode(steps, PROMPT, NEW_TOKENS, GammaPolicy.fixed(3))
        assert graphed.tokens == eager.tokens and graphed.accepted == eager.accepted
