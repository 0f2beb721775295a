"""Where profiles and the cache are stored, and the checks every output path passes before work."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch.errors import ConfigError
from skipsearch.store import (
    cache_dir,
    check_cache_dir,
    check_environment,
    check_output_dir,
    check_output_file,
    default_profile_path,
    readable_profile_path,
)

# -- paths ---------------------------------------------------------------------------------------


def test_default_profile_path_is_one_file_per_model_device_kind_and_dtype(cache_in_tmp: Path) -> None:
    path = default_profile_path("HuggingFaceTB/SmolLM2-135M", "cuda:0", "bfloat16")
    assert path == cache_in_tmp / "profiles" / "HuggingFaceTB_SmolLM2-135M-cuda-bfloat16.json"
    assert path == default_profile_path("HuggingFaceTB/SmolLM2-135M", "cuda", "bfloat16")
    assert default_profile_path("smollm2-135m", "cpu", "float32").name == "smollm2-135m-cpu-float32.json"


def test_a_profile_named_before_the_dtype_is_still_read(cache_in_tmp: Path) -> None:
    legacy = cache_in_tmp / "profiles" / "smollm2-135m-cpu.json"
    assert readable_profile_path("smollm2-135m", "cpu", "float32").name == "smollm2-135m-cpu-float32.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("{}")
    assert readable_profile_path("smollm2-135m", "cpu", "float32") == legacy


def test_a_graphed_profile_has_its_own_file_and_never_reads_the_eager_one(cache_in_tmp: Path) -> None:
    eager = default_profile_path("smollm2-135m", "cuda:0", "bfloat16")
    graphed = default_profile_path("smollm2-135m", "cuda:0", "bfloat16", graphs=True)
    assert graphed.name == "smollm2-135m-cuda-bfloat16-graphs.json" and graphed.parent == eager.parent
    legacy = cache_in_tmp / "profiles" / "smollm2-135m-cuda.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("{}")
    assert readable_profile_path("smollm2-135m", "cuda", "bfloat16", graphs=True) == graphed


# -- the cache's location and the outputs, checked before any work ---------------------------------
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SKIPSEARCH_CACHE", "", "SKIPSEARCH_CACHE is empty"),
        ("SKIPSEARCH_CACHE", "cache", "SKIPSEARCH_CACHE is 'cache', a relative path"),
        ("HOME", "", "HOME is empty"),
        ("HOME", "home", "HOME is 'home', a relative path"),
    ],
)
def test_an_empty_or_relative_cache_location_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """Either would put the cache wherever the command runs (or into `/`)."""
    monkeypatch.delenv("SKIPSEARCH_CACHE", raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{message}, so the cache would go wherever the command runs"):
        cache_dir()


def test_a_cache_that_is_a_file_or_under_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "file"))
    with pytest.raises(ConfigError, match=r"SKIPSEARCH_CACHE .*file is a file: pass a directory"):
        check_cache_dir()
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(ConfigError, match=r"is a file, not a directory.*set SKIPSEARCH_CACHE to a directory"):
        check_cache_dir()
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "new" / "cache"))
    assert check_cache_dir() == tmp_path / "new" / "cache"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # checked, nothing made


def test_an_output_file_is_refused_before_work_when_it_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert check_output_file(tmp_path / "a" / "b.json", "--json") == tmp_path / "a" / "b.json"
    with pytest.raises(ConfigError, match=r"--json .* is a directory: give a file path"):
        check_output_file(tmp_path, "--json")
    with pytest.raises(ConfigError, match="file is a file, not a directory"):
        check_output_file(tmp_path / "file" / "x.json", "--json")
    with pytest.raises(ConfigError, match="longer than the 255 a file name may have"):
        check_output_file(tmp_path / ("x" * 300), "--json")
    with pytest.raises(ConfigError, match="longer than the 4096 bytes a path may have"):
        check_output_file(tmp_path.joinpath(*["y" * 200] * 25), "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_directory_the_process_cannot_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root writes anywhere chmod allows nothing, so the refusal is simulated where the probe file
    is made (what a read-only mount or /sys answers)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("skipsearch.store.tempfile.mkstemp", refuse)
    with pytest.raises(ConfigError, match=r"--out .*out cannot be written \(.*Permission denied\)"):
        check_output_dir(tmp_path / "out", "--out")


def test_an_empty_home_is_refused_even_with_a_cache_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib makes its cache under HOME at import: an empty HOME put it into `/`."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", "")
    with pytest.raises(
        ConfigError, match=r"HOME is empty, so the caches of the libraries .* set HOME to an absolute"
    ):
        check_environment()
    monkeypatch.setenv("HOME", str(tmp_path))
    check_environment()
