"""`skipsearch export`: every format round-trips, HF's config decodes losslessly, errors are one line.

Runs are real run directories (journal, cache, run.yaml, best.json) searched over a synthetic
acceptance landscape on 8 layers, so no model is needed except for the HF generate checks.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import candidate_generator

from skipsearch.acceptance.rounds import AcceptanceProfile
from skipsearch.cli import main
from skipsearch.cli.decode import read_from
from skipsearch.config import RunConfig
from skipsearch.engine import autoregressive_decode
from skipsearch.errors import ConfigError
from skipsearch.executors.base import LocalExecutor
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.run.export import FORMATS, Draft, ExportSource, export, load_source, write_hf
from skipsearch.run.report import write_run_outputs
from skipsearch.search import SearchConfig, make_strategy, run_search
from skipsearch.search.objective import make_scorer
from skipsearch.search.space_files import parse_space
from skipsearch.search.space_spec import TierSpace
from skipsearch.search.tier_sets import search_space_tiers
from skipsearch.tiers.manifest import TierManifest
from skipsearch.tiers.policy import TierPolicy
from tests.conftest import tiny_model

LAYERS = 8
# Layers 1 and 2 are nearly free to skip, the last layer is expensive: the best mask is sparse
# ({1, 2}) and every early exit, which must skip the last layer, scores lower.
DAMAGE = np.array([3.0, 0.02, 0.02, 0.6, 0.8, 0.9, 1.0, 2.0])
DRAWS = np.random.default_rng(7).random((4, 48))
SPACES = {
    "contiguous": {"kind": "contiguous"},
    "sparse-with-exits": {"kind": "sparse", "protected": [0], "max_skipped": 2},
    "sparse": {"kind": "sparse", "protected": [0, -1], "max_skipped": 2},
}


def synthetic_profile(mask: SkipMask) -> AcceptanceProfile:
    accept = float(np.exp(-DAMAGE[sorted(mask.skipped_layers)].sum()))
    matches = tuple(tuple(bool(d < accept) for d in row) for row in DRAWS)
    return AcceptanceProfile(str(mask), matches, tuple((accept,) * len(row) for row in DRAWS), 1.0)


def make_run(run_dir: Path, space_name: str) -> Path:
    """An exhaustive search of a small space, written out as `skipsearch run` would."""
    space = parse_space(SPACES[space_name], space_name, space_name).resolve(LAYERS)
    with LocalExecutor(synthetic_profile) as executor:
        run_search(
            space,
            make_strategy("exhaustive"),
            executor,
            make_scorer(),
            run_dir,
            SearchConfig(budget=space.size()),
        )
    provenance = {"num_layers": LAYERS, "prompt_set": "synthetic-0123", "torch": "t", "transformers": "tf"}
    RunConfig(space=space_name, strategy="exhaustive", budget=space.size()).save(
        run_dir / "run.yaml", provenance
    )
    write_run_outputs(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three runs; the journal's fsync (most of the time) is off, as in test_search."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        return {name: make_run(root / name, name) for name in SPACES}


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


def draft_and_verify_layers(path: Path, model_name: str) -> tuple[list[int], list[int]]:
    """How Draft & Verify's code reads the file: `skip_layers[model_name]["attention"]` / `["mlp"]`."""
    with open(path) as f:
        skip_layers = json.load(f)
    return skip_layers[model_name]["attention"], skip_layers[model_name]["mlp"]


def swift_layers(path: Path, model_name: str, task_name: str) -> tuple[list[int], list[int]]:
    """How SWIFT's code reads it: the entry under `f"{model_name}_{task_name}"`."""
    with open(path) as f:
        skip_layers = json.load(f)
    entry = skip_layers[f"{model_name}_{task_name}"]
    return entry["attention"], entry["mlp"]


