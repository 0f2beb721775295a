"""Tiny randomly-initialised decoders for fast tests, built in-process (no downloads)."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY = {
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def tiny_model(family: str = "llama", layers: int = 6, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    kwargs = {**TINY, "num_hidden_layers": layers, **overrides}
    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[family]
    model = model_cls(config_cls(**kwargs)).eval()
    # Random init gives near-uniform logits; sharpen so argmax is stable and skips matter.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def direct_matches(model, reference, skipped):
    """Plain transformers: full model vs the model with the skipped layers removed."""
    layers = model.model.layers
    kept = torch.nn.ModuleList([layer for i, layer in enumerate(layers) if i not in skipped])
    matches = []
    with torch.no_grad():
        for ids, start, end in zip(
            reference.input_ids, reference.prompt_lengths, reference.lengths, strict=True
        ):
            seq = ids[None, :end]
            target = model(seq).logits[0, start - 1 : end - 1].argmax(-1)
            model.model.layers = kept
            draft = model(seq).logits[0, start - 1 : end - 1].argmax(-1)
            model.model.layers = layers
            matches += (draft == target).tolist()
    return matches


@pytest.fixture
def llama():
    return tiny_model("llama")
