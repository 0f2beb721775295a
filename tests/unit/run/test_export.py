"""`skipsearch export`: every format round-trips, HF's config decodes losslessly, errors are one line.

Runs are real run directories (journal, cache, run.yaml, best.json) searched over a synthetic
acceptance landscape on 8 layers, so no model is needed except for the HF generate checks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from skipsearch.cli.decode import read_from
from skipsearch.engine import autoregressive_decode
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.run.export import export
from skipsearch.run.export_formats import FORMATS, write_hf
from skipsearch.run.export_source import load_source
from skipsearch.search.space_files import parse_space
from skipsearch.search.space_spec import TierSpace
from skipsearch.search.tier_sets import search_space_tiers
from skipsearch.tiers.manifest import TierManifest
from skipsearch.tiers.policy import TierPolicy
from tests.conftest import tiny_model
from tests.unit.run.conftest import (
    LAYERS,
    SPACES,
    assisted_greedy,
    hf_source,
)


def read_back(out: Path, name: str) -> tuple[SkipMask, int | None]:
    fmt = FORMATS[name]
    return fmt.read(out / fmt.file, LAYERS)


def test_contiguous_run_exports_all_four_formats_that_read_back(runs, tmp_path):
    source = load_source(runs["contiguous"])
    best = source.best
    assert best.mask.exit_layer is not None and source.contiguous == best
    exported = export(source, ["all"], tmp_path)
    assert [e.format for e in exported] == list(FORMATS)
    for name in FORMATS:
        mask, gamma = read_back(tmp_path, name)
        assert mask == best.mask and gamma in (None, best.gamma)
    entry = {"attention": sorted(best.mask.attn), "mlp": sorted(best.mask.mlp)}
    assert json.loads((tmp_path / "skip_layers.json").read_text()) == {
        "smollm2-135m": entry,
        "smollm2-135m_synthetic": entry,
    }
    layerskip = json.loads((tmp_path / "layerskip.json").read_text())
    assert layerskip["argv"][-4:] == [
        "--exit_layer",
        str(best.mask.exit_layer),
        "--num_speculations",
        str(best.gamma),
    ]
    config = GenerationConfig.from_pretrained(tmp_path)
    assert (config.assistant_early_exit, config.num_assistant_tokens) == (best.mask.exit_layer, best.gamma)
    assert config.assistant_confidence_threshold == 0.0
    readme = (tmp_path / "README.md").read_text()
    assert "not the KV cache" in readme and "natively" in readme


def test_skipsearch_json_is_what_decode_reads(runs, tmp_path):
    source = load_source(runs["sparse-with-exits"] / "best.json")
    export(source, ["skipsearch"], tmp_path)
    data = json.loads((tmp_path / "skipsearch.json").read_text())
    assert read_from(tmp_path / "skipsearch.json") == (str(source.best.mask), source.best.gamma)
    assert data["num_layers"] == LAYERS and data["skipped_attn"] == sorted(source.best.mask.attn)
    assert (
        data["provenance"]["prompt_set"] == "synthetic-0123" and data["provenance"]["study"] == "exhaustive"
    )
    assert data["predicted_speedup"]["closed_form"] == pytest.approx(source.best.speedup)
    assert data["notes"] and data["tiers"] is None


def test_sparse_best_falls_back_to_the_best_early_exit_for_hf_and_layerskip(runs, tmp_path):
    source = load_source(runs["sparse-with-exits"])
    assert source.best.mask == SkipMask.from_layers(LAYERS, [1, 2])
    fallback = source.contiguous
    assert fallback is not None and fallback.mask.exit_layer == 7
    assert fallback.speedup < source.best.speedup
    exported = {e.format: e for e in export(source, ["all"], tmp_path)}
    assert read_back(tmp_path, "hf") == (fallback.mask, fallback.gamma)
    assert read_back(tmp_path, "layerskip") == (fallback.mask, fallback.gamma)
    assert read_back(tmp_path, "skip-layers")[0] == source.best.mask
    assert "is sparse" in exported["hf"].notes[0] and "E = 7" in exported["layerskip"].notes[0]


def test_sparse_without_early_exits(runs, tmp_path):
    source = load_source(runs["sparse"])
    assert source.contiguous is None
    with pytest.raises(ConfigError, match=r"only an early exit.*--space contiguous"):
        export(source, ["hf"], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    written = export(source, ["all"], tmp_path / "all")
    assert [e.format for e in written] == ["skipsearch", "skip-layers"]
    assert "hf: not written" in (tmp_path / "all" / "README.md").read_text()


def test_a_tiers_search_is_exported_as_the_capture_manifest(runs, tmp_path):
    """The tier search over a run's evaluated masks writes tiers.json beside it; export carries it."""
    run = tmp_path / "run"
    shutil.copytree(runs["sparse-with-exits"], run)
    base = parse_space(SPACES["sparse-with-exits"], "base", "base").resolve(LAYERS)
    search = search_space_tiers(run, TierSpace("tiers", base, 2, TierPolicy(4, (0.7,))), trials=30)
    assert (run / "tier_sets.csv").is_file() and len(search.manifest.masks) == 2
    exported = export(load_source(run), ["skipsearch"], tmp_path / "out")
    assert [e.format for e in exported] == ["skipsearch", "tiers"]
    assert TierManifest.load(tmp_path / "out" / "tiers.json") == search.manifest
    tiers = json.loads((tmp_path / "out" / "skipsearch.json").read_text())["tiers"]
    assert [t["gamma"] for t in tiers["tiers"]] == list(search.manifest.gammas)