def test_skip_layers_load_the_way_draft_and_verify_and_swift_read_them(runs, tmp_path):
    best = load_source(runs["sparse"]).best.mask
    expected = (sorted(best.attn), sorted(best.mlp))
    assert main(["export", str(runs["sparse"]), "--format", "skip-layers", "--out", str(tmp_path)]) == 0
    assert draft_and_verify_layers(tmp_path / "skip_layers.json", "smollm2-135m") == expected
    assert swift_layers(tmp_path / "skip_layers.json", "smollm2-135m", "synthetic") == expected
    options = ["--format", "skip-layers", "--out", str(tmp_path / "k"), "--export-key", "llama-2-13b"]
    assert main(["export", str(runs["sparse"]), *options]) == 0
    assert draft_and_verify_layers(tmp_path / "k" / "skip_layers.json", "llama-2-13b") == expected
    assert list(json.loads((tmp_path / "k" / "skip_layers.json").read_text())) == ["llama-2-13b"]


# -- the CLI ----------------------------------------------------------------------------------------
def test_export_command_writes_to_run_exports(runs, tmp_path, capsys):
    assert main(["export", str(runs["contiguous"])]) == 0
    out = capsys.readouterr().out
    assert out.count("read back OK") == 4
    assert (runs["contiguous"] / "exports" / "generation_config.json").is_file()
    for name, fmt in FORMATS.items():
        assert main(["export", str(runs["contiguous"]), "--format", name, "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name / fmt.file).is_file()


def _unfinished_run(tmp_path: Path) -> Path:
    run = tmp_path / "unfinished"
    run.mkdir()
    RunConfig().save(run / "run.yaml", {})
    return run


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (lambda runs, tmp: [str(tmp / "missing")], "does not exist"),
        (lambda runs, tmp: [str(tmp)], "not a run directory"),
        (lambda runs, tmp: [str(_unfinished_run(tmp))], "no finished run"),
        (lambda runs, tmp: [str(runs["sparse"]), "--format", "hf"], "only an early exit"),
        (lambda runs, tmp: [str(runs["sparse"]), "--format", "layerskip"], "only an early exit"),
    ],
    ids=["missing", "not-a-run", "unfinished", "sparse-to-hf", "sparse-to-layerskip"],
)
def test_export_errors_are_one_line_and_exit_2(runs, tmp_path, capsys, target, message):
    assert main(["export", *target(runs, tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_broken_best_json_is_one_line(tmp_path, capsys):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": "a:1|m:1"}))
    assert main(["export", str(best)]) == 2
    assert "lacks model, num_layers, gamma_best" in capsys.readouterr().err


# -- the HF export drives transformers' early-exit assisted generation ------------------------------
def hf_source(num_layers: int) -> ExportSource:
    best = Draft(SkipMask.prefix(num_layers, num_layers // 2), 3, 1.2, 0)
    return ExportSource(Path("run"), None, {"model": "m"}, best, best, None, None)


def assisted_greedy(
    model, prompt: tuple[int, ...], new_tokens: int, directory: Path, monkeypatch
) -> list[int]:
    """`model.generate` with the exported generation config, recording each draft's length."""
    drafted: list[int] = []
    original = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        drafted.append(ids.shape[1] - input_ids.shape[1])
        return ids, logits

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates", spy)
    model.generation_config = GenerationConfig.from_pretrained(directory)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )
    assert drafted and max(drafted) == 3  # num_assistant_tokens = γ, no confidence cut
    return out[0, len(prompt) :].tolist()


def test_hf_export_decodes_like_plain_greedy_on_a_tiny_llama(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    model = tiny_model("llama", layers=6)
    source = hf_source(6)
    write_hf(source, source.best, tmp_path / "generation_config.json")
    prompt = (5, 17, 3, 42, 8, 11, 29, 60)
    expected = autoregressive_decode(LayerwiseRunner(model), prompt, 24).tokens
    assert tuple(assisted_greedy(model, prompt, 24, tmp_path, monkeypatch)) == expected


@pytest.mark.integration
def test_hf_export_decodes_like_plain_greedy_on_smollm2(tmp_path, monkeypatch):
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.models.loading import load_model

    loaded = load_model("smollm2-135m")
    source = hf_source(loaded.num_layers)
    write_hf(source, source.best, tmp_path / "generation_config.json")
    prompt = encode_prompts(PromptSpec(n_prompts=1, max_prompt_tokens=64, new_tokens=16), loaded.tokenizer)[0]
    expected = autoregressive_decode(LayerwiseRunner(loaded.model), prompt.ids, 16).tokens
    assert tuple(assisted_greedy(loaded.model, prompt.ids, 16, tmp_path, monkeypatch)) == expected
