"""What the command-line tests of `cli/` and `run/` share: the tiny model directory, the per-test cache,
the one-line-error helpers, and a synthetic latency profile for context-aware scoring."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skipsearch.cli import main
from skipsearch.cost.latency import LatencyProfile
from skipsearch.store import kernels_dir
from tests.conftest import make_tokenizer, tiny_model

SMALL = ["--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "32"]


@pytest.fixture(scope="session")
def shared_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one kernels folder (`store.kernels_dir`: compiled C kernels and the plan's
    measured choices), seeded with this machine's (the default cache's): a test's fresh cache
    finds them built and measured, as a user's second run does, instead of compiling the kernels
    and timing the plan's probes again in every test (tests/unit/cpu/ measure in a bare cache)."""
    shared = tmp_path_factory.mktemp("kernels")
    if kernels_dir().is_dir():
        shutil.copytree(kernels_dir(), shared, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.tmp*"))
    return shared


def with_shared_kernels(cache: Path, shared: Path) -> Path:
    """`cache`, a skipsearch cache folder for child processes too, made now, whose kernels folder
    links to the session's `shared_kernels` (a cache outside any run's directory)."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "kernels").symlink_to(shared, target_is_directory=True)
    return cache


@pytest.fixture
def cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_kernels: Path) -> Path:
    """The skipsearch cache (references, profiles, rankings) inside the test's folder, not made
    yet; this process's kernels are the session's (`shared_kernels`: the folder is not linked into
    the cache, which may lie inside a run's directory, where a link is refused)."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("skipsearch.store.kernels_dir", lambda: shared_kernels)
    return tmp_path / "cache"


@pytest.fixture
def idle_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No other process keeps a core busy: the plan keeps what it measures (`cpu.choices.keep_choice`)."""
    monkeypatch.setattr("skipsearch.cpu.choices.busy_cores", lambda: 0.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = make_tokenizer()
    tiny_model("llama", layers=6, vocab_size=len(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def one_line_error(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("skipsearch: error: "), err
    return err


def run_args(model_dir: str, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", model_dir, *SMALL, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def _finished_master(model_dir: str, tmp_path_factory: pytest.TempPathFactory, shared_kernels: Path) -> Path:
    """One finished 3-trial run per module, with the cache it filled: `finished_run` copies both
    (but the kernels, which are the session's)."""
    home = tmp_path_factory.mktemp("finished")
    with_shared_kernels(home / "cache", shared_kernels)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKIPSEARCH_CACHE", str(home / "cache"))
        assert main(run_args(model_dir, home / "run", "--budget", "3", "--strategy", "random")) == 0
    return home


@pytest.fixture
def finished_run(_finished_master: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    """A finished run of the module's tiny model in this test's folder, its reference in this
    test's cache (`cache_in_tmp`): a copy of the module's one run, which is as the test's own
    would be (a seeded random search of 3 trials), without its seconds."""
    capsys.readouterr()
    ignore = shutil.ignore_patterns("kernels")  # the session's (`shared_kernels`), a link
    shutil.copytree(_finished_master / "cache", tmp_path / "cache", dirs_exist_ok=True, ignore=ignore)
    return Path(shutil.copytree(_finished_master / "run", tmp_path / "run"))


REPOSITORY = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = REPOSITORY) -> subprocess.CompletedProcess:
    """`skipsearch ARGS` in a new process, with this checkout and this test's cache."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, "-m", "skipsearch", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


# -- context-aware scoring -------------------------------------------------------------------------
def synthetic_latency(tmp_path: Path | None = None) -> LatencyProfile:
    """Two layers; attention 1 ms + 1 ms per 1k tokens of context, MLP 2 ms, embed and head 0.5 ms,
    all independent of positions; no overhead."""
    contexts, positions = (128, 1024, 2048), (1, 2, 3)
    flat = lambda t: [[t] * len(positions) for _ in contexts]  # noqa: E731
    attn = [[[1e-3 + 1e-6 * c] * len(positions) for c in contexts]] * 2
    tables = {"embed": flat(5e-4), "head": flat(5e-4), "attn": attn, "mlp": [flat(2e-3)] * 2}
    profile = LatencyProfile.from_dict(
        {
            "meta": {"num_layers": 2},
            "context_lengths": list(contexts),
            "positions": list(positions),
            **tables,
            "spread": {k: np.zeros_like(np.asarray(v)).tolist() for k, v in tables.items()},
            "round_overhead": {"1": 0.0, "2": 0.0},
        }
    )
    if tmp_path is not None:
        profile.save(tmp_path / "profile.json")
    return profile


def rows_latency(per_row: float, layers: int = 2) -> LatencyProfile:
    """`layers` layers at one 512-token context, every part 1 ms at one position and `per_row` ms
    more for each further row (up to 32): rows free (0) or costly, as a token tree's prices need."""
    positions = (1, 2, 4, 8, 16, 32)
    row = [(1.0 + per_row * (p - 1)) / 1e3 for p in positions]
    tables = {
        "embed": [[0.0] * len(positions)],
        "head": [row],
        "attn": [[row]] * layers,
        "mlp": [[row]] * layers,
    }
    return LatencyProfile.from_dict(
        {
            "meta": {"device": "test", "model": "tiny", "num_layers": layers},
            "context_lengths": [512],
            "positions": list(positions),
            **tables,
            "spread": tables,
            "round_overhead": {"1": 0.0, "8": 0.0},
        }
    )
