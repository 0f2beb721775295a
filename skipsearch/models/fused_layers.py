"""The fallback plan's decoder sub-layers in a few kernel calls each, for the short blocks of a
decode (docs/theory.md, "The kernel plan").

Why it exists: on the project's Zen 3 CPU a SmolLM2 decode step took 24-28 ms, of which the
products' kernel took 11-12: the other half was transformers' attention and MLP modules calling
~50 torch operations a layer, each a dispatch of a few microseconds on vectors of a few hundred
floats, plus the Python around them (results/profile/step_anatomy-smollm2-135m-float32-avx2-rotary.md).
For blocks of up to `MAX_ROWS` positions (a decode step, a draft step, a verify) a fused layer runs
- its attention sub-layer as the norm kernel, one product for q, k and v (their packed weights
  become one buffer, each module's a view of it), the rotary kernel writing the keys straight into
  the K/V cache, the value rows copied beside them, the decode-attention kernel (with a draft's KV
  pattern and pillars, or recording a verify's pillar scores) and the output product;
- its MLP as the norm kernel, one product for gate and up, the module's own activation and product
  in torch, and the down product.

Every output goes through the same kernels and the same operations in the same order as the
modules' path on this plan: a fused q/k/v product gives each output the bits its own product gave,
and the rotary kernel is transformers' bits. So the logits are the modules' bits exactly (tested),
and choosing this path changes no result, only the time. Longer blocks (prefills, the estimator's
teacher-forced passes), a caller's own attention mask, sliding-window layers and inputs the kernels
do not take run the modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralMLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2MLP

from skipsearch.masks import KVPattern
from skipsearch.models import bf16_weights, native_attention, rms_norm, rotary
from skipsearch.models.attention import KERNEL_FP32_ATTENTION
from skipsearch.models.bf16_weights import Bf16WeightLinear
from skipsearch.models.cache import GrowingLayer
from skipsearch.models.pillars import PillarChoice, PillarKeys
from skipsearch.models.rms_norm import KernelRMSNorm

# The supported families' sub-layers: q/k/v/o projections (Qwen2's with biases), a gated MLP.
ATTENTIONS = (LlamaAttention, MistralAttention, Qwen2Attention)
MLPS = (LlamaMLP, MistralMLP, Qwen2MLP)
MAX_ROWS = native_attention.MAX_QUERIES  # the decode kernel's longest block (the products' is longer)
ATTRIBUTE = "fused"  # where a decoder layer keeps its FusedLayer


def _fuse(projections: list[Bf16WeightLinear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One packed buffer for `projections` (same inputs, even output counts), each module's
    `packed` becoming a view of its part, and their biases as one (zeros where one has none)."""
    fused = torch.cat([projection.packed for projection in projections])
    start = 0
    for projection in projections:
        blocks = projection.packed.shape[0]
        projection.packed = fused[start : start + blocks]
        start += blocks
    biases = [projection.bias for projection in projections]
    if all(bias is None for bias in biases):
        return fused, None
    return fused, torch.cat(
        [
            bias if bias is not None else torch.zeros(p.out_features)
            for bias, p in zip(biases, projections, strict=True)
        ]
    )


