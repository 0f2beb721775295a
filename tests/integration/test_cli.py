"""The commands end to end on the real embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipsearch import cli
from skipsearch.bench.latency_profiler import DEFAULT_POSITIONS
from skipsearch.cli import main
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profile_summary import summary
from skipsearch.masks import SkipMask
from skipsearch.tiers.manifest import TierManifest
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tree_shapes import MAX_NODES
from tests.unit.cli.conftest import assert_one_line_error, only_profile, run_cli
from tests.unit.engine.conftest import one_thread

pytestmark = pytest.mark.usefixtures("one_thread")


# Fixtures of another folder's conftest.py, imported: listed so that they count as used.
__all__ = ["one_thread", "only_profile"]


def test_infeasible_constraints_fail_before_anything_is_written(tmp_path):
    space = tmp_path / "infeasible.yaml"
    space.write_text("kind: sparse\nr_draft_min: 0.3\nr_draft_max: 0.35\nmax_skipped: 2\n")
    result = run_cli("--space", str(space), "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "r_draft")
    assert not (tmp_path / "r").exists()


def test_decode_command_on_smollm2(tmp_path, capsys):
    out = tmp_path / "decode.json"
    options = ["--skip", "24-29", "--n-prompts", "1", "--max-new-tokens", "8", "--max-prompt-tokens", "64"]
    assert main(["decode", *options, "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lossless"] and result["exit_layer"] == 24
    assert set(result["summaries"]) == {"autoregressive", "hf-generate", "ssd", "hf-early-exit"}
    assert [e["mode"] for e in result["estimators"]] == ["shared-kv", "self"]
    assert "PASS" in capsys.readouterr().out


# -- the real embedded model ---------------------------------------------------------------------


@pytest.mark.usefixtures("only_profile")  # the profile command alone, as in tests/unit/cli/test_profile.py
def test_cli_on_the_embedded_model(tmp_path: Path, capsys) -> None:
    """One short context, two processes of one sample: the real command, file and summary in ~20 s."""
    out = tmp_path / "smollm2.json"
    args = ["--model", "smollm2-135m", "--context-lengths", "64", "--repeats", "2", "--warmup", "0"]
    args += ["--processes", "2"]
    assert cli.main(["profile", *args, "--out", str(out)]) == 0
    profile = LatencyProfile.load(out)
    assert (profile.num_layers, profile.context_lengths) == (30, (64,))
    assert profile.positions == DEFAULT_POSITIONS and profile.positions[-1] == MAX_NODES + 1
    assert (profile.meta["model"], profile.meta["processes"]) == ("smollm2-135m", 2)
    digest = summary(profile)
    assert digest.draft_cost[0][-1] == pytest.approx(1.0)
    # docs/theory.md, "Calibrated cost": embedding and head make a one-layer draft cost far more than 1/L.
    assert digest.draft_cost[0][0] > 2 * digest.naive(1)


def test_decode_command_runs_tiers_on_smollm2(tmp_path, capsys):
    masks = (SkipMask.prefix(30, 28), SkipMask.prefix(30, 24))
    TierManifest("smollm2-135m", masks, TierPolicy(4, (0.7,)), (1, 3)).save(tmp_path / "tiers.json")
    out = tmp_path / "decode.json"
    options = ["--from", str(tmp_path / "tiers.json"), "--n-prompts", "1", "--new-tokens", "8"]
    assert main(["decode", *options, "--max-prompt-tokens", "64", "--repeats", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["lossless"]
