"""`skipsearch.bench.latency_profiler` and `skipsearch profile`: shapes, fixed context, summary, CLI
errors."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from skipsearch.bench.clock import WallClock
from skipsearch.bench.latency_profiler import (
    PrecisionTimings,
    ProcessTimings,
    _warn_if_noisy,
    combine,
    head_row_counts,
    measure_latency,
    save_profile,
)
from skipsearch.bench.passes import Samples, prefill_cache, round_bookkeeping, time_pass
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profile_summary import summary
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

CONTEXTS = (8, 24)

POSITIONS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=4))


@pytest.fixture(scope="module")
def measured(runner: LayerwiseRunner) -> LatencyProfile:
    return measure_latency(runner, CONTEXTS, POSITIONS, repeats=3, warmup=1, model="tiny")


# -- several processes ---------------------------------------------------------------------------


def _measurement(attn: list[float], overhead: list[float], bandwidth: float = 1e10) -> ProcessTimings:
    """One layer, one context, one position count; every table holds the `attn` samples, and at
    int8 a tenth of them (its step reads 100 bytes of weights)."""
    samples = Samples.empty(layers=1, contexts=1, positions=1, repeats=len(attn))
    int8 = Samples.empty(layers=1, contexts=1, positions=1, repeats=len(attn))
    for table in (samples.embed, samples.head, samples.attn, samples.mlp):
        table[...] = attn
    for table in (int8.embed, int8.head, int8.attn, int8.mlp):
        table[...] = np.asarray(attn) / 10
    pillars = np.asarray([attn]) / 4
    return ProcessTimings(
        samples,
        {1: np.asarray(overhead)},
        (4, 8),
        np.asarray([attn, attn]) / 2,
        pillars,
        bandwidth,
        {8: PrecisionTimings(int8, (1,), 100.0)},
    )


# -- summary -------------------------------------------------------------------------------------


def _handmade() -> LatencyProfile:
    """Two layers, one context; embed 1, attn 1 -> 2, mlp 2 -> 3, head 2 -> 4 (positions 1 -> 3)."""
    tables = {"embed": [[1, 1]], "head": [[2, 4]], "attn": [[[1, 2]]] * 2, "mlp": [[[2, 3]]] * 2}
    return LatencyProfile.from_dict(
        {
            "meta": {"num_layers": 2},
            "context_lengths": [100],
            "positions": [1, 3],
            **tables,
            "spread": tables,
            "round_overhead": {"1": 0.0},
        }
    )


# -- measuring -----------------------------------------------------------------------------------


def test_profile_has_the_right_shapes_and_positive_times(measured: LatencyProfile) -> None:
    assert (measured.context_lengths, measured.positions, measured.num_layers) == (CONTEXTS, POSITIONS, 4)
    for name in LatencyProfile.TABLES:
        for table in (getattr(measured, name), measured.spread[name]):
            values = torch.tensor(table)
            layers = () if name in ("embed", "head") else (4,)
            assert values.shape == (*layers, len(CONTEXTS), len(POSITIONS))
    assert all(torch.tensor(getattr(measured, name)).min() > 0 for name in LatencyProfile.TABLES)
    assert sorted(measured.round_overhead) == [1, 2, 3]  # gamma + 1 <= 4 positions
    assert min(measured.round_overhead.values()) > 0
    assert measured.meta["num_layers"] == 4
    assert (measured.meta["device"], measured.meta["model"], measured.meta["repeats"]) == ("cpu", "tiny", 3)
    assert measured.meta["processes"] == 1
    # A pillar round's choice and gather, at every context.
    assert len(measured.pillar_choice) == len(CONTEXTS) and min(measured.pillar_choice) > 0
    assert measured.meta["pillar_pattern"] == "s4w256k64"


def test_draft_heads_are_timed_for_each_row_count_below_the_vocabulary() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=2, vocab_size=2500))
    profile = measure_latency(runner, (8,), (1, 2), repeats=2, warmup=0, head_rows=(4096, 1024, 2048))
    assert profile.head_rows == (1024, 2048, 2500)
    assert len(profile.head_by_rows) == 3 and min(profile.head_by_rows) > 0
    assert profile.meta["vocab_size"] == profile.vocab_size == 2500
    assert head_row_counts(61) == (61,)
    with pytest.raises(ConfigError, match="head rows"):
        head_row_counts(100, (0, 8))


def test_json_round_trip(measured: LatencyProfile, tmp_path: Path) -> None:
    path = save_profile(measured, tmp_path / "sub" / "profile.json")
    assert LatencyProfile.load(path) == measured
    assert set(LatencyProfile.load(path).precisions) == {8, 4}  # the int8/int4 costs too
    assert [p.name for p in path.parent.iterdir()] == ["profile.json"]  # no staging file left


# -- drafts at lower precision -------------------------------------------------------------------


def test_each_layer_is_timed_at_int8_and_int4(measured: LatencyProfile) -> None:
    """Per-layer costs by precision on the profile's contexts, at the rows a draft pass runs (one
    here: `PRECISION_POSITIONS` beyond the longest pass timed are left out), and the whole step."""
    assert sorted(measured.precisions) == [4, 8]
    for bits, costs in measured.precisions.items():
        assert costs.positions == (1,)
        for table in (costs.attn, costs.mlp):
            assert np.asarray(table).shape == (4, len(CONTEXTS), 1)
            assert np.asarray(table).min() > 0
        assert len(costs.step) == len(CONTEXTS) and min(costs.step) > 0
        # every layer's projections read at `bits`: less than the model's own float32 bytes
        assert costs.weight_bytes is not None and costs.weight_bytes < measured.meta["weight_bytes"]
        assert measured.precision_floor(bits, CONTEXTS[0]).seconds == pytest.approx(costs.step[0])
    assert measured.precisions[4].weight_bytes < measured.precisions[8].weight_bytes
    # a mixed draft is priced by what it runs: layer 0 at int4, layer 1 skipped, the rest full
    mixed = SkipMask.parse("a:1|m:1|w4:0", 4)
    step = measured.weights(CONTEXTS[0])
    low_attn, low_mlp = step.low_bits[4]
    runs = low_attn[0] + low_mlp[0] + sum(step.attn[2:]) + sum(step.mlp[2:])
    assert mixed.r_draft(step) == pytest.approx((step.embed + runs + step.head) / step.total)
    assert not measured.check_precisions(mixed)  # measured: no bytes fallback


def test_precision_passes_cover_a_tree_draft_s_rows() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=2))
    profile = measure_latency(runner, (8,), (1, 2, 8), repeats=1, warmup=0, precisions=(8,))
    assert set(profile.precisions) == {8} and profile.precisions[8].positions == (1, 8)
    assert np.asarray(profile.precisions[8].mlp).shape == (2, 1, 2)
    assert measure_latency(runner, (8,), (1, 2), repeats=1, warmup=0, precisions=()).precisions == {}


@pytest.mark.parametrize("bits", [8, 4])
def test_a_timed_pass_at_lower_precision_is_the_draft_s_forward(
    runner: LayerwiseRunner, monkeypatch: pytest.MonkeyPatch, bits: int
) -> None:
    """The pass timed at `bits` computes what the draft that reads every layer at `bits` does."""
    mask = runner.prepare_every_layer(bits)
    cache = prefill_cache(runner, 8, torch.Generator().manual_seed(0))
    ids = torch.randint(0, 61, (1, 1))
    logits: list[torch.Tensor] = []
    head = runner.head
    monkeypatch.setattr(runner, "head", lambda hidden: logits.append(head(hidden)) or logits[-1])
    time_pass(runner, cache, ids, WallClock(), bits)
    monkeypatch.undo()
    drafted = runner.forward(ids, mask, cache=cache)
    assert torch.allclose(logits[0], drafted, atol=1e-5)
    assert not torch.allclose(logits[0], runner.forward(ids, cache=cache), atol=1e-5)
    assert cache.get_seq_length() == 10  # the two forwards above appended; the timed pass did not


def test_an_older_profile_without_precision_timings_loads_and_falls_back_to_bytes(
    measured: LatencyProfile, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = measured.to_dict()
    del data["precisions"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = LatencyProfile.load(path)
    assert old.precisions == {}
    mask = SkipMask.parse("w4:0-3", 4)
    step = old.weights(CONTEXTS[0])
    by_bytes = 0.3125 * (sum(step.attn) + sum(step.mlp))
    assert mask.r_draft(step) == pytest.approx((step.embed + by_bytes + step.head) / step.total)
    assert old.check_precisions(mask) and old.check_precisions(mask)
    assert caplog.text.count("no int4 timings") == 1  # said once


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_timed_passes_leave_the_cache_at_the_context_length(family: str) -> None:
    """Mistral with a window shorter than the context checks the sliding layers' crop too."""
    model = tiny_model(family, layers=4, sliding_window=16) if family == "mistral" else tiny_model(family)
    runner = LayerwiseRunner(model)
    cache = prefill_cache(runner, 24, torch.Generator().manual_seed(0))
    for positions in POSITIONS:
        ids = torch.randint(0, 61, (1, positions))
        times = time_pass(runner, cache, ids, WallClock())
        assert len(times.attn) == len(times.mlp) == runner.num_layers
        assert cache.get_seq_length() == 24
        assert all(layer.get_seq_length() == 24 for layer in cache.layers)