def test_reading_back_rejects_tampered_files(runs, tmp_path):
    export(load_source(runs["contiguous"]), ["all"], tmp_path)
    layerskip = tmp_path / "layerskip.json"
    data = json.loads(layerskip.read_text())
    layerskip.write_text(json.dumps({**data, "exit_layer": data["exit_layer"] - 1}))
    with pytest.raises(ConfigError, match="argv disagrees"):
        read_back(tmp_path, "layerskip")
    (tmp_path / "skip_layers.json").write_text(json.dumps({"attention": [1], "mlp": [1], "gamma": 3}))
    with pytest.raises(ConfigError, match="keyed by model name"):
        read_back(tmp_path, "skip-layers")
    entry = {"attention": [1], "mlp": [1]}
    (tmp_path / "skip_layers.json").write_text(json.dumps({"a": entry, "b": {**entry, "mlp": [2]}}))
    with pytest.raises(ConfigError, match="different masks"):
        read_back(tmp_path, "skip-layers")


def test_hf_export_decodes_like_plain_greedy_on_a_tiny_llama(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    model = tiny_model("llama", layers=6)
    source = hf_source(6)
    write_hf(source, source.best, tmp_path / "generation_config.json")
    prompt = (5, 17, 3, 42, 8, 11, 29, 60)
    expected = autoregressive_decode(LayerwiseRunner(model), prompt, 24).tokens
    assert tuple(assisted_greedy(model, prompt, 24, tmp_path, monkeypatch)) == expected


def test_a_precision_draft_exports_to_skipsearch_json_and_is_refused_by_the_others(runs, tmp_path):
    from dataclasses import replace

    source = load_source(runs["sparse"])
    mask = SkipMask.parse(f"a:1|m:1|w8:2-{LAYERS - 1}|w4a:0", LAYERS)
    source = replace(source, best=replace(source.best, mask=mask))
    with pytest.raises(
        ConfigError, match=r"format skip-layers cannot say .* int8/int4 .* --format skipsearch"
    ):
        export(source, ["skip-layers"], tmp_path / "one")
    assert not (tmp_path / "one").exists()
    written = export(source, ["all"], tmp_path / "all")
    assert [e.format for e in written] == ["skipsearch"]
    data = json.loads((tmp_path / "all" / "skipsearch.json").read_text())
    assert data["int8_attn"] == list(range(2, LAYERS)) and data["int4_attn"] == [0]
    assert read_back(tmp_path / "all", "skipsearch")[0] == mask
    assert "skip-layers: not written" in (tmp_path / "all" / "README.md").read_text()
