"""Profiles over fresh processes, and their settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skipsearch.bench.processes import profile_processes
from skipsearch.errors import ConfigError
from tests.conftest import make_tokenizer, tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama on disk with a tokenizer, so a fresh process can load it like any model."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", layers=3).save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


@pytest.mark.slow
def test_profile_over_fresh_processes(tiny_model_dir: Path) -> None:
    """Two spawned processes, two samples each: one profile of four samples per entry."""
    profile = profile_processes(
        str(tiny_model_dir), context_lengths=(8,), positions=(1, 2), repeats=3, warmup=0, processes=2
    )
    assert (profile.num_layers, profile.context_lengths, profile.positions) == (3, (8,), (1, 2))
    assert (profile.meta["processes"], profile.meta["repeats"]) == (2, 4)  # ceil(3 / 2) each
    assert np.asarray(profile.mlp).min() > 0 and profile.round_overhead[1] > 0


@pytest.mark.slow
def test_an_error_in_a_fresh_process_reaches_the_caller(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="256 positions"):
        profile_processes(str(tiny_model_dir), context_lengths=(300,), repeats=2, processes=2)


@pytest.mark.parametrize(
    ("processes", "repeats", "message"), [(0, 4, "processes must be"), (5, 4, "at least")]
)
def test_bad_process_counts(processes: int, repeats: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        profile_processes("no-such-model", repeats=repeats, processes=processes)


def test_one_process_by_default_on_a_gpu_several_on_a_cpu() -> None:
    from skipsearch.bench.processes import DEFAULT_PROCESSES, default_processes

    assert default_processes("cuda:0") == default_processes("cuda") == 1
    assert default_processes("cpu") == DEFAULT_PROCESSES > 1
