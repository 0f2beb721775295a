"""Search-space files: built-ins by name or path, and errors that name the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern
from skipsearch.search.space_files import SPACES_DIR, available_spaces, load_space
from skipsearch.search.space_spec import SpaceSpec, TierSpec
from skipsearch.tree_shapes import TreeShape
from tests.unit.search.conftest import write_space


# -- built-in files ----------------------------------------------------------------------------
def test_builtin_spaces_load_by_name_and_resolve_at_any_depth() -> None:
    assert set(available_spaces()) >= {"contiguous", "sparse", "sublayer", "tiers"}
    for num_layers in (6, 12, 30, 80):
        for name in ("contiguous", "sparse", "sublayer"):
            spec = load_space(name)
            assert isinstance(spec, SpaceSpec) and spec.kind == name
            space = spec.resolve(num_layers)
            assert space.size() > 0 and space.kind == name
        tiers = load_space("tiers")
        assert isinstance(tiers, TierSpec)
        resolved = tiers.resolve(num_layers)
        assert resolved.num_tiers == 3 and resolved.policy.thresholds == (0.5, 0.8)
        assert resolved.base.kind == "sparse"


def test_load_by_path_equals_load_by_name() -> None:
    assert load_space(SPACES_DIR / "sparse.yaml") == load_space("sparse")


# -- validation errors: every message names the file and the key --------------------------------
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("kind: sparse\ncolour: red\n", "colour"),
        ("protected: [0]\n", "kind"),
        ("kind: dense\n", "kind"),
        ("kind: sparse\nr_draft_min: fast\n", "r_draft_min"),
        ("kind: sparse\nr_draft_max: 1.5\n", "r_draft_max"),
        ("kind: sparse\nr_draft_min: 0.8\nr_draft_max: 0.5\n", "r_draft_min"),
        ("kind: sparse\ngamma_min: 0\n", "gamma_min"),
        ("kind: sparse\ngamma_max: 2.5\n", "gamma_max"),
        ("kind: sparse\ngamma_min: 6\ngamma_max: 3\n", "gamma_min"),
        ("kind: sparse\nmin_skipped: 5\nmax_skipped: 2\n", "min_skipped"),
        ("kind: sparse\nmax_skipped: -3\n", "max_skipped"),
        ("kind: sparse\nmax_skipped: true\n", "max_skipped"),
        ("kind: sparse\nmin_skipped: 1.5\n", "min_skipped"),
        ("kind: sparse\nprotected: 0\n", "protected"),
        ("kind: sparse\nprotected: [first]\n", "protected"),
        ("kind: sparse\nprotected: [1.5]\n", "protected"),
        ("kind: sparse\nprotected: []\n", "protected"),
        ("kind: sparse\nname: [a]\n", "name"),
        ("kind: sparse\nkv: s4w1024\n", "kv"),
        ("kind: sparse\nkv: [full, w1024]\n", "kv"),
        ("kind: sparse\nkv: [s4w0]\n", "kv"),
        ("kind: sparse\nkv: [1024]\n", "kv"),
        ("kind: sparse\nkv: [s4w64, s4w64]\n", "kv"),
        ("kind: sparse\ntree: 2x1\n", "tree"),
        ("kind: sparse\ntree: [2x0]\n", "tree"),
        ("kind: sparse\ntree: [9x1]\n", "tree"),
        ("kind: tiers\nnum_tiers: 5\npolicy: {thresholds: [0.5]}\n", "num_tiers"),
        ("kind: tiers\nnum_tiers: 3\npolicy: {thresholds: [0.5]}\n", "policy.thresholds"),
        ("kind: tiers\nnum_tiers: 3\npolicy: {thresholds: [0.8, 0.5]}\n", "policy.thresholds"),
        ("kind: tiers\nnum_tiers: 2\npolicy: {thresholds: [1.2]}\n", "policy.thresholds"),
        ("kind: tiers\nnum_tiers: 2\npolicy: {thresholds: [0.5], window: 0}\n", "policy.window"),
        ("kind: tiers\nnum_tiers: 2\npolicy: {thresholds: [0.5], every: 3}\n", "policy.every"),
        ("kind: tiers\nbase: nowhere\npolicy: {thresholds: [0.5, 0.8]}\n", "base"),
        ("kind: tiers\nbase: tiers\npolicy: {thresholds: [0.5, 0.8]}\n", "base"),
        ("kind: tiers\nprotected: [0]\npolicy: {thresholds: [0.5, 0.8]}\n", "protected"),
    ],
)
def test_invalid_files_name_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write_space(tmp_path, text, "bad_space.yaml")
    with pytest.raises(ConfigError) as err:
        load_space(path)
    message = str(err.value)
    assert str(path) in message and f"key '{key}'" in message
    assert message.count(":") >= 2  # problem, then the fix


def test_a_space_lists_the_kv_patterns_every_mask_is_scored_with(tmp_path: Path) -> None:
    spec = load_space(write_space(tmp_path, "kind: sparse\nkv: [full, s4w512, S0W64]\n", "kv.yaml"))
    assert isinstance(spec, SpaceSpec)
    assert spec.kv == (None, KVPattern(4, 512), KVPattern(0, 64))
    assert load_space("sparse").kv == (None,)  # every key unless a space says otherwise


def test_a_space_lists_the_token_trees_every_draft_is_also_scored_as(tmp_path: Path) -> None:
    spec = load_space(write_space(tmp_path, "kind: sparse\ntree: [chain, 2x2x1, 3, 2x2x1]\n", "t.yaml"))
    assert isinstance(spec, SpaceSpec)
    assert spec.tree == (TreeShape((2, 2, 1)),)  # chains are always scored; trees once each
    assert load_space(write_space(tmp_path, "kind: sparse\n", "plain.yaml")).tree == ()  # chains only
    assert load_space("sparse").tree == ()  # trees are opt-in: the shipped spaces score chains


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space(write_space(tmp_path, "kind: [sparse\n", "broken.yaml"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_space(write_space(tmp_path, "- sparse\n", "list.yaml"))
    with pytest.raises(ConfigError, match=r"use one of .*sparse"):
        load_space("no_such_space")
    with pytest.raises(ConfigError, match="does not exist"):
        load_space(tmp_path / "missing.yaml")
