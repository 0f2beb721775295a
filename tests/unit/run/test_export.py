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
from tests.conftest import tiny_gguf, tiny_model
from tests.unit.run.conftest import (
    LAYERS,
    SPACES,
    assisted_greedy,
    hf_source,
)


def read_back(out: Path, name: str) -> tuple[SkipMask, int | None]:
    fmt = FORMATS[name]
    return fmt.read(out / fmt.file, LAYERS)


def test_contiguous_run_exports_all_four_configs_that_read_back(runs, tmp_path):
    source = load_source(runs["contiguous"])
    best = source.best
    assert best.mask.exit_layer is not None and source.contiguous == best
    exported = export(source, ["all"], tmp_path)
    configs = [name for name, fmt in FORMATS.items() if fmt.in_all]
    assert [e.format for e in exported] == configs == ["skipsearch", "hf", "skip-layers", "layerskip"]
    for name in configs:
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


# -- gguf-draft: the draft cut from the model's GGUF, for llama.cpp ----------------------------------
def gguf_run_source(runs, name: str, tmp_path: Path, **best_json):
    """A run's source whose model came from a tiny 8-layer GGUF (as `model_source` records it)."""
    from dataclasses import replace

    source = load_source(runs[name])
    model_gguf = tmp_path / "model.gguf"
    if not model_gguf.is_file():
        tiny_gguf(model_gguf, layers=LAYERS)
    return replace(source, best_json={**source.best_json, "model_source": str(model_gguf), **best_json})


def test_gguf_draft_drops_the_skipped_layers_and_says_which_acceptance_applies(runs, tmp_path):
    import gguf

    source = gguf_run_source(runs, "sparse", tmp_path)
    best = source.best.mask
    assert best.skipped_layers and best.is_layer_level
    exported = export(source, ["gguf-draft"], tmp_path / "out")
    assert [e.format for e in exported] == ["gguf-draft"]
    reader = gguf.GGUFReader(tmp_path / "out" / "draft.gguf")
    assert reader.fields["llama.block_count"].contents() == LAYERS - len(best.skipped_layers)
    assert read_back(tmp_path / "out", "gguf-draft") == (best, source.best.gamma)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert f"--spec-draft-n-max {source.best.gamma}" in readme and "own KV cache" in readme
    assert f"`skipsearch measure --mode self --model smollm2-135m --mask '{best}'`" in readme
    assert "in shared-kv mode" in readme and "int8 ones as Q8_0" in readme
    measured_self = gguf_run_source(runs, "sparse", tmp_path, estimator_mode="self")
    export(measured_self, ["gguf-draft"], tmp_path / "self-out")
    readme = (tmp_path / "self-out" / "README.md").read_text()
    assert "measured acceptance in `self` mode, the one that applies here" in readme
    assert "skipsearch measure" not in readme


def test_gguf_draft_refuses_sub_layers_and_hugging_face_models_before_writing(runs, tmp_path):
    from dataclasses import replace

    source = gguf_run_source(runs, "sparse", tmp_path)
    sublayer = replace(source, best=replace(source.best, mask=SkipMask.parse("a:2|m:2,5", LAYERS)))
    with pytest.raises(ConfigError, match=r"drops whole layers only.*the MLP of layer 5 alone"):
        export(sublayer, ["gguf-draft"], tmp_path / "one")
    hub = replace(source, best_json={**source.best_json, "model": "org/m", "model_source": "hub:org/m"})
    with pytest.raises(ConfigError, match=r"not a \.gguf file"):
        export(hub, ["gguf-draft"], tmp_path / "one")
    with pytest.raises(ConfigError, match="--gguf-type q4_0 is for --format gguf-draft only"):
        export(replace(source, gguf_type="q4_0"), ["skipsearch"], tmp_path / "one")
    assert not (tmp_path / "one").exists()


def test_gguf_draft_carries_a_precision_draft_and_the_type_asked(runs, tmp_path):
    from dataclasses import replace

    import gguf

    source = gguf_run_source(runs, "sparse", tmp_path)
    mask = SkipMask.parse(f"a:1|m:1|w8:2-{LAYERS - 1}|w4a:0", LAYERS)
    source = replace(source, best=replace(source.best, mask=mask), gguf_type="q4_0")
    export(source, ["gguf-draft"], tmp_path / "out")
    types = {t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "out" / "draft.gguf").tensors}
    assert types == {"Q8_0", "Q4_0", "F32"}  # the embedding stays Q8_0; every layer matrix at Q4_0
    assert read_back(tmp_path / "out", "gguf-draft")[0] == mask
    assert "every kept layer's weight matrices at Q4_0" in (tmp_path / "out" / "README.md").read_text()
