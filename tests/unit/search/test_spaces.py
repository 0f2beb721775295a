"""Search spaces: YAML loading and validation, depth fractions, feasibility, sampling, Optuna bridge."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import FixedTrial

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import SkipMask
from skipsearch.search.space_files import load_space
from skipsearch.search.space_spec import SpaceSpec
from skipsearch.search.spaces import ConcreteSpace, spread
from tests.unit.search.conftest import write_space


def resolve(tmp_path: Path, text: str, num_layers: int) -> ConcreteSpace:
    spec = load_space(write_space(tmp_path, text))
    assert isinstance(spec, SpaceSpec)
    return spec.resolve(num_layers)


def test_contiguous_space_is_every_exit_layer() -> None:
    space = load_space("contiguous").resolve(12)
    assert [m.exit_layer for m in space.enumerate()] == list(range(11, 0, -1))


# -- fractions of depth ------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers", [7, 12, 13, 32])
def test_fractions_of_depth_round_down(tmp_path: Path, num_layers: int) -> None:
    space = resolve(
        tmp_path,
        "kind: sparse\nprotected: [0, 0.5, 1.0, -2]\nmax_skipped: 0.5\nmin_skipped: 0.1\n",
        num_layers,
    )
    assert space.protected == {0, num_layers // 2, num_layers - 1, num_layers - 2}
    assert space.max_skipped == num_layers // 2
    assert space.min_skipped == math.floor(0.1 * num_layers)


def test_sublayer_counts_are_fractions_of_all_sublayers(tmp_path: Path) -> None:
    space = resolve(tmp_path, "kind: sublayer\nmax_skipped: 0.25\nr_draft_max: 0.95\n", 12)
    assert space.units_total == 24 and space.max_skipped == 6
    assert space.min_skipped == 2  # r_draft <= 0.95 needs ceil(0.05 * 24) skipped sub-layers


def test_r_draft_bounds_become_skip_counts(tmp_path: Path) -> None:
    space = resolve(tmp_path, "kind: sparse\nr_draft_min: 0.5\nr_draft_max: 0.75\n", 12)
    assert (space.min_skipped, space.max_skipped) == (3, 6)
    assert space.r_draft_range == (0.5, 0.75)


@pytest.mark.parametrize(
    ("text", "num_layers", "keys"),
    [
        # r_draft_max 0.2 needs >= 10 of 12 layers skipped; max_skipped allows 3.
        ("kind: sparse\nr_draft_max: 0.2\nmax_skipped: 3\n", 12, "r_draft_max/max_skipped"),
        # Protecting first and last leaves 10 free layers; min_skipped wants 11.
        ("kind: sparse\nmin_skipped: 11\n", 12, "min_skipped/protected"),
        # An early exit always skips the last layer, so protecting it leaves nothing.
        ("kind: contiguous\nprotected: [0, -1]\n", 12, "min_skipped/protected"),
        ("kind: sparse\nr_draft_min: 0.9\nr_draft_max: 0.95\n", 8, "r_draft_max/r_draft_min"),
        ("kind: sparse\nprotected: [12]\n", 12, "protected"),
        # Layers 0, 3 and 7 protected: the longest run between them is 4, 5, 6.
        ("kind: block\nprotected: [0, 3, -1]\nmin_skipped: 4\n", 8, "min_skipped/protected"),
    ],
)
def test_infeasible_at_resolve_names_the_binding_keys(
    tmp_path: Path, text: str, num_layers: int, keys: str
) -> None:
    spec = load_space(write_space(tmp_path, text))
    with pytest.raises(ConfigError) as err:
        spec.resolve(num_layers)
    assert str(tmp_path / "space.yaml") in str(err.value) and f"key '{keys}'" in str(err.value)


def test_tiers_need_enough_base_masks(tmp_path: Path) -> None:
    write_space(tmp_path, "kind: contiguous\nmin_skipped: 2\nmax_skipped: 3\n", "narrow.yaml")
    spec = load_space(
        write_space(
            tmp_path, "kind: tiers\nbase: narrow.yaml\nnum_tiers: 3\npolicy: {thresholds: [0.4, 0.7]}\n"
        )
    )
    with pytest.raises(ConfigError, match="key 'num_tiers'"):
        spec.resolve(12)


# -- feasibility -------------------------------------------------------------------------------
def test_feasibility_checks_protection_structure_and_counts() -> None:
    space = load_space("sparse").resolve(12)  # protected 0 and 11, 2..6 skipped
    assert space.is_feasible(SkipMask.from_layers(12, [3, 5]))
    assert not space.is_feasible(SkipMask.from_layers(12, [0, 5]))  # protected
    assert not space.is_feasible(SkipMask.from_layers(12, [5]))  # too few
    assert not space.is_feasible(SkipMask(12, {3, 5}, {3}))  # not layer-level
    assert space.violation(SkipMask.from_layers(12, range(1, 11))) == pytest.approx(4 / 12)
    assert space.violation(SkipMask.from_layers(12, [0, 5])) == 1.0
    sublayer = load_space("sublayer").resolve(12)
    assert sublayer.is_feasible(SkipMask(12, {3, 5}, {3}))
    with pytest.raises(InvalidMaskError, match="resolve the space"):
        space.is_feasible(SkipMask.from_layers(16, [3, 5]))


def test_block_feasibility() -> None:
    space = load_space("block").resolve(8)  # protected 0 and 7, 1..4 skipped
    assert space.is_feasible(SkipMask.from_layers(8, [2, 3, 4]))
    assert not space.is_feasible(SkipMask.from_layers(8, [2, 4]))  # two runs
    assert not space.is_feasible(SkipMask.from_layers(8, [5, 6, 7]))  # protected
    assert not space.is_feasible(SkipMask(8, {2, 3}, {3}))  # not layer-level
    assert space.violation(SkipMask.from_layers(8, range(1, 7))) == pytest.approx(2 / 8)


def test_block_space_is_every_run_clear_of_the_protected_layers() -> None:
    masks = load_space("block").resolve(8).enumerate()
    runs = [sorted(m.skipped_layers) for m in masks]
    expected = [list(range(a, a + k)) for k in range(1, 5) for a in range(1, 8 - k)]
    assert runs == expected  # 6 + 5 + 4 + 3, fewest skips first
    assert [sorted(m.skipped_layers) for m in load_space("block").resolve(8).uniform_masks()] == [
        [4],
        [3, 4],
        [3, 4, 5],
        [2, 3, 4, 5],
    ]


def test_contiguous_feasibility() -> None:
    space = load_space("contiguous").resolve(12)
    assert space.is_feasible(SkipMask.prefix(12, 6))
    assert not space.is_feasible(SkipMask.from_layers(12, [3, 5]))
    assert not space.is_feasible(SkipMask.prefix(12, 12))  # skips nothing: below min_skipped


# -- sampling and enumeration ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["kind: sparse\nmax_skipped: 3\n", "kind: sublayer\nmax_skipped: 2\n", "kind: block\nmax_skipped: 3\n"],
)
def test_random_masks_are_feasible_and_uniform(tmp_path: Path, text: str) -> None:
    space = resolve(tmp_path, text, 7)
    masks = space.enumerate()
    assert len(masks) == space.size() == len({str(m) for m in masks})
    rng = np.random.default_rng(0)
    draws = 40 * len(masks)
    counts = Counter(str(space.random_mask(rng)) for _ in range(draws))
    assert set(counts) == {str(m) for m in masks}  # every feasible mask, nothing else
    # Uniform: each count ~ Binomial(draws, 1/size), mean 40, sd ~6.3.
    assert min(counts.values()) > 15 and max(counts.values()) < 70


def test_random_masks_in_a_large_space_respect_constraints() -> None:
    space = load_space("sublayer").resolve(80)
    rng = np.random.default_rng(1)
    low, high = space.r_draft_range
    for _ in range(200):
        mask = space.random_mask(rng)
        assert space.is_feasible(mask) and low - 1e-12 <= mask.r_draft() <= high + 1e-12
        assert not mask.attn & {0, 79} and not mask.mlp & {0, 79}


def test_random_unseen_skips_seen_masks_until_none_is_left() -> None:
    space = load_space("contiguous").resolve(6)
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    while (mask := space.random_unseen(rng, seen)) is not None:
        assert str(mask) not in seen
        seen.add(str(mask))
    assert len(seen) == space.size() == 5


def test_enumerate_refuses_a_large_space() -> None:
    with pytest.raises(ConfigError, match="more than the 100 that can be enumerated"):
        load_space("sparse").resolve(12).enumerate(limit=100)


def test_uniform_masks_one_evenly_spaced_mask_per_count() -> None:
    space = load_space("sparse").resolve(20)
    masks = space.uniform_masks()
    assert [len(m.skipped_layers) for m in masks] == list(space.skip_counts)
    for mask in masks:
        assert space.is_feasible(mask)
        gaps = np.diff(sorted(mask.skipped_layers))
        assert len(gaps) == 0 or gaps.max() - gaps.min() <= 1
    few = space.uniform_masks(3)
    assert [len(m.skipped_layers) for m in few] == [space.min_skipped, 6, space.max_skipped]


def test_spread() -> None:
    assert spread(range(5), None) == [0, 1, 2, 3, 4]
    assert spread(range(5), 9) == [0, 1, 2, 3, 4]
    assert spread(range(10), 4) == [0, 3, 6, 9]
    assert spread(range(10), 1) == [5]
    assert spread(range(10), 0) == []


# -- Optuna bridge -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["contiguous", "block", "sparse", "sublayer"])
def test_params_for_round_trips_through_suggest(name: str) -> None:
    space = load_space(name).resolve(6)
    for mask in space.enumerate():
        params = space.params_for(mask)
        assert space.suggest(FixedTrial(params)) == mask


def test_param_names() -> None:
    mask = SkipMask(6, {2}, {2, 3})
    assert load_space("contiguous").resolve(6).params_for(SkipMask.prefix(6, 4)) == {"exit_layer": 4}
    assert load_space("sparse").resolve(6).params_for(SkipMask.from_layers(6, [2])) == {
        "skip_1": 0,
        "skip_2": 1,
        "skip_3": 0,
        "skip_4": 0,
    }
    block = load_space("block").resolve(6).params_for(SkipMask.from_layers(6, [2, 3]))
    assert block == {"block_start": 2, "block_length": 2}
    params = load_space("sublayer").resolve(6).params_for(mask)
    assert {k for k, v in params.items() if v} == {"attn_2", "mlp_2", "mlp_3"}


def test_params_for_rejects_masks_of_another_structure() -> None:
    with pytest.raises(InvalidMaskError, match="skips whole layers"):
        load_space("sparse").resolve(6).params_for(SkipMask(6, {2}, set()))
    with pytest.raises(InvalidMaskError, match="early exit"):
        load_space("contiguous").resolve(6).params_for(SkipMask.from_layers(6, [2]))
    with pytest.raises(InvalidMaskError, match="one run of whole layers"):
        load_space("block").resolve(6).params_for(SkipMask.from_layers(6, [1, 3]))
