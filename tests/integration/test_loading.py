"""The converted-model cache in the dtype that runs, on the real embedded model's GGUF."""

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from skipsearch.models import loading
from skipsearch.models.registry import REGISTRY


def test_a_bf16_cache_is_cast_from_the_fp32_one_already_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fp32 conversion made before dtypes were part of the name still loads as fp32, and a bf16
    request casts it (exactly, without de-quantizing the GGUF again) into a directory half its size."""
    gguf = loading.resolve_gguf(REGISTRY["smollm2-135m"])
    fp32 = loading.converted_gguf_dir(gguf)  # the user's own cache: converted once, reused after
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    shutil.copytree(fp32, tmp_path / "converted" / fp32.name)
    assert loading.converted_gguf_dir(gguf, "float32") == tmp_path / "converted" / fp32.name

    from transformers import AutoModelForCausalLM

    load = AutoModelForCausalLM.from_pretrained

    def no_gguf(*args: object, **kwargs: object) -> object:
        assert "gguf_file" not in kwargs, "the GGUF was de-quantized again"
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_gguf)
    bf16 = loading.converted_gguf_dir(gguf, "bfloat16")
    assert bf16.name == f"{fp32.name}-bfloat16"
    wide, half = load_file(fp32 / "model.safetensors"), load_file(bf16 / "model.safetensors")
    assert wide.keys() == half.keys()
    assert all((wide[name].bfloat16() == half[name]).all() for name in wide)
    size = lambda d: sum(f.stat().st_size for f in d.iterdir())  # noqa: E731
    assert size(bf16) < 0.6 * size(fp32)
