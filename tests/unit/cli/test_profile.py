"""`skipsearch profile` end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipsearch import cli
from skipsearch.cost.latency import LatencyProfile
from skipsearch.models import loading
from skipsearch.models.loading import LoadedModel, dtype_name
from skipsearch.store import default_profile_path
from tests.conftest import tiny_model

pytestmark = pytest.mark.usefixtures("only_profile")


# -- command line --------------------------------------------------------------------------------


def accept_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model tiny` passes the command line's name check: the tests load the tiny Llama under it."""
    known = cli.unknown_model
    monkeypatch.setattr(cli, "unknown_model", lambda name: None if name == "tiny" else known(name))


@pytest.fixture(autouse=True)
def tiny_is_a_model_name(monkeypatch: pytest.MonkeyPatch) -> None:
    accept_tiny(monkeypatch)


@pytest.fixture
def tiny_loader(monkeypatch: pytest.MonkeyPatch, cache_in_tmp: Path) -> None:
    """`load_model` returns the tiny Llama, so the command runs end to end in a second."""
    model = tiny_model("llama", layers=4)
    monkeypatch.setattr(
        loading,
        "load_model",
        lambda name, device, dtype, random_weights=None, announce=True: LoadedModel(
            model, None, name, "test"
        ),
    )


@pytest.mark.slow
def test_cli_writes_the_profile_and_prints_the_summary(tiny_loader, capsys, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = ["profile", "--model", "tiny", "--context-lengths", "16,8", "--repeats", "1", "--warmup", "0"]
    args += ["--processes", "1"]
    assert cli.main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # the terminal gets the headline, the draft steps at each precision and where the tables went
    assert printed.startswith("profile at 8 tokens: a step takes ") and str(out) in printed
    steps = [line.split("│")[1:3] for line in printed.splitlines() if line.startswith("│")]
    rows = [(context.strip(), weights.strip()) for context, weights in steps]
    assert rows == [(c, w) for c in ("8", "16") for w in ("float32", "int8", "int4")], printed
    assert "with every token accepted at 512 tokens (pays from 1.05x)" in " ".join(printed.split())
    assert "Draft cost c" not in printed  # the tables go to a file beside the profile
    tables = out.with_suffix(".txt").read_text()
    assert "Draft step, every layer at each precision" in tables
    assert "Draft cost c" in tables and "E/L" in tables and "f(γ)" in tables
    assert "Draft head of k rows" in tables and "ratio to full" in tables
    assert "pillar choice and gather a round (s4w256k64)" in tables
    profile = LatencyProfile.load(out)
    assert (profile.context_lengths, profile.meta["model"]) == ((8, 16), "tiny")
    assert cli.main([*args, "--out", str(out), "--tables"]) == 0  # and --tables prints them too
    assert "Draft cost c" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_default_output_is_where_measure_looks(tiny_loader, capsys) -> None:
    args = [
        "--model",
        "tiny",
        "--context-lengths",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--processes",
        "1",
    ]
    assert cli.main(["profile", *args]) == 0
    written = default_profile_path("tiny", "cpu", dtype_name("cpu", "auto"))
    assert LatencyProfile.load(written).context_lengths == (8,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--context-lengths", "128,abc"], "--context-lengths"),
        (["--context-lengths", "0,128"], "--context-lengths"),
        (["--context-lengths", ""], "--context-lengths"),
        (["--repeats", "0"], "repeats"),
        (["--context-lengths", "4096"], "positions"),
        (["--processes", "0"], "processes"),
        (["--repeats", "2", "--processes", "3"], "at least processes"),
    ],
)
def test_cli_bad_arguments_are_one_line_errors(tiny_loader, capsys, args: list[str], message: str) -> None:
    assert cli.main(["profile", "--model", "tiny", "--processes", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("skipsearch: error:") and message in err and "\n" not in err


def test_skip_existing_measures_nothing_when_a_profile_is_there(tiny_loader, capsys, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = ["profile", "--model", "tiny", "--context-lengths", "8", "--repeats", "1", "--warmup", "0"]
    args += ["--processes", "1", "--out", str(out), "--skip-existing"]
    assert cli.main(args) == 0  # nothing there yet: measured
    written = out.read_text()
    assert cli.main([*args[:4], "16", *args[5:]]) == 0  # another context, but the file exists
    assert out.read_text() == written
    assert "not measured again" in " ".join(capsys.readouterr().out.split())  # rich wraps long paths
    stored = json.loads(written)
    stored["meta"]["products"] = "onednn"  # timed before the plan's products changed
    out.write_text(json.dumps(stored))
    assert cli.main(args) == 0
    assert json.loads(out.read_text())["meta"]["products"] == "torch"  # measured again for this plan
    assert "another kernel plan's" in " ".join(capsys.readouterr().out.split())
    out.write_text("{not json")
    assert cli.main(args) == 2  # a damaged profile is an error, not a silent skip


def test_an_older_profile_is_kept_by_skip_existing_and_says_how_to_time_precisions(
    tiny_loader, capsys, tmp_path: Path
) -> None:
    out = tmp_path / "profile.json"
    args = ["profile", "--model", "tiny", "--context-lengths", "8", "--repeats", "1", "--warmup", "0"]
    args += ["--processes", "1", "--out", str(out), "--skip-existing"]
    assert cli.main(args) == 0
    stored = json.loads(out.read_text())
    assert set(stored["precisions"]) == {"8", "4"}
    del stored["precisions"]  # a profile from before the int8/int4 timings
    out.write_text(json.dumps(stored))
    capsys.readouterr()
    assert cli.main(args) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "not measured again" in said and "predates the int8/int4 timings" in said
    assert "`skipsearch profile --model tiny` without --skip-existing times them" in said
    assert "precisions" not in json.loads(out.read_text())  # kept as it was


def test_choose_space_reads_the_profile_and_names_the_space(
    tiny_loader, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skipsearch.cli import profile as command
    from skipsearch.cost.verdict import Verdict

    out = tmp_path / "profile.json"
    choose = ["profile", "--model", "tiny", "--out", str(out), "--choose-space", "sparse"]
    assert cli.main(choose) == 2  # no profile yet: one line saying how to make one
    assert "skipsearch profile --model tiny" in capsys.readouterr().err
    args = ["profile", "--model", "tiny", "--context-lengths", "8", "--repeats", "1", "--warmup", "0"]
    assert cli.main([*args, "--processes", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    for pays, space in ((True, "precision"), (False, "sparse")):
        ceiling = {8: Verdict(1.5 if pays else 0.9, "calibrated"), 4: Verdict(0.8, "calibrated")}
        monkeypatch.setattr(command, "precision_ceilings", lambda profile, context, c=ceiling: c)
        assert cli.main(choose) == 0
        printed = capsys.readouterr()
        assert printed.out == f"{space}\n"  # the space alone, for a script
        assert (
            f"space {space}: at full acceptance with the model's head, "
            f"int8 {'could' if pays else 'cannot'} pay" in printed.err
        )
    stored = json.loads(out.read_text())
    del stored["precisions"]
    out.write_text(json.dumps(stored))
    monkeypatch.undo()
    accept_tiny(monkeypatch)
    assert cli.main(choose) == 0
    printed = capsys.readouterr()
    assert printed.out == "sparse\n" and "no int8/int4 timings" in printed.err


def test_cli_out_must_not_be_a_directory(tiny_loader, capsys, tmp_path: Path) -> None:
    assert cli.main(["profile", "--model", "tiny", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# -- --graphs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--graphs: CUDA graphs need a GPU, and --device is cpu: use --device cuda, or drop --graphs"),
        (["--device", "cuda", "--processes", "3"], "--graphs profiles in one process on a GPU"),
    ],
)
def test_graphs_are_refused_in_one_line_where_they_cannot_run(
    tiny_loader, capsys, args: list[str], message: str
) -> None:
    assert cli.main(["profile", "--model", "tiny", "--graphs", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"skipsearch: error: {message}") and "\n" not in err


def test_graphs_write_a_profile_of_their_own(tiny_loader, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphed path end to end, its GPU check lifted (eager parts on this CPU): one process, a
    `-graphs` file beside the eager profile, which it leaves alone."""
    from skipsearch.cli import profile as command

    monkeypatch.setattr(command, "check_graphs_options", lambda args: None)
    eager = default_profile_path("tiny", "cpu", dtype_name("cpu", "auto"))
    eager.parent.mkdir(parents=True, exist_ok=True)
    eager.write_text("{}")
    args = [
        "profile",
        "--model",
        "tiny",
        "--graphs",
        "--context-lengths",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]
    assert cli.main(args) == 0
    written = default_profile_path("tiny", "cpu", dtype_name("cpu", "auto"), graphs=True)
    profile = LatencyProfile.load(written)
    assert profile.meta["graphs"] and profile.meta["processes"] == 1 and "kernel_plan" in profile.meta
    assert eager.read_text() == "{}"
    assert "launch gap taken off each part" in " ".join(written.with_suffix(".txt").read_text().split())
