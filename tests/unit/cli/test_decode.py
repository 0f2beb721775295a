"""`skipsearch decode`: settings checked before decoding, a mask read from a run, a tier manifest run end
to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from skipsearch.cli import main
from skipsearch.errors import ConfigError
from skipsearch.tiers.manifest import TierManifest
from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    one_line_error,
)
from tests.unit.engine.conftest import one_thread
from tests.unit.tiers.conftest import GAMMAS, MASKS, POLICY, PROMPT, runner

pytestmark = pytest.mark.usefixtures("one_thread", "cache_in_tmp")


# Fixtures of another folder's conftest.py, imported: listed so that they count as used.
__all__ = ["one_thread", "runner"]


def test_a_bad_gamma_in_best_json_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": "a:1|m:1", "gamma_best": -4}))
    err = one_line_error(capsys, "decode", "--from", str(best))
    assert str(best) in err and "gamma_best" in err


# -- CLI ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        ["--skip", "4", "--gamma", "0"],
        ["--skip", "4", "--temperature", "-1"],
        ["--skip", "4", "--top-p", "0"],
        ["--skip", "4", "--top-p", "1.5"],
        ["--skip", "4", "--repeats", "0"],
        ["--skip", "4", "--dynamic-gamma", "--gamma", "1"],
        ["--skip", "4", "--kv-window", "0"],
        ["--skip", "4", "--kv-sink", "-1", "--kv-window", "8"],
        ["--skip", "4", "--kv-sink", "4"],
        ["--skip", "4", "--kv-pillars", "4"],
        ["--skip", "4", "--kv-pillars", "-1", "--kv-window", "8"],
        ["--mask", "a:4|kv:s4w64k", "--kv-window", "32"],
        ["--mask", "a:4|kv:s4w64", "--kv-window", "32"],
        ["--mask", "a:4|kv:w64"],
        ["--skip", "4", "--draft-stop", "1"],
        ["--skip", "4", "--draft-stop", "-0.1"],
        ["--skip", "4", "--graphs"],
    ],
    ids=" ".join,
)
def test_decode_rejects_invalid_settings(options, capsys):
    assert main(["decode", *options]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_decode_rejects_a_mask_that_skips_everything(monkeypatch, capsys):
    monkeypatch.setattr("skipsearch.acceptance.worker.prepare", lambda config: SimpleNamespace(num_layers=6))
    assert main(["decode", "--skip", "0-5"]) == 2
    assert "skips every layer" in capsys.readouterr().err


def test_decode_reads_mask_and_gamma_from_a_run(tmp_path, capsys):
    from skipsearch.cli.decode import read_from

    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": "a:1,4|m:1,4", "gamma_best": 5, "score": 1.3}))
    assert read_from(best) == ("a:1,4|m:1,4", 5)
    searched = tmp_path / "searched.json"
    searched.write_text(json.dumps({"mask": "a:1|m:1", "draft_vocab": 64, "kv": "s4w16", "gamma_best": 3}))
    assert read_from(searched) == ("a:1|m:1|v:64|kv:s4w16", 3)
    no_mask = tmp_path / "no_mask.json"
    no_mask.write_text(json.dumps({"gamma": 2}))
    with pytest.raises(ConfigError, match="mask"):
        read_from(no_mask)
    assert main(["decode", "--from", str(best), "--skip", "1"]) == 2
    assert "once" in capsys.readouterr().err


def test_decode_reads_a_runs_token_tree_and_refuses_what_a_tree_does_not_run(tmp_path, capsys):
    from skipsearch.cli.decode import read_tree

    tree = tmp_path / "best.json"
    tree.write_text(json.dumps({"mask": "a:1|m:1", "gamma_best": 2, "tree": "2x2x1"}))
    assert read_tree(tree) == "2x2x1"
    chain = tmp_path / "chain.json"
    chain.write_text(json.dumps({"mask": "a:1|m:1", "gamma_best": 2, "tree": "chain"}))
    assert read_tree(chain) is None
    assert main(["decode", "--from", str(tree), "--draft-stop", "0.5"]) == 2
    assert "whole shape" in capsys.readouterr().err
    assert main(["decode", "--skip", "1", "--tree", "2x0"]) == 2
    assert "bad tree shape" in capsys.readouterr().err


def test_decode_runs_a_graphed_tree(tmp_path, monkeypatch, capsys):
    """`--graphs --tree 2x1` decodes (no refusal): with the device check stood in, the graphed steps run
    eagerly on this CPU, the report says so, and the graphed tree and chain run beside the eager ones."""
    from skipsearch.models.loading import LoadedModel
    from tests.conftest import tiny_model, with_plan_attention

    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    monkeypatch.setattr("skipsearch.models.device.check_device", lambda device: None)
    out = tmp_path / "decode.json"
    options = "--random-weights --skip 1 --gamma 3 --n-prompts 1 --max-prompt-tokens 8 --new-tokens 8 "
    options += "--repeats 1"
    graphed = ["--tree", "2x1", "--graphs", "--device", "cuda"]
    assert main(["decode", "--model", "mistral-7b", *options.split(), *graphed, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tree"] == "2x1" and result["lossless"] and result["graphs"]["mode"] == "static-eager"
    assert {"ssd-graphs", "ssd-chain-graphs"} <= set(result["summaries"])
    assert "graphed (static-eager)" in capsys.readouterr().out


def test_decode_runs_a_dynamic_tree_and_says_what_it_cannot(tmp_path, monkeypatch, capsys):
    """`--tree-nodes 6` decodes dynamic trees `n6d2k2` beside the chain, lossless, with the
    estimator's prediction; graphs and a second tree option are refused in one line."""
    from skipsearch.models.loading import LoadedModel
    from tests.conftest import tiny_model, with_plan_attention

    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    out = tmp_path / "decode.json"
    options = "--random-weights --skip 1 --gamma 3 --n-prompts 1 --max-prompt-tokens 8 --new-tokens 8 "
    options += "--repeats 1 --tree-nodes 6"
    assert main(["decode", "--model", "mistral-7b", *options.split(), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tree"] == "n6d2k2" and result["lossless"] and "ssd-chain" in result["summaries"]
    assert main(["decode", "--skip", "1", "--tree-nodes", "6", "--tree", "2x1"]) == 2
    assert "give the tree once" in capsys.readouterr().err
    monkeypatch.setattr("skipsearch.models.device.check_device", lambda device: None)
    assert main(["decode", "--skip", "1", "--tree", "n8", "--graphs", "--device", "cuda"]) == 2
    assert "not captured as CUDA graphs" in capsys.readouterr().err
    assert main(["decode", "--skip", "1", "--tree-nodes", "40"]) == 2
    assert "--tree-nodes" in capsys.readouterr().err


# -- decode --from tiers.json ------------------------------------------------------------------------
def test_decode_command_runs_a_tier_manifest(runner, tmp_path, monkeypatch, capsys):
    from skipsearch.models.loading import LoadedModel

    predicted = {"speedup": 1.1, "cost": "closed-form"}
    TierManifest("tiny", MASKS, POLICY, GAMMAS, predicted=predicted).save(tmp_path / "tiers.json")
    loaded = LoadedModel(runner.model, None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    monkeypatch.setattr(
        "skipsearch.acceptance.prompts.encode_prompts",
        lambda spec, tokenizer, context=None: [SimpleNamespace(ids=PROMPT)],
    )
    out = tmp_path / "decode.json"
    options = ["--from", str(tmp_path / "tiers.json"), "--new-tokens", "16", "--repeats", "1"]
    assert main(["decode", *options, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lossless"] and result["mode"] == "eager" and result["gammas"] == list(GAMMAS)
    assert set(result["summaries"]) == {"autoregressive", "ssd-tiers", "ssd-best-single"}
    assert sum(result["tier_share"]) == pytest.approx(1.0)
    assert "PASS" in capsys.readouterr().out
    assert main(["decode", *options, "--dynamic-gamma"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["decode", *options, "--draft-stop", "0.5"]) == 2
    assert "--draft-stop" in capsys.readouterr().err


def test_graphed_decoding_refuses_what_its_graphs_do_not_run() -> None:
    from skipsearch.bench.decode import check_graphable
    from skipsearch.engine import GammaPolicy
    from skipsearch.masks import KVPattern

    check_graphable(None, GammaPolicy.fixed(3))
    check_graphable(KVPattern.parse("s4w64"), GammaPolicy.fixed(3))
    with pytest.raises(ConfigError, match="drop --graphs, or --kv-pillars"):
        check_graphable(KVPattern.parse("s4w64k8"), GammaPolicy.fixed(3))
    with pytest.raises(ConfigError, match="drop --graphs, or --draft-stop"):
        check_graphable(None, GammaPolicy.fixed(3, 0.5))