def test_timed_pass_is_a_real_forward(runner: LayerwiseRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timed pass computes what the runner's own forward does: the clock changes nothing."""
    cache = prefill_cache(runner, 8, torch.Generator().manual_seed(0))
    ids = torch.randint(0, 61, (1, 3))
    logits: list[torch.Tensor] = []
    head = runner.head
    monkeypatch.setattr(runner, "head", lambda hidden: logits.append(head(hidden)) or logits[-1])
    time_pass(runner, cache, ids, WallClock())
    assert torch.allclose(logits[0], runner.forward(ids, cache=cache), atol=1e-5)


def test_round_bookkeeping_counts_matches_and_crops_the_drafts(runner: LayerwiseRunner) -> None:
    cache = prefill_cache(runner, 10, torch.Generator().manual_seed(0))
    logits = torch.randn(4, 61)
    assert round_bookkeeping(list(logits[:3].split(1)), logits, cache) == 3
    assert cache.get_seq_length() == 7
    swapped = torch.cat([logits[1:2], logits[0:1]])
    assert round_bookkeeping(list(swapped.split(1)), logits[:3], cache) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"context_lengths": ()}, "context lengths"),
        ({"context_lengths": (0, 8)}, "context lengths"),
        ({"positions": (1,)}, "at least 2"),
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
        ({"context_lengths": (250,)}, "256 positions"),
    ],
)
def test_bad_settings_are_config_errors(runner: LayerwiseRunner, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        measure_latency(runner, **options)


def test_a_busy_device_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    quiet = Samples.empty(layers=2, contexts=1, positions=1, repeats=4)
    quiet.attn[...] = [1.0, 1.1, 1.2, 1.3]
    _warn_if_noisy(quiet)
    assert not caplog.records
    quiet.attn[...] = [1.0, 5.0, 30.0, 60.0]  # stalls of a shared CPU
    _warn_if_noisy(quiet)
    assert "noisy" in caplog.text


def test_processes_are_combined_by_the_mean_of_their_medians() -> None:
    """A fast process (median 1) and a slow one (median 3, one stalled sample) average to 2."""
    fast = _measurement([1.0, 1.0, 1.2], [0.1, 0.3], bandwidth=1e10)
    slow = _measurement([2.9, 3.0, 50.0], [0.5, 0.5], bandwidth=2e10)
    profile = combine([fast, slow], {"model": "m", "num_layers": 1}, [8], [1])
    assert profile.attn == ((((1.0 + 3.0) / 2,),),)
    assert profile.embed == ((2.0,),) and profile.mlp == profile.attn
    # The spread is the IQR of all six samples: 75th percentile 2.975, 25th 1.05.
    assert profile.spread["attn"][0][0][0] == pytest.approx(2.975 - 1.05)
    assert profile.round_overhead == {1: pytest.approx((0.2 + 0.5) / 2)}
    assert (profile.meta["processes"], profile.meta["repeats"], profile.meta["model"]) == (2, 6, "m")
    # A pass is embed + head + attn + mlp: 4 x 1 ms in the fast process, 4 x 3 ms in the slow one.
    assert profile.meta["process_pass_ms"] == [4000.0, 12000.0]
    # The draft head took half of `attn` in each process: medians 0.5 and 1.5.
    assert (profile.head_rows, profile.head_by_rows) == ((4, 8), (pytest.approx(1.0), pytest.approx(1.0)))
    assert profile.meta["copy_bandwidth"] == pytest.approx(1.5e10)  # the processes' mean
    assert profile.pillar_choice == (pytest.approx((0.25 + 0.75) / 2),)  # a quarter of `attn`'s medians
    # int8: a tenth of every sample, so a tenth of each table; the step is the median of each whole
    # pass (4 parts: 0.4, 0.4, 0.48 fast; 1.16, 1.2, 20 slow), averaged over the processes.
    int8 = profile.precisions[8]
    assert int8.attn == ((((0.1 + 0.3) / 2,),),) and int8.mlp == int8.attn
    assert int8.step == (pytest.approx((0.4 + 1.2) / 2),)
    assert (int8.weight_bytes, int8.positions) == (100.0, (1,))


def test_summary_exact_numbers() -> None:
    digest = summary(_handmade(), gammas=(1, 2))
    # step = 1 + (1 + 2) * 2 + 2 = 9; exit 1 runs embed, layer 0 and head: 6 / 9, not E/L = 1/2.
    assert digest.draft_cost == ((pytest.approx(6 / 9), pytest.approx(1.0)),)
    assert (digest.naive(1), list(digest.exits)) == (0.5, [1, 2])
    # gamma = 2 runs 3 positions: 1 + (2 + 3) * 2 + 4 = 15; gamma = 1 interpolates to 12.
    assert digest.verify_cost == ((pytest.approx(12 / 9), pytest.approx(15 / 9)),)


def test_summary_head_ratio() -> None:
    data = {**_handmade().to_dict(), "head_rows": [2, 8], "head_by_rows": [0.5, 2.0]}
    digest = summary(LatencyProfile.from_dict(data))
    assert (digest.head_rows, digest.head_ratio) == ((2, 8), (0.25, 1.0))
    assert summary(_handmade()).head_rows == ()


def test_summary_of_a_measured_profile(measured: LatencyProfile) -> None:
    digest = summary(measured)
    assert digest.gammas == tuple(range(1, 9))
    for costs in digest.draft_cost:
        assert costs[-1] == pytest.approx(1.0)
        assert all(a < b for a, b in itertools.pairwise(costs))
        assert costs[0] > 0
    assert all(len(row) == 8 and min(row) > 0 for row in digest.verify_cost)


def test_profile_module_imports_without_torch() -> None:
    code = (
        "import sys, skipsearch.bench.latency_profiler, skipsearch.cli.profile; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
