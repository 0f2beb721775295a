"""The plan's weight dtypes from the first byte: random weights built module by module in them, a
model that does not fit refused before any weight is made, and a GGUF cache of bf16 matrices."""

from pathlib import Path

import pytest
import torch
from torch import nn

from skipsearch.errors import ModelLoadError
from skipsearch.models import memory_fit
from skipsearch.models.loading import load_model
from skipsearch.models.memory_fit import check_fits, model_bytes
from skipsearch.models.random_weights import RandomWeights, random_config, random_model
from skipsearch.models.weight_layout import WeightDtypes

MIXED = WeightDtypes("float32", "bfloat16")


def test_random_weights_are_made_in_the_plans_dtypes() -> None:
    """The matrices in bf16 (the exact rounding of the float32 build's), the embedding, norms and
    tied head in float32."""
    weights = RandomWeights(num_layers=1, seed=3)
    wide = random_model("smollm2-135m", "cpu", torch.float32, weights)
    mixed = random_model("smollm2-135m", "cpu", torch.float32, weights, torch.bfloat16)
    layer = mixed.model.layers[0]
    assert layer.mlp.up_proj.weight.dtype == layer.self_attn.q_proj.weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == mixed.model.embed_tokens.weight.dtype == torch.float32
    assert mixed.lm_head.weight is mixed.model.embed_tokens.weight
    for name, tensor in mixed.state_dict().items():
        assert torch.equal(wide.state_dict()[name].to(tensor.dtype), tensor), name


def test_the_fallback_plan_packs_the_bf16_matrices_it_was_built_with() -> None:
    loaded = load_model("smollm2-135m", "cpu", "auto", RandomWeights(num_layers=1))
    plain = [m for m in loaded.model.modules() if type(m) is nn.Linear]
    if "bf16 weights, fp32 activations" in loaded.plan.line:
        assert plain == []  # every matrix went to the kernel, none left in bf16 beside fp32 activations
    assert all(m.weight.dtype == loaded.model.model.embed_tokens.weight.dtype for m in plain)


def test_the_bytes_are_counted_in_the_layouts_dtypes() -> None:
    config = random_config("mistral-7b", RandomWeights(num_layers=2))
    wide, mixed = model_bytes(config, WeightDtypes("float32", "float32")), model_bytes(config, MIXED)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert mixed.layer == 2 * layer + 4 * 2 * 4096 and wide.layer == wide.wide_layer == 4 * (layer + 2 * 4096)
    assert mixed.outside == 4 * 32768 * 4096 + 2 * 32768 * 4096 + 4 * 4096  # fp32 embedding, bf16 head


def test_a_model_that_does_not_fit_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: int(6e9))
    made = []
    monkeypatch.setattr("skipsearch.models.loading.random_model", lambda *a: made.append(a))
    refusal = (
        r"mistral-7b needs about \d+\.\d GB .* 6\.0 GB available: use --dtype bfloat16 or --num-layers 3"
    )
    with pytest.raises(ModelLoadError, match=refusal):
        load_model("mistral-7b", "cpu", "float32", RandomWeights(num_layers=8))
    assert made == []
    config = random_config("mistral-7b", RandomWeights(num_layers=4))
    assert check_fits(config, MIXED, "mistral-7b", True).layers == 4  # its plan's bf16 matrices fit
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: int(1e9))
    with pytest.raises(ModelLoadError, match="a machine with more memory"):
        check_fits(config, MIXED, "mistral-7b", False)


def file_maps(suffix: str) -> list[tuple[int, int]]:
    """This process's address ranges mapped from files whose names end in `suffix`."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[-1].endswith(suffix):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc/self/maps")
def test_a_checkpoint_is_read_tensor_by_tensor_not_through_a_map_of_its_file(tmp_path: Path) -> None:
    """transformers would map the whole safetensors file and keep every page of it while the plan
    packs copies of its matrices; read tensor by tensor, no weight lives in a map of the file."""
    from transformers import AutoModelForCausalLM

    from skipsearch.models.loading import tensor_by_tensor
    from tests.conftest import tiny_model

    tiny_model("llama", layers=2).save_pretrained(tmp_path)
    with tensor_by_tensor():
        read = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    mapped = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    maps = file_maps(".safetensors")

    def in_a_map(model: nn.Module) -> int:
        return sum(any(a <= p.data_ptr() < b for a, b in maps) for p in model.parameters())

    assert in_a_map(mapped) > 0  # what transformers does alone: the test can tell
    assert in_a_map(read) == 0
    for (name, a), b in zip(read.state_dict().items(), mapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_replaced_child_is_let_go_before_the_next_is_replaced() -> None:
    """`replace_children` lists only the parents: each replaced matrix can be freed at once."""
    import weakref

    from skipsearch.cpu.replace import release_freed_memory, replace_children

    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)))
    gone = []
    previous: list[weakref.ref] = []

    def replace(child: nn.Module) -> nn.Module | None:
        if type(child) is not nn.Linear:
            return None
        gone.extend(ref() is None for ref in previous)
        previous.append(weakref.ref(child))
        return nn.Identity()

    assert replace_children(model, replace) == 3
    assert gone == [True, True, True]  # the first when the second is replaced; both at the third
    assert isinstance(release_freed_memory(), bool)
