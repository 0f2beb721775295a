"""The C driver of a fused decoder layer (`decoder_layer.c`; docs/cpu-backend.md) and `FusedLayer`,
one layer's sub-layers on it at the plan's bf16 weights, for the short blocks of a decode.

Why it exists: on an AVX2-only CPU a SmolLM2 decode step took 24-28 ms, of which the products'
kernel took 11-12: the other half was transformers' attention and MLP modules calling ~50 torch
operations a layer, each a dispatch of a few microseconds on vectors of a few hundred floats, plus
the Python around them (docs/cpu-backend.md, "Where a step's time goes"). Driving the kernels from
Python instead still cost ~130 us a layer (4 ms of a 21 ms step on a CPU with AMX) in the torch
operations between them. For blocks of up to `MAX_ROWS` positions (a decode step, a draft step, a
verify) a fused layer runs
- its attention sub-layer as one call of the C driver: the norm kernel, one product for q, k and v
  (their packed weights become one buffer, each module's a view of it), the rotary kernel writing
  the keys straight into the K/V cache, the value rows copied beside them, the decode-attention
  kernel (with a draft's KV pattern and pillars, or recording a verify's pillar scores), the output
  product and the residual sum;
- its MLP as another: the norm kernel, one product for gate and up, the SiLU kernel
  (`cpu.silu`, which the modules' path runs too) times up, the down product, the residual sum.

Every output goes through the same kernels and the same operations in the same order as the
modules' path on this plan: a fused q/k/v product gives each output the bits its own product gave,
and the rotary kernel is transformers' bits. So the logits are the modules' bits exactly (tested),
and choosing this path changes no result, only the time. Longer blocks (prefills, the estimator's
teacher-forced passes), a caller's own attention mask, sliding-window layers and inputs the kernels
do not take run the modules. A token tree's passes run here too: the decode-attention kernel reads
each row's ancestors (`kv.tree_keys`) in place of causality.

`cpu.fused_layers` gives a model's blocks their `FusedLayer` and builds a draft's int8/int4 layers
on the same driver.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralMLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2MLP

from skipsearch.cpu import bf16_weights, decode_attention, rms_norm, rotary, silu
from skipsearch.cpu.attention_paths import DECODE_KERNEL_FP32_PATHS, KERNEL_AMX_ATTENTION, kv_cache_dtype
from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native
from skipsearch.cpu.rms_norm import KernelRMSNorm
from skipsearch.cpu.silu import KernelSiLU
from skipsearch.kv.pillars import PillarChoice, PillarKeys
from skipsearch.kv.plan_kv import GrowingLayer
from skipsearch.kv.tree_keys import TreeKeys
from skipsearch.masks import KVPattern

# The supported families' sub-layers: q/k/v/o projections (Qwen2's with biases), a gated MLP.
ATTENTIONS = (LlamaAttention, MistralAttention, Qwen2Attention)
MLPS = (LlamaMLP, MistralMLP, Qwen2MLP)
MAX_ROWS = decode_attention.MAX_QUERIES  # the decode kernel's longest block (the products' is longer)
_POINTER, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class DriverLayer(ctypes.Structure):
    """decoder_layer.c's `Layer`: the kernels' function pointers and one layer's shapes and weights."""

    _fields_ = [
        *((name, _POINTER) for name in ("linear", "norm", "rotary", "attention", "silu")),
        *((name, _INT) for name in ("hidden", "heads", "kv_heads", "dim", "intermediate")),
        *((name, _FLOAT) for name in ("scale", "input_eps", "mlp_eps")),
        *((name, _POINTER) for name in ("input_norm", "mlp_norm", "qkv", "o", "gate_up", "down")),
        *((name, _POINTER) for name in ("qkv_bias", "o_bias", "gate_up_bias", "down_bias")),
        ("product_seconds", ctypes.POINTER(ctypes.c_double)),
        *((name, _INT) for name in ("bits", "group")),  # bits 0: bf16 (`linear`); 8, 4: `linear_int`
        ("linear_int", _POINTER),
        *((name, _POINTER) for name in ("qkv_aux", "o_aux", "gate_up_aux", "down_aux")),
    ]


class DriverAttend(ctypes.Structure):
    """decoder_layer.c's `Attend`: one attention call's cache and keys."""

    _fields_ = [
        ("keys", _POINTER),
        ("values", _POINTER),
        *((name, _INT) for name in ("capacity", "start", "sink", "window", "extra", "bf16")),
        *((name, _POINTER) for name in ("cos", "sin", "extra_keys", "extra_values", "scores", "tree")),
        ("tree_base", _INT),
    ]


