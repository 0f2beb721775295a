"""`bench.graphed_profile`: timing leaves the graphed passes as they were, the profile it times loads
and prices rounds, and the launch gap is taken off exactly (eager on a CPU: no capture here; the
chain itself: test_graphed_passes.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from skipsearch.bench.clock import WallClock
from skipsearch.bench.graphed_passes import graphed_passes, run_in_order
from skipsearch.bench.graphed_profile import (
    measure_graphed_latency,
    reconcile,
    time_graphed_passes,
    time_graphed_rounds,
)
from skipsearch.bench.latency_profiler import save_profile
from skipsearch.bench.passes import PassTimes, Samples
from skipsearch.cost.calibrated import Calibrated, predict
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine.shared_kv import layer_lengths
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model
from tests.unit.cost.conftest import _profile

CONTEXTS = (8, 24)

POSITIONS = (1, 3, 4)

LAYERS = 4


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=LAYERS))


@pytest.fixture(scope="module")
def measured(runner: LayerwiseRunner) -> LatencyProfile:
    return measure_graphed_latency(runner, CONTEXTS, POSITIONS, repeats=3, warmup=1, model="tiny")


def test_timing_leaves_every_layer_at_its_context(runner: LayerwiseRunner) -> None:
    grid = graphed_passes(runner, CONTEXTS, POSITIONS, torch.Generator().manual_seed(2))
    samples, whole = time_graphed_passes(grid, 2, 1, WallClock(), torch.Generator().manual_seed(3))
    assert samples.attn.shape == (LAYERS, len(CONTEXTS), len(POSITIONS), 2)
    assert whole.shape == (len(CONTEXTS), len(POSITIONS), 2) and np.all(whole > 0)
    for row, context in zip(grid, CONTEXTS, strict=True):
        assert layer_lengths(row[0].cache) == [context] * LAYERS
        # A pass after timing still sees `context` positions: it computes what it did before.
        graphed = row[-1]
        expected = runner.forward(torch.cat([graphed.tokens, graphed.ids], dim=1))[:, -graphed.ids.shape[1] :]
        torch.testing.assert_close(run_in_order(graphed.parts), expected, rtol=1e-5, atol=1e-5)


def test_the_profile_has_the_tables_the_cost_model_reads(measured: LatencyProfile) -> None:
    shape = (len(CONTEXTS), len(POSITIONS))
    assert np.asarray(measured.attn).shape == np.asarray(measured.mlp).shape == (LAYERS, *shape)
    assert np.asarray(measured.embed).shape == np.asarray(measured.head).shape == shape
    assert np.all(np.asarray(measured.attn) > 0)
    # the tiny head (61 rows) costs less than a part's launch gap on a CPU: `reconcile` holds it at 0
    assert np.all(np.asarray(measured.head) >= 0) and np.all(np.asarray(measured.embed) >= 0)
    assert sorted(measured.round_overhead) == [1, 2, 3]  # every γ with γ + 1 <= 4 positions
    assert min(measured.round_overhead.values()) >= 0  # held at 0 where a CPU round reads below its passes
    assert measured.head_rows == (61,) and measured.head_by_rows[0] > 0  # the tiny vocabulary only
    assert measured.pillar_choice == ()
    meta = measured.meta
    assert (meta["graphs"], meta["capture"], meta["model"], meta["num_layers"]) == (
        True,
        False,
        "tiny",
        LAYERS,
    )
    assert np.asarray(meta["launch_gap_s"]).shape == np.asarray(meta["whole_pass_s"]).shape == shape


def test_the_parts_sum_to_the_whole_pass(measured: LatencyProfile) -> None:
    """Less their launch gap the parts add up to the pass timed as one, unless a part was held at
    zero (which only adds)."""
    for c, context in enumerate(CONTEXTS):
        for k, positions in enumerate(POSITIONS):
            weights = measured.weights(context, positions)
            whole = measured.meta["whole_pass_s"][c][k]
            if 0.0 in (weights.embed, weights.head, *weights.attn, *weights.mlp):
                assert weights.total > whole
            else:
                assert weights.total == pytest.approx(whole, rel=1e-9)


def test_the_profile_round_trips_and_prices_rounds(measured: LatencyProfile, tmp_path: Path) -> None:
    path = save_profile(measured, tmp_path / "profile.json")
    loaded = LatencyProfile.load(path)
    assert loaded == measured and loaded.meta == measured.meta
    mask = SkipMask.from_layers(LAYERS, [1, 2])
    calibrated = Calibrated(loaded, mask, context=16)
    assert calibrated.round_time(3).overhead == loaded.round_overhead[3]  # the settle measured here
    assert calibrated.round_cost(3) > 0
    prediction = predict(_profile("1101"), mask, gamma_max=3, latency=loaded, context=16)
    assert prediction.calibrated is not None


def test_reconcile_takes_an_equal_share_of_the_gap_off_every_part() -> None:
    samples = Samples.empty(layers=1, contexts=1, positions=2, repeats=1)
    samples.record(0, 0, 0, PassTimes(embed=1.0, attn=(2.0,), mlp=(3.0,), head=4.0))
    samples.record(0, 1, 0, PassTimes(embed=0.5, attn=(2.0,), mlp=(3.0,), head=4.0))
    whole = np.asarray([[[6.0], [5.5]]])
    tables, gap = reconcile(samples, whole)
    assert gap.tolist() == [[1.0, 1.0]]  # (10 - 6) / 4 parts, (9.5 - 5.5) / 4
    assert tables["embed"].tolist() == [[0.0, 0.0]]  # 1 - 1, and 0.5 - 1 held at zero
    assert tables["attn"].tolist() == [[[1.0, 1.0]]]
    assert (tables["mlp"].tolist(), tables["head"].tolist()) == ([[[2.0, 2.0]]], [[3.0, 3.0]])


class FixedChain(WallClock):
    """Runs the chained replays and says each took `seconds`: the round's rest is then known."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def chain(self, calls):
        out, _ = super().chain(calls)
        return out, [self.seconds] * len(calls)


def test_a_graphed_round_is_priced_beyond_its_replays(runner: LayerwiseRunner) -> None:
    """A round's wall time less its γ draft replays and its verify replay, chained: replays that
    took 10 s each leave 10 (γ + 1) s less than replays that took nothing."""
    rests = [
        time_graphed_rounds(runner, 8, (1, 3), 3, 1, FixedChain(seconds), torch.Generator().manual_seed(4))
        for seconds in (0.0, 10.0)
    ]
    for gamma in (1, 3):
        free, slow = (float(np.median(rest[gamma])) for rest in rests)
        assert 0 < free < 0.5 and len(rests[1][gamma]) == 3
        assert slow == pytest.approx(free - 10 * (gamma + 1), abs=0.5)


def test_capture_needs_a_cuda_device(runner: LayerwiseRunner) -> None:
    with pytest.raises(ConfigError, match="CUDA graphs need a CUDA device"):
        measure_graphed_latency(runner, (8,), (1, 2), repeats=1, warmup=0, capture=True)
