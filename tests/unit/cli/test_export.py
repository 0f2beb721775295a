"""`skipsearch export`: files written where decode and other tools read them, errors in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipsearch.cli import main
from skipsearch.config import RunConfig
from skipsearch.run.export_formats import FORMATS
from skipsearch.run.export_source import load_source
from tests.unit.run.conftest import runs

# Fixtures of another folder's conftest.py, imported: listed so that they count as used.
__all__ = ["runs"]


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


def _unfinished_run(tmp_path: Path) -> Path:
    run = tmp_path / "unfinished"
    run.mkdir()
    RunConfig().save(run / "run.yaml", {})
    return run


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
    for name, fmt in ((n, f) for n, f in FORMATS.items() if f.in_all):
        assert main(["export", str(runs["contiguous"]), "--format", name, "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name / fmt.file).is_file()


def test_export_gguf_draft_from_a_run_whose_model_was_a_gguf(runs, tmp_path, capsys):
    import shutil

    from skipsearch.models.gguf_draft import read_draft_gguf
    from tests.conftest import tiny_gguf

    run = tmp_path / "run"
    shutil.copytree(runs["sparse"], run)
    best = json.loads((run / "best.json").read_text())
    model = tiny_gguf(tmp_path / "model.gguf", layers=best["num_layers"])
    (run / "best.json").write_text(json.dumps({**best, "model_source": str(model)}))
    options = ["--format", "gguf-draft", "--gguf-type", "q4_0", "--out", str(tmp_path / "out")]
    assert main(["export", str(run), *options]) == 0
    assert "gguf-draft" in capsys.readouterr().out
    mask = read_draft_gguf(tmp_path / "out" / "draft.gguf", best["num_layers"])[0]
    assert str(mask) == best["mask"]
    assert main(["export", str(run), "--gguf-type", "q8_0", "--out", str(tmp_path / "two")]) == 2
    assert "is for --format gguf-draft only" in capsys.readouterr().err
    assert main(["export", str(runs["sparse"]), "--format", "gguf-draft", "--gguf-type", "q5_k"]) == 2


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