DRIVER = KernelSource(
    path=Path(__file__).with_name("decoder_layer.c"),
    symbol="layer_attention",
    signature=(ctypes.POINTER(DriverLayer), ctypes.POINTER(DriverAttend), _POINTER, _INT, _POINTER),
    needed_flags=("avx2",),
    # The residual sums and the activation's product rounded one by one, as torch rounds them.
    compiler_flags=("-O3", "-mavx2", "-ffp-contract=off", "-shared", "-fPIC"),
)


@functools.cache
def load_driver() -> NativeLibrary:
    """The C driver (`layer_attention`; `layer_mlp` through its `handle`), compiled once per source,
    compiler and compiler flags."""
    library = load_native(DRIVER)
    if library.handle is not None:
        library.handle.layer_mlp.restype = ctypes.c_int
        library.handle.layer_mlp.argtypes = (ctypes.POINTER(DriverLayer), _POINTER, _INT, _POINTER)
    return library


def function_address(library: NativeLibrary) -> int | None:
    """The C address of a loaded kernel's function."""
    return ctypes.cast(library.function, ctypes.c_void_p).value


def data_pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _fuse(projections: list[Bf16WeightLinear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One packed buffer for `projections` (same inputs, even output counts), each module's
    `packed` becoming a view of its part, and their biases as one (zeros where one has none)."""
    fused = torch.cat([projection.packed for projection in projections])
    start = 0
    for projection in projections:
        blocks = projection.packed.shape[0]
        projection.packed = fused[start : start + blocks]
        start += blocks
    return fused, joined_bias(projections)


def joined_bias(projections: list[nn.Module]) -> torch.Tensor | None:
    """The biases of `projections` fused into one product, as one float32 vector (zeros where one
    has none; None where none has one)."""
    biases = [projection.bias for projection in projections]
    if all(bias is None for bias in biases):
        return None
    return torch.cat(
        [
            bias.float() if bias is not None else torch.zeros(p.out_features)
            for bias, p in zip(biases, projections, strict=True)
        ]
    )


def attention_library(config: Any) -> NativeLibrary:
    """The decode-attention kernel of float32 activations that the model's plan runs (AVX2 over a
    float32 cache, or AMX over a bf16 one)."""
    if config._attn_implementation == KERNEL_AMX_ATTENTION:
        return decode_attention.load_amx_kernel()
    return decode_attention.load_kernel(torch.float32)


class FusedLayer:
    """One decoder layer's sub-layers on the C driver (module docstring). Built by `fuse_layers`;
    it holds the fused weights and the driver's `Layer`, which points into them and into the
    block's own modules (which outlive it: it lives on the block), and no state of its own."""

    def __init__(self, block: nn.Module) -> None:
        attention, mlp = block.self_attn, block.mlp
        self.layer = attention.layer_idx
        self.kv_dtype = kv_cache_dtype(attention.config)  # float32, or bf16 beside the AMX kernel
        self.qkv, self.qkv_bias = _fuse([attention.q_proj, attention.k_proj, attention.v_proj])
        self.gate_up, self.gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
        config, o_proj, down_proj = attention.config, attention.o_proj, mlp.down_proj
        norms = block.input_layernorm, block.post_attention_layernorm
        self.spec = DriverLayer(
            function_address(bf16_weights.kernel_library(o_proj.kernel)),
            function_address(rms_norm.load_kernel()), function_address(rotary.load_kernel()),
            function_address(attention_library(config)), function_address(silu.load_kernel()),
            o_proj.out_features, config.num_attention_heads, config.num_key_value_heads, attention.head_dim,
            mlp.gate_proj.out_features,
            float(attention.scaling), norms[0].variance_epsilon, norms[1].variance_epsilon,
            norms[0].weight.data_ptr(), norms[1].weight.data_ptr(),
            self.qkv.data_ptr(), o_proj.packed.data_ptr(), self.gate_up.data_ptr(),
            down_proj.packed.data_ptr(), data_pointer(self.qkv_bias), data_pointer(o_proj.bias),
            data_pointer(self.gate_up_bias), data_pointer(down_proj.bias), None,
        )  # fmt: skip

    @staticmethod
    def fits(block: nn.Module) -> bool:
        """Whether `block` is a layer this path computes exactly as its modules do: a supported
        family's full-attention layer whose products, norms and activation are the plan's."""
        attention, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
        if type(attention) not in ATTENTIONS or type(mlp) not in MLPS:
            return False
        projections = [getattr(attention, f"{name}_proj") for name in "qkvo"]
        projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        kernels = {getattr(p, "kernel", None) for p in projections}
        return (
            all(type(p) is Bf16WeightLinear for p in projections)
            and len(kernels) == 1  # one product function for the layer
            and all(p.out_features % bf16_weights.out_block(p.kernel) == 0 for p in projections)
            and bf16_weights.kernel_library(projections[0].kernel).function is not None
            and all(type(n) is KernelRMSNorm for n in (block.input_layernorm, block.post_attention_layernorm))
            and type(mlp.act_fn) is KernelSiLU
            and not getattr(attention, "sliding_window", None)  # Qwen2's sliding layers
            and not (type(attention) is MistralAttention and attention.config.sliding_window)
            and attention.head_dim % 16 == 0
            and attention.config._attn_implementation in DECODE_KERNEL_FP32_PATHS
            and attention_library(attention.config).function is not None
            and (
                attention.head_dim % 32 == 0 or attention.config._attn_implementation != KERNEL_AMX_ATTENTION
            )
        )

    def takes(
        self, hidden: torch.Tensor, cache: Any, choice: PillarChoice | None, tree: TreeKeys | None = None
    ) -> bool:
        """Whether this pass's attention runs here: a short block of one sequence over this layer's
        in-place cache in the plan's dtype, its pillars (if it records them) chosen by one row, and a
        token tree's rows (`tree`) only over a float32 cache (the AMX kernel does not read them)."""
        layer = cache.layers[self.layer] if cache is not None else None
        return (
            self.takes_rows(hidden)
            and type(layer) is GrowingLayer
            and layer.is_initialized
            and layer.buffers[0].dtype is self.kv_dtype
            and (choice is None or choice.rows == 1)
            and (tree is None or (self.kv_dtype is torch.float32 and tree.rows == hidden.shape[1]))
        )

    @staticmethod
    def takes_rows(hidden: torch.Tensor) -> bool:
        """Whether the MLP runs here: one sequence of up to `MAX_ROWS` contiguous float32 rows."""
        return (
            hidden.dtype is torch.float32
            and hidden.dim() == 3
            and hidden.shape[0] == 1
            and hidden.shape[1] <= MAX_ROWS
            and hidden.is_contiguous()
        )

    def time_products(self, seconds: ctypes.c_double | None) -> None:
        """Add the wall time of this layer's product calls to `seconds` from now on (None: stop)."""
        self.spec.product_seconds = None if seconds is None else ctypes.pointer(seconds)

    def attention(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: Any,
        kv: KVPattern | PillarKeys | None = None,
        choice: PillarChoice | None = None,
        tree: TreeKeys | None = None,
    ) -> torch.Tensor:
        """Residual + self-attention of `hidden` `[1, M, E]` (`takes`), appending its K/V to `cache`,
        over the keys of `kv` when given and of a token tree's rows (`tree`); `choice` records the
        layer's pillar scores."""
        rows = hidden.shape[1]
        layer: GrowingLayer = cache.layers[self.layer]
        start = layer.claim(rows)
        keys, values = layer.buffers
        cos, sin = (table.contiguous() for table in position_embeddings)
        pattern, pillars = (kv.pattern, kv.of_layer(self.layer)) if isinstance(kv, PillarKeys) else (kv, None)
        scores = torch.full((self.spec.heads, start + rows), float("-inf")) if choice is not None else None
        call = DriverAttend(
            keys.data_ptr(), values.data_ptr(), keys.shape[2], start,
            pattern.sink if pattern is not None else 0, pattern.window if pattern is not None else 0,
            0 if pillars is None else pillars[0].shape[2], keys.dtype is torch.bfloat16,
            cos.data_ptr(), sin.data_ptr(),
            None if pillars is None else pillars[0].data_ptr(),
            None if pillars is None else pillars[1].data_ptr(), data_pointer(scores),
            None if tree is None else tree.bits.data_ptr(), 0 if tree is None else tree.base,
        )  # fmt: skip
        out = torch.empty_like(hidden)
        if load_driver().function(self.spec, call, hidden.data_ptr(), rows, out.data_ptr()):
            raise RuntimeError(f"the fused path refused layer {self.layer}'s {rows}-row block")
        if choice is not None:
            choice.record(self.layer, scores[None, :, None])
        return out

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Residual + MLP of `hidden` `[1, M, E]` (`takes_rows`)."""
        out = torch.empty_like(hidden)
        if load_driver().handle.layer_mlp(self.spec, hidden.data_ptr(), hidden.shape[1], out.data_ptr()):
            raise RuntimeError(f"the fused path refused layer {self.layer}'s MLP")
        return out
