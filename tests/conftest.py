"""Tiny randomly-initialised decoders and a tiny tokenizer for fast tests, built here (no downloads)."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from skipsearch.acceptance.prompts import EncodedPrompt
from skipsearch.acceptance.reference import build_reference
from skipsearch.cpu.attention_choice import choose_attention
from skipsearch.cpu.bf16_weights import load_tile_kernel
from skipsearch.cpu.decode_attention import load_amx_kernel, load_kernel
from skipsearch.models.kernels import apply_attention

TINY = {
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def with_kernel(dtype: torch.dtype):
    """`dtype` as a test parameter, skipped where the decode kernel over a `dtype` cache does not
    load here."""
    library = load_kernel(dtype)
    reason = f"{dtype} decode kernel unavailable: {library.reason}"
    return pytest.param(dtype, marks=pytest.mark.skipif(library.function is None, reason=reason))


# The decode kernels' cache dtypes: bf16 (AVX-512 BF16) and float32 (AVX2), each run where it loads.
KERNEL_CACHE_DTYPES = [with_kernel(torch.bfloat16), with_kernel(torch.float32)]
# Tests of the AMX decode kernel over a float32 cache run where it loads.
needs_amx_attention = pytest.mark.skipif(
    load_amx_kernel().function is None, reason=f"AMX decode kernel unavailable: {load_amx_kernel().reason}"
)
needs_tiles = pytest.mark.skipif(
    load_tile_kernel().function is None, reason=f"AMX kernel unavailable: {load_tile_kernel().reason}"
)


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


def with_plan_attention(model):
    """`model` switched to the kernel plan's attention for its dtype on a CPU, which reads KV
    patterns (a model built here starts on transformers' own SDPA)."""
    apply_attention(model, choose_attention(model.dtype, "cpu"))
    return model


def assert_greedy_ssd_lossless(model, skipped=(1, 2), gammas=(1, 3, 5), new_tokens: int = 40) -> None:
    """Greedy SSD of `model` (its layers `skipped` in the draft) equals its autoregressive decoding
    token for token at every γ of `gammas`: what a kernel of the plan must keep."""
    from skipsearch.engine import autoregressive_decode, speculative_decode
    from skipsearch.masks import SkipMask
    from skipsearch.models.runner import LayerwiseRunner

    runner = LayerwiseRunner(model)
    prompt = [5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12, 7]
    expected = autoregressive_decode(runner, prompt, new_tokens).tokens
    mask = SkipMask.from_layers(runner.num_layers, list(skipped))
    for gamma in gammas:
        assert speculative_decode(runner, prompt, mask, new_tokens, gamma=gamma).tokens == expected, gamma


def random_reference(runner, lengths, new_tokens: int, seed: int = 3, with_kv: bool = True):
    """A ReferenceCache of seeded random prompts (ids 3..60) of `lengths` and their continuations."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [
        EncodedPrompt(f"p{i}", tuple(torch.randint(3, 61, (n,), generator=generator).tolist()))
        for i, n in enumerate(lengths)
    ]
    return build_reference(runner, prompts, new_tokens=new_tokens, with_kv=with_kv)


def eight_token_model():
    """A 3-layer, 8-token model whose skipped-layer draft differs a lot from the target at T = 3:
    small enough that chi-square tests over its output distribution take seconds."""
    return tiny_model(
        "llama",
        layers=3,
        seed=2,
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.1,
    )


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


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE, bos: bool = False) -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE (any text encodes) trained here, so tests need no download.

    A normalizer deletes `#`, so a prompt of only `#` encodes to zero tokens.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace("#", "")
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["def add(a, b):\n    return a + b\n", "Write a poem about the sea."], trainer
    )
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", chat_template=chat_template)


def tiny_gguf(path, layers: int = 8, hidden: int = 64, ffn: int = 96, vocab: int = 40, seed: int = 0):
    """A small llama GGUF written with the gguf package, shaped as SmolLM2's is: Q4_1 layer weights,
    F32 norms (and attention biases, as Qwen2 has), a Q8_0 embedding, a gpt2 tokenizer's metadata."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(["t 1", "t 2"])
    writer.add_eos_token_id(1)

    def add(name: str, shape: tuple[int, ...], kind=gguf.GGMLQuantizationType.Q4_1) -> None:
        values = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1 or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    add("token_embd.weight", (vocab, hidden), gguf.GGMLQuantizationType.Q8_0)
    for layer in range(layers):
        add(f"blk.{layer}.attn_norm.weight", (hidden,))
        for part, rows in (("q", hidden), ("k", hidden // 2), ("v", hidden // 2), ("output", hidden)):
            add(f"blk.{layer}.attn_{part}.weight", (rows, hidden))
        add(f"blk.{layer}.attn_q.bias", (hidden,))
        add(f"blk.{layer}.ffn_norm.weight", (hidden,))
        add(f"blk.{layer}.ffn_gate.weight", (ffn, hidden))
        add(f"blk.{layer}.ffn_up.weight", (ffn, hidden))
        add(f"blk.{layer}.ffn_down.weight", (hidden, ffn))
    add("output_norm.weight", (hidden,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
