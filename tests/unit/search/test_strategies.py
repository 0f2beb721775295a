"""Ranking, knapsack and knapsack+TPE on the synthetic landscape of test_search, the knapsack DP
against brute force, and context-aware scoring on a synthetic latency profile."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.acceptance.rounds import AcceptanceProfile
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask, SublayerWeights
from skipsearch.search import load_study, make_strategy, study_trials_frame
from skipsearch.search.knapsack import knapsack_frontier
from skipsearch.search.objective import make_scorer
from skipsearch.search.space_files import load_space
from tests.test_search import ATTN_DAMAGE, MLP_DAMAGE, NUM_LAYERS, CountingEvaluator, no_fsync, search

__all__ = ["no_fsync"]  # the autouse fixture of test_search, used here too

# The synthetic landscape's own damages as the importance: what a perfect proxy would say.
IMPORTANCE = SublayerImportance(
    "proxy", tuple(ATTN_DAMAGE), tuple(MLP_DAMAGE), tuple(ATTN_DAMAGE + MLP_DAMAGE)
)


# -- the DP ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knapsack_frontier_is_the_brute_force_pareto_front(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, weights = rng.random(8), rng.integers(1, 5, 8).astype(float)
    counts = range(2, 6)
    subsets = [c for k in counts for c in itertools.combinations(range(8), k)]

    def point(items: tuple[int, ...]) -> tuple[float, float]:
        return sum(weights[list(items)]), sum(values[list(items)])

    front = {
        point(s)
        for s in subsets
        if not any(
            point(o)[0] >= point(s)[0] and point(o)[1] < point(s)[1] - 1e-12 for o in subsets if o != s
        )
    }
    frontier = knapsack_frontier(values, weights, counts)
    got = [point(s) for s in frontier]
    assert all(len(s) in counts for s in frontier)
    assert {(round(w, 9), round(v, 9)) for w, v in got} == {(round(w, 9), round(v, 9)) for w, v in front}
    assert [w for w, _ in got] == sorted(w for w, _ in got)


# -- strategies on the synthetic landscape ---------------------------------------------------------
def test_ranking_skips_the_k_least_important_layers(tmp_path: Path) -> None:
    strategy = make_strategy("ranking", importance=IMPORTANCE)
    search(tmp_path, strategy, CountingEvaluator(), budget=4)
    frame = study_trials_frame(load_study(tmp_path, "ranking"))
    free = [layer for layer in range(1, NUM_LAYERS - 1)]
    order = sorted(free, key=lambda layer: IMPORTANCE.layer[layer])
    for mask in frame["mask"]:
        skipped = sorted(SkipMask.parse(mask, NUM_LAYERS).skipped_layers)
        assert skipped == sorted(order[: len(skipped)])
    assert set(frame["origin"]) == {"plan"} and len(frame) == 4


def test_knapsack_measures_dp_candidates_and_beats_uniform(tmp_path: Path) -> None:
    space = load_space("sublayer").resolve(NUM_LAYERS)
    evaluate = CountingEvaluator()
    knapsack = make_strategy("knapsack", importance=IMPORTANCE)
    result = search(tmp_path / "k", knapsack, evaluate, space=space, budget=8)
    uniform = search(tmp_path / "u", "uniform", CountingEvaluator(), space=space, budget=8)
    assert result.budget_used == 8 and len(evaluate.calls) == 8
    assert result.best.score > uniform.best.score
    # Trials are in the journal like any strategy's, and a resume continues to a larger budget.
    resumed = search(tmp_path / "k", knapsack, evaluate, space=space, budget=11, resume=True)
    assert resumed.budget_used == 11 and len(evaluate.calls) == 11 and len(set(evaluate.calls)) == 11


def test_knapsack_weights_prefer_the_cheap_units_to_skip(tmp_path: Path) -> None:
    """With equal importance, the DP's candidates skip the units that save the most time first."""
    flat = SublayerImportance("proxy", (0.1,) * NUM_LAYERS, (0.1,) * NUM_LAYERS, (0.2,) * NUM_LAYERS)
    costly_attn = SublayerWeights(0.0, [5.0] * NUM_LAYERS, [1.0] * NUM_LAYERS, 0.0)
    strategy = make_strategy("knapsack", importance=flat, weights=costly_attn, candidates=3)
    search(tmp_path, strategy, CountingEvaluator(), space=load_space("sublayer").resolve(NUM_LAYERS))
    first = SkipMask.parse(study_trials_frame(load_study(tmp_path, "knapsack"))["mask"][0], NUM_LAYERS)
    assert first.attn and not first.mlp


def test_knapsack_tpe_enqueues_candidates_then_samples(tmp_path: Path) -> None:
    strategy = make_strategy("knapsack+tpe", importance=IMPORTANCE)
    search(tmp_path, strategy, CountingEvaluator(), budget=12)
    origins = list(study_trials_frame(load_study(tmp_path, "knapsack+tpe"))["origin"])
    assert origins[:4] == ["plan"] * 4 and set(origins[4:]) <= {"sampler", "guard"}