class FusedLayer:
    """One decoder layer's sub-layers on the kernels (module docstring). Built by `fuse_layers`;
    it holds the layer's modules and the fused weights, and no state of its own."""

    def __init__(self, block: nn.Module) -> None:
        attention, mlp = block.self_attn, block.mlp
        self.layer = attention.layer_idx
        self.heads = attention.config.num_attention_heads
        self.kv_heads = attention.config.num_key_value_heads
        self.dim = attention.head_dim
        self.scale = float(attention.scaling)
        self.q_width, self.kv_width = self.heads * self.dim, self.kv_heads * self.dim
        self.intermediate = mlp.gate_proj.out_features
        self.input_norm, self.mlp_norm = block.input_layernorm, block.post_attention_layernorm
        self.o_proj, self.down_proj, self.activation = attention.o_proj, mlp.down_proj, mlp.act_fn
        self.qkv, self.qkv_bias = _fuse([attention.q_proj, attention.k_proj, attention.v_proj])
        self.gate_up, self.gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])

    @staticmethod
    def fits(block: nn.Module) -> bool:
        """Whether `block` is a layer this path computes exactly as its modules do: a supported
        family's full-attention layer whose products, norms and activation are the plan's."""
        attention, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
        if type(attention) not in ATTENTIONS or type(mlp) not in MLPS:
            return False
        projections = [getattr(attention, f"{name}_proj") for name in "qkvo"]
        projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        return (
            all(
                type(p) is Bf16WeightLinear and p.out_features % bf16_weights.OUT_BLOCK == 0
                for p in projections
            )
            and all(type(n) is KernelRMSNorm for n in (block.input_layernorm, block.post_attention_layernorm))
            and not getattr(attention, "sliding_window", None)  # Qwen2's sliding layers
            and not (type(attention) is MistralAttention and attention.config.sliding_window)
            and attention.head_dim % 16 == 0
            and attention.config._attn_implementation == KERNEL_FP32_ATTENTION
        )

    def takes(self, hidden: torch.Tensor, cache: Any, choice: PillarChoice | None) -> bool:
        """Whether this pass's attention runs here: a short block of one sequence over this layer's
        in-place float32 cache, its pillars (if it records them) chosen by one row."""
        layer = cache.layers[self.layer] if cache is not None else None
        return (
            self.takes_rows(hidden)
            and type(layer) is GrowingLayer
            and layer.is_initialized
            and layer.buffers[0].dtype is torch.float32
            and (choice is None or choice.rows == 1)
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

    @staticmethod
    def _product(
        hidden: torch.Tensor, packed: torch.Tensor, out: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """`hidden` `[1, M, in]` times packed weights: `bf16_weights.multiply`, looked up per call
        (the products' one entry point, which `experiments/step_anatomy.py` traces)."""
        function = bf16_weights.load_kernel().function
        return bf16_weights.multiply(function, hidden, hidden.shape[1], packed, out, bias)

    def attention(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: Any,
        kv: KVPattern | PillarKeys | None = None,
        choice: PillarChoice | None = None,
    ) -> torch.Tensor:
        """Residual + self-attention of `hidden` `[1, M, E]` (`takes`), appending its K/V to `cache`,
        over the keys of `kv` when given; `choice` records the layer's pillar scores."""
        rows = hidden.shape[1]
        qkv = self._product(
            self.input_norm.on_kernel(rms_norm.load_kernel().function, hidden),
            self.qkv,
            self.q_width + 2 * self.kv_width,
            self.qkv_bias,
        )
        layer: GrowingLayer = cache.layers[self.layer]
        start = layer.claim(rows)
        keys, values = layer.buffers
        capacity = keys.shape[2]
        query = torch.empty((1, rows, self.heads, self.dim))
        cos, sin = (table.contiguous() for table in position_embeddings)
        width = qkv.shape[-1]
        rotary.load_kernel().function(
            qkv.data_ptr(), self.heads, self.dim, width, query.data_ptr(), self.dim, self.q_width,
            qkv.data_ptr() + 4 * self.q_width, self.kv_heads, self.dim, width,
            keys.data_ptr() + 4 * start * self.dim, capacity * self.dim, self.dim,
            rows, self.dim, cos.data_ptr(), sin.data_ptr(),
        )  # fmt: skip
        values[0, :, start : start + rows] = (
            qkv[0, :, self.q_width + self.kv_width :].view(rows, self.kv_heads, self.dim).transpose(0, 1)
        )
        pattern, pillars = (kv.pattern, kv.of_layer(self.layer)) if isinstance(kv, PillarKeys) else (kv, None)
        sink, window = (pattern.sink, pattern.window) if pattern is not None else (0, 0)
        scores = None
        if choice is not None:
            scores = torch.full((self.heads, layer.length), float("-inf"))
        out = native_attention.decode_attention(
            query.transpose(1, 2), layer.keys, layer.values, self.scale, sink, window, pillars, scores
        )
        if out is None:
            raise RuntimeError(f"the decode kernel refused layer {self.layer}'s {rows}-row block")
        if choice is not None:
            choice.record(self.layer, scores[None, :, None])
        o_proj = self.o_proj
        return hidden + self._product(
            out.view(1, rows, self.q_width), o_proj.packed, o_proj.out_features, o_proj.bias
        )

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Residual + MLP of `hidden` `[1, M, E]` (`takes_rows`)."""
        gate_up = self._product(
            self.mlp_norm.on_kernel(rms_norm.load_kernel().function, hidden),
            self.gate_up,
            2 * self.intermediate,
            self.gate_up_bias,
        )
        act = self.activation(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :]
        down = self.down_proj
        return hidden + self._product(act, down.packed, down.out_features, down.bias)


def fuse_layers(model: nn.Module) -> int:
    """Give every decoder layer of `model` that `FusedLayer.fits` its fused path (under
    `ATTRIBUTE`); returns how many (0 where a kernel is not built for this CPU)."""
    if not all(
        kernel.function is not None
        for kernel in (
            bf16_weights.load_kernel(),
            rms_norm.load_kernel(),
            rotary.load_kernel(),
            native_attention.load_kernel(torch.float32),
        )
    ):
        return 0
    fused = 0
    for block in getattr(getattr(model, "model", None), "layers", []):
        if getattr(block, ATTRIBUTE, None) is None and FusedLayer.fits(block):
            setattr(block, ATTRIBUTE, FusedLayer(block))
            fused += 1
    return fused


def fused_layer(block: nn.Module) -> FusedLayer | None:
    """`block`'s fused path, where `fuse_layers` gave it one."""
    return getattr(block, ATTRIBUTE, None)
