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


def test_the_fallback_plans_cache_holds_bf16_matrices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF is not expanded to float32 on disk for a plan of bf16 matrices: its cache holds them in
    bf16 (the float32 conversion's, rounded), the embedding and norms in float32 exactly, and a
    model loaded from it under that plan has the float32 conversion's values."""
    import torch

    from skipsearch.models.weight_layout import WeightDtypes, read_exact

    gguf = loading.resolve_gguf(REGISTRY["smollm2-135m"])
    fp32 = loading.converted_gguf_dir(gguf)
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    shutil.copytree(fp32, tmp_path / "converted" / fp32.name)
    layout = WeightDtypes("float32", "bfloat16")
    mixed = loading.converted_gguf_dir(gguf, layout)
    assert mixed.name == f"{fp32.name}-bf16-matrices"
    wide, stored = load_file(fp32 / "model.safetensors"), load_file(mixed / "model.safetensors")
    assert wide.keys() == stored.keys()
    for name, tensor in stored.items():
        matrix = name.endswith("proj.weight")
        assert tensor.dtype == (torch.bfloat16 if matrix else torch.float32), name
        assert torch.equal(wide[name].to(tensor.dtype), tensor), name
    size = lambda d: sum(f.stat().st_size for f in d.iterdir())  # noqa: E731
    assert size(mixed) < 0.7 * size(fp32)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(mixed, dtype=torch.bfloat16)
    assert read_exact(model, str(mixed), layout) > 0
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(model.model.embed_tokens.weight, wide["model.embed_tokens.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_first_conversion_to_bf16_matrices_makes_no_float32_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no float32 conversion on disk, the fallback plan's cache is de-quantized from the GGUF with
    its matrices in bf16 (transformers is asked for bf16, never float32), the embedding and norms
    de-quantized again in float32: the float32 conversion's values exactly, in the layout's dtypes."""
    import torch
    from transformers import AutoModelForCausalLM

    from skipsearch.models.weight_layout import WeightDtypes

    gguf = loading.resolve_gguf(REGISTRY["smollm2-135m"])
    fp32 = loading.converted_gguf_dir(gguf)  # the user's own cache, for the values
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    asked: list[object] = []
    load = AutoModelForCausalLM.from_pretrained

    def recorded(*args: object, **kwargs: object) -> object:
        asked.append(kwargs.get("dtype"))
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recorded)
    mixed = loading.converted_gguf_dir(gguf, WeightDtypes("float32", "bfloat16"))
    assert asked == [torch.bfloat16]
    assert not (tmp_path / "converted" / fp32.name).exists()
    wide, stored = load_file(fp32 / "model.safetensors"), load_file(mixed / "model.safetensors")
    assert wide.keys() == stored.keys()
    for name, tensor in stored.items():
        assert tensor.dtype == (torch.bfloat16 if name.endswith("proj.weight") else torch.float32), name
        assert torch.equal(wide[name].to(tensor.dtype), tensor), name
