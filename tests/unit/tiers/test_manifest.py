"""Tier manifests round trip and list their graphs."""

from __future__ import annotations

import json

import pytest

from skipsearch.errors import ConfigError
from skipsearch.tiers.manifest import TierManifest, is_tier_manifest
from skipsearch.tiers.policy import TierPolicy
from tests.unit.tiers.conftest import CHEAP, RICH


def test_manifest_round_trips_and_lists_its_graphs(tmp_path):
    policy = TierPolicy(3, (0.75,))
    manifest = TierManifest("m", (RICH, CHEAP), policy, (1, 3), (1, 8), {"speedup": 1.3}, {"seed": 0})
    path = tmp_path / "tiers.json"
    manifest.save(path)
    assert is_tier_manifest(path) and TierManifest.load(path) == manifest
    data = json.loads(path.read_text())
    assert data["tiers"][1]["skipped_attn"] == [2, 3, 4, 5, 6, 7] and data["tiers"][1]["gamma"] == 3
    assert data["policy"]["start_tier"] == 0
    assert len(data["graphs"]["draft"]) == 2 * 2 and len(data["graphs"]["verify"]) == (2 + 4) * 2
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": str(RICH)}))
    assert not is_tier_manifest(best) and not is_tier_manifest(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="distinct"):
        TierManifest("m", (RICH, RICH), policy, (3, 3))
    with pytest.raises(ConfigError, match="one draft length"):
        TierManifest("m", (RICH, CHEAP), policy, (3,))
