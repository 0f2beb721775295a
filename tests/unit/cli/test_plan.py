"""`skipsearch plan`: the whole kernel plan with the timings behind each choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch import cli
from skipsearch.models.plan import LINE_LIMIT


@pytest.mark.slow
def test_plan_prints_every_choice_and_the_one_line_form(capsys) -> None:
    assert cli.main(["plan", "--random-weights", "--num-layers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("smollm2-135m on ") and lines[0].endswith(":")
    rows = [line.split()[0] for line in lines[1:-2]]
    assert rows[:2] == ["dtype", "attention"] and "threads" in rows
    line = lines[-2]
    assert line.startswith("kernel plan: ") and len(line) <= LINE_LIMIT
    assert "measured again when a kernel's build changes" in lines[-1]


def test_plan_refuses_a_bad_option_in_one_line(capsys) -> None:
    assert cli.main(["plan", "--num-layers", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    ("damage", "part"),
    [("no tokenizer", "tokenizer"), ("weights cut in half", "weights"), ("config.json of {}", "config")],
)
def test_a_damaged_model_directory_is_one_line_naming_the_file_and_the_fix(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, cache_in_tmp: Path, damage: str, part: str
) -> None:
    import shutil

    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    if part == "tokenizer":
        for path in broken.glob("*token*"):
            path.unlink()
    elif part == "weights":
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (broken / "config.json").write_text("{}")
    assert cli.main(["plan", "--model", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skipsearch: error: cannot load the {part} of {broken}")
