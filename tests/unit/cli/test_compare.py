"""`skipsearch compare --resume` and `run --resume` in real processes (issue 51): a resume restores
every stored setting (a compare's strategies, seeds and random multiple too), refuses a typed one
that differs and refuses a directory of the other kind, each in one line that changes nothing; an
interrupted run says how to resume it, and the resume finishes its budget."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from skipsearch.search.study import journal_storage
from skipsearch.store import JOURNAL_FILE, RUN_FILE
from tests.unit.cli.conftest import assert_one_line_error
from tests.unit.conftest import REPOSITORY, SMALL, with_shared_kernels


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, shared_kernels: Path) -> Path:
    return with_shared_kernels(tmp_path_factory.mktemp("cache"), shared_kernels)


def skipsearch(cache: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "SKIPSEARCH_CACHE": str(cache)}
    command = [sys.executable, "-m", "skipsearch", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def finished(model_dir: str, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished run and a finished compare (random search, one seed, two masks each)."""
    root = tmp_path_factory.mktemp("finished")
    made = {"run": root / "run", "compare": root / "compare"}
    extra = {"run": ["--strategy", "random"], "compare": ["--strategies", "random", "--seeds", "1"]}
    for kind, out in made.items():
        result = skipsearch(
            cache, kind, "--model", model_dir, *SMALL, "--budget", "2", *extra[kind], "--out", str(out)
        )
        assert result.returncode == 0, result.stderr
    return made


def copy_of(finished: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished[kind], tmp_path / kind))


def trials(out: Path) -> dict[str, int]:
    storage = journal_storage(out)
    return {
        name: len(
            optuna.load_study(study_name=name, storage=storage).get_trials(states=(TrialState.COMPLETE,))
        )
        for name in optuna.study.get_all_study_names(storage)
    }


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_compare_resume_restores_its_strategies_seeds_and_multiple(
    finished: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    """Untyped, --strategies and --seeds are the parser's defaults (six strategies, three seeds),
    which the stored ones replace: one study, to the new budget."""
    out = copy_of(finished, "compare", tmp_path)
    stored = yaml.safe_load((out / RUN_FILE).read_text())
    result = skipsearch(cache, "compare", "--out", str(out), "--resume", "--budget", "3")
    assert result.returncode == 0, result.stderr
    assert trials(out) == {"random-s0": 3}
    resumed = yaml.safe_load((out / RUN_FILE).read_text())
    assert resumed["kind"] == "compare" and resumed["compare"] == stored["compare"]
    assert {**resumed["config"], "budget": 2} == stored["config"]


@pytest.mark.parametrize(
    ("kind", "typed", "message"),
    [
        ("compare", ["--seeds", "2"], "--seeds 2 would be ignored: .* stored seeds=1"),
        (
            "compare",
            ["--strategies", "uniform"],
            "--strategies uniform would be ignored: .* strategies=random",
        ),
        ("compare", ["--random-multiple", "2"], "--random-multiple 2 would be ignored"),
        ("compare", ["--gamma-max", "4"], "--gamma-max 4 would be ignored: .* gamma_max=8"),
        ("run", ["--n-prompts", "3"], "--n-prompts 3 would be ignored: .* n_prompts=2"),
        ("run", ["--temperature", "0.5"], "--temperature 0.5 would be ignored"),
    ],
)
def test_a_resume_refuses_a_typed_setting_that_differs_and_changes_nothing(
    finished: dict[str, Path], cache: Path, tmp_path: Path, kind: str, typed: list[str], message: str
) -> None:
    out = copy_of(finished, kind, tmp_path)
    before = {name: digest(out / name) for name in (RUN_FILE, JOURNAL_FILE)}
    result = skipsearch(cache, kind, "--out", str(out), "--resume", *typed)
    assert_one_line_error(result, "would be ignored")
    assert re.search(message, result.stderr), result.stderr
    assert {name: digest(out / name) for name in (RUN_FILE, JOURNAL_FILE)} == before


@pytest.mark.parametrize(("kind", "other"), [("compare", "run"), ("run", "compare")])
def test_a_resume_of_the_other_kind_is_refused_naming_the_command_that_continues_it(
    finished: dict[str, Path], cache: Path, tmp_path: Path, kind: str, other: str
) -> None:
    out = copy_of(finished, kind, tmp_path)
    before = digest(out / RUN_FILE)
    result = skipsearch(cache, other, "--out", str(out), "--resume")
    assert_one_line_error(
        result, f"holds a `skipsearch {kind}`, not a {other}: continue it with `skipsearch {kind}"
    )
    assert digest(out / RUN_FILE) == before and trials(out) == trials(finished[kind])


def test_an_interrupted_run_says_how_to_resume_and_the_resume_keeps_every_trial(
    model_dir: str, cache: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "SKIPSEARCH_CACHE": str(cache)}
    command = [
        sys.executable,
        "-m",
        "skipsearch",
        "run",
        "--model",
        model_dir,
        *SMALL,
        "--strategy",
        "random",
    ]
    out = tmp_path / "run"
    process = subprocess.Popen(
        [*command, "--budget", "8", "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background `&` ignores it
    )
    journal, deadline = out / JOURNAL_FILE, time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if journal.is_file() and '"state":1' in journal.read_text().replace(" ", ""):
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the run finished before the interrupt reached it")
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert f"continue with `skipsearch run --out {out} --resume`" in stderr
    done = sum(trials(out).values())
    resumed = skipsearch(cache, "run", "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert trials(out) == {"random": 8} and done >= 1
