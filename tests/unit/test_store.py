"""Where profiles are stored and read back."""

from __future__ import annotations

from pathlib import Path

from skipsearch.store import default_profile_path, readable_profile_path

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
