"""What a loaded model runs on the CPU backend, read off its modules: the kernels of a step
(`plan_kernels`, recorded in every LatencyProfile so one of another plan is noticed) and the
bytes a step must read (`step_bytes`, the physical floor of a decode step).
"""

from __future__ import annotations

from typing import Any

from skipsearch.cpu.attention_paths import kv_cache_dtype
from skipsearch.cpu.bf16_weights import TILES, Bf16WeightLinear
from skipsearch.cpu.fused_layers import fused_layer
from skipsearch.cpu.packed import PackedLinear
from skipsearch.cpu.rms_norm import KernelRMSNorm
from skipsearch.cpu.rotary import runs_kernel_rotary


def step_bytes(model: Any) -> tuple[int, int]:
    """(weight bytes, K/V bytes per cached position) that one decode step must read.

    Every weight matrix is read once per step except the input embedding, of which a step reads one
    row per position — unless the LM head is tied to it and reads it whole. A packed matrix
    (`cpu.packed`, `cpu.bf16_weights`) is read in its packed copy; a tied head's plain copy
    then serves only the lookup. The K/V of every cached position is read in every layer, in the
    cache's dtype (float32 beside fp32 attention).
    """
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    read = {id(parameter): parameter for parameter in model.parameters() if parameter is not embedding}
    for module in model.modules():
        if isinstance(module, PackedLinear):
            read.pop(id(module.plain), None)
        if isinstance(module, PackedLinear | Bf16WeightLinear):
            read[id(module.packed)] = module.packed
    if not isinstance(head, PackedLinear | Bf16WeightLinear) and head.weight is embedding:
        read[id(embedding)] = embedding
    weights = sum(tensor.numel() * tensor.element_size() for tensor in read.values())
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_dtype = kv_cache_dtype(config)
    kv_element = kv_dtype.itemsize if kv_dtype is not None else embedding.element_size()
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * kv_element
    return weights, per_position


def plan_kernels(model: Any) -> dict[str, str]:
    """The kernels a step of `model` runs, in the keys a LatencyProfile records them under: the
    attention path and the dtype of the K/V it reads, the linear layers' product (`bf16-kernel`,
    its AMX build `amx-kernel`, `onednn` or `torch`), the norms' and the rotary embedding's
    (`kernel` or `torch`), and whether short blocks run the fused decoder layers (`fused-c`: their C
    driver, `cpu.fused_layers`) or the modules. A LatencyProfile of
    other kernels prices another plan (`LatencyProfile.warn_other_plan`)."""
    modules = list(model.modules())
    kernels = {module.kernel for module in modules if isinstance(module, Bf16WeightLinear)}
    if kernels:
        products = "amx-kernel" if TILES in kernels else "bf16-kernel"
    elif any(isinstance(module, PackedLinear) for module in modules):
        products = "onednn"
    else:
        products = "torch"
    kv = kv_cache_dtype(model.config)
    return {
        "attention": str(model.config._attn_implementation),
        # The same attention path timed over another cache's dtype (the AMX kernel's first version
        # read a float32 one) streams other bytes: a profile says which it timed.
        "kv_cache": "projections" if kv is None else str(kv).removeprefix("torch."),
        "products": products,
        "norms": "kernel" if any(isinstance(module, KernelRMSNorm) for module in modules) else "torch",
        "rotary": "kernel" if runs_kernel_rotary(model) else "torch",
        "layers": "fused-c" if any(fused_layer(block) for block in model.model.layers) else "modules",
    }
