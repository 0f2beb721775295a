"""Ranking, knapsack and knapsack+TPE on the synthetic landscape of test_search, the knapsack DP
against brute force, and context-aware scoring on a synthetic latency profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask, SublayerWeights
from skipsearch.search import (
    LearnedStrategy,
    load_study,
    make_strategy,
    study_trials_frame,
)
from skipsearch.search.space_files import load_space
from tests.unit.search.conftest import (
    ATTN_DAMAGE,
    MLP_DAMAGE,
    NUM_LAYERS,
    CountingEvaluator,
    search,
)

# The synthetic landscape's own damages as the importance: what a perfect proxy would say.
IMPORTANCE = SublayerImportance(
    "proxy", tuple(ATTN_DAMAGE), tuple(MLP_DAMAGE), tuple(ATTN_DAMAGE + MLP_DAMAGE)
)


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


@pytest.mark.parametrize(("algorithm", "package"), [("gp", "scipy"), ("cmaes", "cmaes")])
def test_samplers_needing_missing_packages_say_what_to_install(algorithm: str, package: str) -> None:
    try:
        __import__(package)
    except ImportError:
        with pytest.raises(ConfigError, match=f"pip install {package}"):
            LearnedStrategy(algorithm=algorithm)
    else:
        LearnedStrategy(algorithm=algorithm)


def test_strategy_and_sampler_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'greedy'"):
        make_strategy("greedy")
    with pytest.raises(ConfigError, match="unknown sampler 'anneal'"):
        make_strategy("learned", algorithm="anneal")
    with pytest.raises(ConfigError, match="bad option"):
        make_strategy("random", depth=3)
