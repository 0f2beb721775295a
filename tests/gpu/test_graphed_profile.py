"""`bench.graphed_profile` on CUDA: captured parts, chained, are the real forward pass; the events
between replays time the right calls; the profile of the replays loads and prices rounds."""

from __future__ import annotations

import numpy as np
import torch

from skipsearch.bench.clock import CudaClock
from skipsearch.bench.graphed_passes import graphed_passes, run_in_order
from skipsearch.bench.graphed_profile import measure_graphed_latency
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine.shared_kv import layer_lengths
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

LAYERS = 4


def test_captured_parts_chained_compute_the_full_forward_pass() -> None:
    """float32, so the replays and the plain forward of the whole sequence agree to rounding."""
    runner = LayerwiseRunner(tiny_model("llama", layers=LAYERS).to("cuda"))
    with torch.no_grad():
        pool = torch.cuda.graph_pool_handle()
        grid = graphed_passes(runner, (8, 40), (1, 4), torch.Generator().manual_seed(1), pool)
        for row in grid:
            for graphed in row:
                k = graphed.ids.shape[1]
                expected = runner.forward(torch.cat([graphed.tokens, graphed.ids], dim=1))[:, -k:]
                chained = run_in_order(graphed.parts).clone()
                graphed.restore()
                whole = graphed.whole(None).clone()
                graphed.restore()
                torch.testing.assert_close(chained, expected, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(whole, expected, rtol=1e-4, atol=1e-4)
                assert layer_lengths(graphed.cache) == [graphed.context] * LAYERS


def test_chained_events_time_each_call() -> None:
    """A long kernel, then a short one: the first interval holds the long one, the second not."""
    clock = CudaClock(torch.device("cuda"))
    cycles = 20_000_000  # ~10 ms at 2 GHz
    calls = (lambda _: torch.cuda._sleep(cycles), lambda _: torch.ones(1, device="cuda"))
    _, (long, short) = clock.chain(calls)
    assert long > 1e-3 and short < long / 10


def test_the_graphed_profile_on_cuda_loads_and_prices_rounds() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=LAYERS).to("cuda", torch.bfloat16))
    profile = measure_graphed_latency(runner, (16, 64), (1, 2, 4), repeats=5, warmup=1, model="tiny")
    assert profile.meta["capture"] is True and profile.meta["device"].startswith("cuda")
    assert LatencyProfile.from_dict(profile.to_dict()) == profile
    gaps = np.asarray(profile.meta["launch_gap_s"])
    assert gaps.shape == (2, 3) and np.all(np.isfinite(gaps))
    whole = np.asarray(profile.meta["whole_pass_s"])
    for c, context in enumerate(profile.context_lengths):
        for k, positions in enumerate(profile.positions):
            assert profile.weights(context, positions).total >= whole[c, k] * (1 - 1e-9)
    assert Calibrated(profile, SkipMask.from_layers(LAYERS, [1, 2]), context=32).round_cost(3) > 0
