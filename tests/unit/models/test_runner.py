"""The layer-wise runner reproduces the model exactly, and skips what the mask says."""

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

from skipsearch.errors import ModelLoadError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_empty_mask_logits_equal_the_model(family):
    model = tiny_model(family, sliding_window=8) if family != "llama" else tiny_model(family)
    ids = torch.randint(0, 61, (2, 19))
    expected = model(ids).logits
    assert torch.allclose(LayerwiseRunner(model).forward(ids), expected, atol=1e-4)


def test_incremental_decoding_with_a_cache_matches_one_pass(llama):
    runner = LayerwiseRunner(llama)
    ids = torch.randint(0, 61, (1, 15))
    cache = DynamicCache(config=llama.config)
    pieces = [runner.forward(ids[:, :9], cache=cache)]
    pieces += [runner.forward(ids[:, i : i + 1], cache=cache) for i in range(9, 15)]
    assert cache.get_seq_length() == 15
    assert torch.allclose(torch.cat(pieces, dim=1), llama(ids).logits, atol=1e-4)


def test_layer_skip_equals_the_model_without_those_layers(llama):
    runner = LayerwiseRunner(llama)
    ids = torch.randint(0, 61, (1, 12))
    masked = runner.forward(ids, mask=SkipMask.from_layers(6, [1, 4]))
    kept = torch.nn.ModuleList([layer for i, layer in enumerate(llama.model.layers) if i not in (1, 4)])
    llama.model.layers = kept
    assert torch.allclose(masked, llama(ids).logits, atol=1e-4)


def test_sublayer_skip_passes_the_residual_through(llama):
    runner = LayerwiseRunner(llama)
    hidden = torch.randn(1, 5, 32)
    position_ids = torch.arange(5)[None]
    only_mlp = runner.run_layers(hidden, 2, 3, position_ids, SkipMask(6, attn=[2]))
    assert torch.allclose(only_mlp, runner.mlp(2, hidden))
    only_attn = runner.run_layers(hidden, 2, 3, position_ids, SkipMask(6, mlp=[2]))
    both = runner.run_layers(hidden, 2, 3, position_ids)
    assert torch.allclose(runner.mlp(2, only_attn), both, atol=1e-6)


def test_running_from_a_middle_layer_resumes_exactly(llama):
    runner = LayerwiseRunner(llama)
    ids = torch.randint(0, 61, (2, 10))
    position_ids = torch.arange(10)[None]
    states: list[torch.Tensor] = []
    final = runner.run_layers(runner.embed(ids), 0, 6, position_ids, collect=states)
    assert len(states) == 7
    resumed = runner.run_layers(states[3], 3, 6, position_ids)
    assert torch.allclose(resumed, final, atol=1e-6)


def test_unsupported_architecture_is_a_clear_error():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=10))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        LayerwiseRunner(gpt2)