def test_informed_strategies_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sparse or sublayer"):
        search(
            tmp_path / "c",
            make_strategy("ranking", importance=IMPORTANCE),
            CountingEvaluator(),
            space="contiguous",
        )
    with pytest.raises(ConfigError, match="needs sub-layer importance"):
        search(tmp_path / "n", "knapsack", CountingEvaluator())


# -- context-aware scoring -------------------------------------------------------------------------
def synthetic_latency(tmp_path: Path | None = None) -> LatencyProfile:
    """Two layers; attention 1 ms + 1 ms per 1k tokens of context, MLP 2 ms, embed and head 0.5 ms,
    all independent of positions; no overhead."""
    contexts, positions = (128, 1024, 2048), (1, 2, 3)
    flat = lambda t: [[t] * len(positions) for _ in contexts]  # noqa: E731
    attn = [[[1e-3 + 1e-6 * c] * len(positions) for c in contexts]] * 2
    tables = {"embed": flat(5e-4), "head": flat(5e-4), "attn": attn, "mlp": [flat(2e-3)] * 2}
    profile = LatencyProfile.from_dict(
        {
            "meta": {"num_layers": 2},
            "context_lengths": list(contexts),
            "positions": list(positions),
            **tables,
            "spread": {k: np.zeros_like(np.asarray(v)).tolist() for k, v in tables.items()},
            "round_overhead": {"1": 0.0, "2": 0.0},
        }
    )
    if tmp_path is not None:
        profile.save(tmp_path / "profile.json")
    return profile


def test_context_changes_the_score_exactly_as_the_profile_says() -> None:
    """Skipping attention of layer 1 at γ = 1, every draft token accepted: E = 2 tokens per round.

    Step t = embed + head + 2 attn + 2 mlp; draft = t - attn; verify (γ+1 = 2 positions, same
    times, nothing reused past layer 1's attention) = t. S = 2 t / (2 t - attn)."""
    mask = SkipMask(2, attn={1})
    profile = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0)
    latency = synthetic_latency()
    for context in (128, 2048, 1536):
        attn = 1e-3 + 1e-6 * context
        step = 1e-3 + 2 * attn + 4e-3
        expected = 2 * step / (2 * step - attn)
        score = make_scorer(cost="calibrated", latency=latency, gamma_max=1, context=context)(mask, profile)
        assert score.value == pytest.approx(expected, rel=1e-12)
    at_2048 = make_scorer(cost="calibrated", latency=latency, gamma_max=1, context=2048)(mask, profile)
    default = make_scorer(cost="calibrated", latency=latency, gamma_max=1)(mask, profile)
    assert at_2048.value > default.value  # attention weighs more at long context


def test_a_context_outside_the_profile_needs_extrapolation() -> None:
    latency = synthetic_latency()
    with pytest.raises(ConfigError, match=r"outside the profiled range 128\.\.2048"):
        make_scorer(cost="calibrated", latency=latency, context=4096)
    with pytest.raises(ConfigError, match="only the calibrated cost"):
        make_scorer(cost="closed-form", latency=latency, context=1024)
    far = latency.for_context(4096, extrapolate=True)
    assert far.attn_time(0, 4096) == pytest.approx(1e-3 + 1e-6 * 4096)
    assert latency.attn_time(0, 4096) == pytest.approx(1e-3 + 1e-6 * 2048)  # clamped as before


def test_measure_refuses_an_out_of_range_context_in_one_line(tmp_path: Path) -> None:
    synthetic_latency(tmp_path)
    command = [
        sys.executable, "-m", "skipsearch", "measure", "--skip", "3", "--context", "4096",
        "--latency-profile", str(tmp_path / "profile.json"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--extrapolate-context" in lines[0]


def test_the_run_checks_informed_strategies_before_the_reference_is_built() -> None:
    """`check_searches` runs before the model loads (known depth) or right after, before any file."""
    from dataclasses import replace

    from skipsearch.config import RunConfig
    from skipsearch.run.preflight import check_searches

    with pytest.raises(ConfigError, match="use --strategy exhaustive"):
        check_searches(RunConfig(strategy="knapsack", space="contiguous"), NUM_LAYERS, ["knapsack"])
    measured = RunConfig(strategy="ranking", importance="measured", budget=10)
    with pytest.raises(ConfigError, match=r"evaluates 10 single-unit masks .* raise --budget above 10"):
        check_searches(measured, NUM_LAYERS, ["ranking"])
    check_searches(measured, NUM_LAYERS, ["random"])  # only informed ones measure
    check_searches(replace(measured, budget=11), NUM_LAYERS, ["ranking"])
