"""Search spaces, strategies and scores with a precision dimension (docs/theory.md, "Drafts at lower
precision"): a uniform precision over a skip set (`precision.yaml`) and each sub-layer's own choice
(`per-layer-precision.yaml`, kind `mixed`)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import FixedTrial

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import BYTES_SHARE, SkipMask, SublayerWeights
from skipsearch.search import load_study, make_strategy, study_trials_frame
from skipsearch.search.knapsack import Option, choice_frontier
from skipsearch.search.objective import make_scorer
from skipsearch.search.space_files import load_space
from skipsearch.search.space_precision import precision_label, uniform_bits, with_bits
from skipsearch.search.space_spec import SpaceSpec
from skipsearch.search.subset_spaces import MixedSpace
from tests.unit.conftest import synthetic_latency
from tests.unit.search.conftest import (
    ATTN_DAMAGE,
    MLP_DAMAGE,
    NUM_LAYERS,
    CountingEvaluator,
    search,
    write_space,
)

IMPORTANCE = SublayerImportance(
    "proxy", tuple(ATTN_DAMAGE), tuple(MLP_DAMAGE), tuple(ATTN_DAMAGE + MLP_DAMAGE)
)


def resolve(name: str | Path, num_layers: int = NUM_LAYERS):
    spec = load_space(name)
    assert isinstance(spec, SpaceSpec)
    return spec.resolve(num_layers)


# -- spaces --------------------------------------------------------------------------------------
def test_a_uniform_precision_space_is_every_skip_set_at_each_precision() -> None:
    space, skips = resolve("precision", 6), resolve("sparse", 6)
    assert space.precisions == (16, 8, 4) and space.min_skipped == 0
    masks = space.enumerate()
    assert len(masks) == len(set(masks)) == space.size()
    assert Counter(precision_label(m) for m in masks) == {
        name: space.size() // 3 for name in ("full", "int8", "int4")
    }
    assert all(space.is_feasible(m) for m in masks)
    # the draft that skips nothing at int8 is in the space, and every layer, protected too, is int8.
    assert str(SkipMask.parse("w8:0-5", 6)) in {str(m) for m in masks}
    assert space.to_dict()["precision"] == ["full", "int8", "int4"]
    assert "precision" not in skips.to_dict()  # a space of full precision says what it said before


def test_masks_of_another_precision_or_a_mixed_one_are_infeasible() -> None:
    space = resolve(write_space_text("kind: sparse\nprecision: [full, int8]\nmin_skipped: 0\n"), 6)
    assert space.is_feasible(SkipMask.parse("a:2|m:2|w8:0,1,3-5", 6))
    assert space.violation(SkipMask.parse("w4:0-5", 6)) == 1.0
    assert space.violation(SkipMask.parse("w8:0-2", 6)) == 1.0  # layers 3-5 at full: mixed
    with pytest.raises(InvalidMaskError, match="one precision of full, int8"):
        space.params_for(SkipMask.parse("w4:0-5", 6))


_TMP: list[Path] = []


def write_space_text(text: str) -> Path:
    return write_space(_TMP[0], text)


@pytest.fixture(autouse=True)
def _tmp(tmp_path: Path) -> None:
    _TMP[:] = [tmp_path]


@pytest.mark.parametrize("name", ["precision", "per-layer-precision"])
def test_params_round_trip_through_suggest(name: str) -> None:
    space = resolve(name, 3)
    masks = space.enumerate()
    assert len(masks) == len(set(masks)) == space.size()
    for mask in masks:
        assert space.suggest(FixedTrial(space.params_for(mask))) == mask


def test_a_mixed_space_chooses_each_sublayer() -> None:
    space = resolve("per-layer-precision", 3)
    assert isinstance(space, MixedSpace) and space.kind == "mixed"
    # layer 1's two sub-layers are free: skip 0 or 1 of them, the other 6 - k sub-layers 3 ways each.
    assert space.size() == 3**6 + 2 * 3**5
    params = space.params_for(SkipMask.parse("a:1|m:|w8a:0|w4m:2", 3))
    assert params == {
        "attn_0": "int8",
        "mlp_0": "full",
        "attn_1": "skip",
        "mlp_1": "full",
        "attn_2": "full",
        "mlp_2": "int4",
    }
    assert space.violation(SkipMask.parse("a:0|m:", 3)) == 1.0  # layer 0 is protected
    narrow = resolve(write_space_text("kind: mixed\nprecision: [full, int8]\nmin_skipped: 0\n"), 3)
    assert narrow.violation(SkipMask.parse("w4a:1", 3)) == 1.0


@pytest.mark.parametrize("name", ["precision", "per-layer-precision"])
def test_random_masks_are_uniform_over_the_space(name: str) -> None:
    space, rng = resolve(name, 3), np.random.default_rng(0)
    draws = Counter(str(space.random_mask(rng)) for _ in range(20 * space.size()))
    assert set(draws) == {str(m) for m in space.enumerate()}
    expected = 20
    assert max(draws.values()) < 2.5 * expected and min(draws.values()) > expected / 4


def test_uniform_masks_cover_every_precision() -> None:
    space = resolve("precision")
    masks = space.uniform_masks()
    assert len(masks) == 3 * len(space.skip_counts)
    assert {precision_label(m) for m in space.uniform_masks(6)} == {"full", "int8", "int4"}
    assert [uniform_bits(m) for m in space.uniform_masks(3)] == [16, 8, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: sparse\nprecision: [int3]\n",
            "key 'precision': 'int3' is not a precision: use some of full, int8, int4",
        ),
        ("kind: sparse\nprecision: []\n", "key 'precision': expected a non-empty list"),
        ("kind: sparse\nprecision: int8\n", "key 'precision': expected a non-empty list"),
        ("kind: mixed\nprecision: [int8, int8]\n", "key 'precision': .* names one twice"),
    ],
)
def test_bad_precisions_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_space(write_space_text(text))
    assert "\n" not in str(error.value)


# -- strategies ----------------------------------------------------------------------------------
def test_learned_search_starts_from_every_layer_at_each_lower_precision(tmp_path: Path) -> None:
    result = search(tmp_path, "learned", CountingEvaluator(), space=resolve("precision"), budget=6)
    frame = study_trials_frame(load_study(tmp_path, "learned"))
    assert list(frame["mask"][:2]) == [str(SkipMask.parse(f"w{b}:0-11", NUM_LAYERS)) for b in (8, 4)]
    # the synthetic landscape's int8 draft (half the bytes, 1/256 of each damage) is hard to beat
    assert result.best.score >= frame["score"][0]


def test_ranking_ranks_skips_at_each_precision(tmp_path: Path) -> None:
    space = resolve("precision")
    masks = list(make_strategy("ranking", importance=IMPORTANCE).plan(_context(space, 100)))
    assert len(masks) == 3 * len(space.skip_counts) - 1  # not the full model (full, nothing skipped)
    order = sorted(range(1, NUM_LAYERS - 1), key=lambda layer: IMPORTANCE.layer[layer])
    for mask in masks:
        assert sorted(mask.skipped_layers) == sorted(order[: len(mask.skipped_layers)])
        assert uniform_bits(mask) in (16, 8, 4) and space.is_feasible(mask)


def test_knapsack_merges_the_precisions_frontiers(tmp_path: Path) -> None:
    space = resolve("precision")
    strategy = make_strategy("knapsack", importance=IMPORTANCE)
    frontier = strategy.plan(_context(space, 1000))
    masks = list(frontier)
    assert all(space.is_feasible(m) for m in masks)
    # int8 loses 1/256 of a skip's importance for half the bytes: the cheapest choices are int8 ones
    assert precision_label(masks[0]) == "int8" and not masks[0].skipped_layers
    assert {precision_label(m) for m in masks} >= {"int8", "int4"}


def test_knapsack_prices_precisions_by_the_profile(tmp_path: Path) -> None:
    """int8 measured as dear as full precision saves nothing: the frontier never takes it."""
    flat = [1.0] * NUM_LAYERS
    weights = SublayerWeights(
        0.0, flat, flat, 0.0, low_bits={8: (flat, flat), 4: ([0.3] * NUM_LAYERS, [0.3] * NUM_LAYERS)}
    )
    strategy = make_strategy("knapsack", importance=IMPORTANCE, weights=weights)
    masks = list(strategy.plan(_context(resolve("precision"), 1000)))
    assert "int8" not in {precision_label(m) for m in masks}
    mixed = list(strategy.plan(_context(resolve("per-layer-precision"), 1000)))
    assert mixed and not any(m.attn_int8 or m.mlp_int8 for m in mixed)


def test_knapsack_in_a_mixed_space_chooses_per_sublayer(tmp_path: Path) -> None:
    space = resolve("per-layer-precision")
    strategy = make_strategy("knapsack", importance=IMPORTANCE)
    choices = strategy.mixed_choices(space)
    assert all(space.is_feasible(c.mask) for c in choices)
    assert [c.saved for c in choices] == sorted(c.saved for c in choices)
    assert all(a.lost < b.lost for a, b in itertools.pairwise(choices))
    # the full model saves nothing; the least damaging way to save a little is one sub-layer at int8
    assert choices[0].mask.is_empty
    assert choices[1].mask.quantized and not (choices[1].mask.attn or choices[1].mask.mlp)
    planned = list(strategy.plan(_context(space, 5)))
    assert len(planned) == 5 and not any(m.is_empty for m in planned)
    result = search(tmp_path, strategy, CountingEvaluator(), space=space, budget=5)
    assert result.budget_used == 5


def test_choice_frontier_is_the_brute_force_pareto_front() -> None:
    rng = np.random.default_rng(5)
    groups = [
        [
            Option(float(rng.random()), float(rng.integers(1, 5)), skips=bool(i % 2))
            for i in range(int(rng.integers(1, 3)))
        ]
        for _ in range(5)
    ]
    counts = range(1, 3)

    def point(choice: tuple[int | None, ...]) -> tuple[float, float]:
        picked = [groups[g][i] for g, i in enumerate(choice) if i is not None]
        return sum(o.weight for o in picked), sum(o.value for o in picked)

    every = [
        c for c in itertools.product(*[[None, *range(len(g))] for g in groups]) if _skips(groups, c) in counts
    ]
    front = {
        point(c)
        for c in every
        if not any(point(o)[0] >= point(c)[0] and point(o)[1] < point(c)[1] - 1e-12 for o in every)
    }
    got = choice_frontier(groups, counts)
    assert all(_skips(groups, c) in counts for c in got)
    assert {tuple(round(x, 9) for x in point(c)) for c in got} == {
        tuple(round(x, 9) for x in p) for p in front
    }


def _skips(groups, choice) -> int:
    return sum(groups[g][i].skips for g, i in enumerate(choice) if i is not None)


def _context(space, budget: int):
    from skipsearch.search.strategies import PlanContext

    return PlanContext(space, 0, budget, set(), lambda mask: None)


# -- scores --------------------------------------------------------------------------------------
def test_a_quantized_draft_is_scored_by_what_it_reads() -> None:
    mask = SkipMask.parse("w8:0-1", 2)
    profile = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0)
    score = make_scorer(cost="calibrated", latency=synthetic_latency(), gamma_max=2)(mask, profile)
    assert score.details["precision"] == "int8"
    assert score.details["r_reuse"] == 0.0
    assert score.details["speedup_closed_form"] == pytest.approx(max(2 / 1.5, 3 / 2))
    skip = SkipMask(2, attn={1})
    plain = make_scorer(cost="calibrated", latency=synthetic_latency(), gamma_max=2)(skip, profile)
    assert "precision" not in plain.details


def test_with_bits_keeps_skips_and_sets_every_kept_sublayer() -> None:
    mask = with_bits(SkipMask(4, attn={1}, mlp={1, 2}), 4)
    assert str(mask) == "a:1|m:1,2|w4:0,3|w4a:2"
    assert uniform_bits(mask) == 4 and math.isclose(mask.r_draft(), 5 * BYTES_SHARE[4] / 8)
