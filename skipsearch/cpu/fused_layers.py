"""Fused decoder layers on a model (docs/cpu-backend.md): each block's bf16 `FusedLayer` on the C
driver (`cpu.fused_driver`, which says why the path exists and why it is the modules' bits), and a
draft's layers at int8 or int4 on the same driver.

`LayerwiseRunner` (the engine, the estimator) calls the fused sub-layers itself. A whole-model
forward (transformers' `generate`, the comparison every decode reports) calls the decoder layers,
so `fuse_layers` also gives each fused block a forward that takes the same path for the blocks
the runner would fuse: HF's decode steps then run the plan's driver too, and an `HF generate`
figure compares decoding loops, not one loop on the driver against one on the modules.

Lower-precision drafts (`lower_precision_layer`, `LowerPrecisionLayer`): the same driver runs a
layer's sub-layers with the four products' weights at int8 or int4 (`linear_rows_int.c`), from a
quantized copy of the block's bf16 weights that the layer holds; everything else is the bf16 path's.
Through the modules each int product cost ~6 us of Python (SmolLM2: 120 products a step, ~0.8 ms
against ~1.6 ms of int4 weights to read), so a draft step could not reach its bytes' ratio; inside
the driver it pays none. The runner calls such a layer's `.attention` / `.mlp` in place of the bf16
ones for a draft's layers; the block's own `FusedLayer` stays the full model's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from skipsearch.cpu import bf16_weights, decode_attention, int_linear, rms_norm, rotary, silu
from skipsearch.cpu.attention_paths import kv_cache_dtype
from skipsearch.cpu.fused_driver import (
    DriverLayer,
    FusedLayer,
    attention_library,
    data_pointer,
    function_address,
    joined_bias,
    load_driver,
)
from skipsearch.cpu.int_weights import (
    GROUPS,
    Int4Weight,
    Int8Weight,
    common_group,
    quantize_int4,
    quantize_int8,
)

ATTRIBUTE = "fused"  # where a decoder layer keeps its FusedLayer


def fuse_layers(model: nn.Module) -> int:
    """Give every decoder layer of `model` that `FusedLayer.fits` its fused path (under
    `ATTRIBUTE`); returns how many (0 where a kernel is not built for this CPU)."""
    if not all(
        kernel.function is not None
        for kernel in (
            bf16_weights.load_kernel(),
            rms_norm.load_kernel(),
            rotary.load_kernel(),
            decode_attention.load_kernel(torch.float32),
            silu.load_kernel(),
            load_driver(),
        )
    ):
        return 0
    fused = 0
    for block in getattr(getattr(model, "model", None), "layers", []):
        if getattr(block, ATTRIBUTE, None) is None and FusedLayer.fits(block):
            layer = FusedLayer(block)
            setattr(block, ATTRIBUTE, layer)
            block.forward = _fused_forward(layer, block.forward)
            fused += 1
    return fused


def _fused_forward(layer: FusedLayer, modules: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A decoder layer's forward (transformers' signature) that runs `layer` where the runner
    would (`FusedLayer.takes`, no extra keywords: a KV pattern, pillars or attention outputs go to
    the modules) and the block's own forward, `modules`, otherwise. The causal mask is not read,
    as the modules' decode kernel does not read it either (`models.attention`)."""

    def forward(
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if position_embeddings is not None and not kwargs and layer.takes(hidden_states, cache, None):
            return layer.mlp(layer.attention(hidden_states, position_embeddings, cache))
        return modules(
            hidden_states, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            use_cache=use_cache, position_embeddings=position_embeddings, **kwargs,
        )  # fmt: skip

    return forward


def fused_layer(block: nn.Module) -> FusedLayer | None:
    """`block`'s fused path, where `fuse_layers` gave it one."""
    return getattr(block, ATTRIBUTE, None)


# ---- lower-precision drafts: the same sub-layers with the products' weights at int8 or int4 ----

ATTENTION, MLP = "attention", "mlp"  # the sub-layers a lower-precision layer may hold
PARTS = (ATTENTION, MLP)
_KINDS = {8: int_linear.INT8, 4: int_linear.INT4}
# the driver's products at lower precision: (owner, projections fused into one product)
PRODUCTS = {
    "qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "o": ("self_attn", ("o_proj",)),
    "gate_up": ("mlp", ("gate_proj", "up_proj")),
    "down": ("mlp", ("down_proj",)),
}
_PART_OF = {"self_attn": ATTENTION, "mlp": MLP}
Quantized = Mapping[str, Int8Weight | Int4Weight]  # projection name ("q_proj", ...) -> its quantized weight


def _given_refusal(
    block: nn.Module, bits: int, group: int | None, parts: tuple[str, ...], given: Quantized
) -> str | None:
    """Why `given` quantized weights do not fit `block`'s `parts` at `bits` (None where they do)."""
    kind = Int8Weight if bits == 8 else Int4Weight
    for owner, names in PRODUCTS.values():
        if _PART_OF[owner] not in parts:
            continue
        for name in names:
            weight, projection = given.get(name), getattr(getattr(block, owner), name)
            if type(weight) is not kind:
                return f"no int{bits} weight given for {name}"
            if tuple(weight.q.shape) != (projection.out_features, projection.in_features):
                return f"the weight given for {name} is {tuple(weight.q.shape)}, not the projection's"
    groups = {weight.group for weight in given.values() if isinstance(weight, Int4Weight)}
    if bits == 4 and (len(groups) != 1 or (group is not None and groups != {group})):
        return f"a layer's int4 weights share one group size, not {sorted(groups)}"
    return None


def _inputs(block: nn.Module, parts: tuple[str, ...]) -> list[int]:
    """The input widths of the products of `block`'s `parts`."""
    attention, mlp = block.self_attn, block.mlp
    widths = [attention.q_proj.in_features, attention.o_proj.in_features] if ATTENTION in parts else []
    return widths + ([mlp.gate_proj.in_features, mlp.down_proj.in_features] if MLP in parts else [])


def lower_precision_refusal(
    block: nn.Module,
    bits: int,
    group: int | None = None,
    parts: tuple[str, ...] = PARTS,
    width: int | None = None,
    quantized: Quantized | None = None,
) -> str | None:
    """Why `lower_precision_layer` gives `block` no layer at `bits` (None where it gives one)."""
    if bits not in _KINDS:
        raise ValueError(f"lower-precision layers are int8 or int4, not {bits} bits")
    if not parts or not set(parts) <= set(PARTS):
        raise ValueError(f"parts are some of {PARTS}, not {parts}")
    if not FusedLayer.fits(block):
        return "not a layer the bf16 fused path computes (FusedLayer.fits)"
    found = int_linear.builds(_KINDS[bits])
    if not found or (width is not None and width not in found):
        return (
            f"no build of the {_KINDS[bits]} kernel{f' of width {width}' if width else ''} loads on this CPU"
        )
    if load_driver().function is None:
        return f"the fused driver does not load: {load_driver().reason}"
    inputs = _inputs(block, parts)
    if quantized is not None:
        refusal = _given_refusal(block, bits, group, parts, quantized)
        if refusal is not None:
            return refusal
        group = next((w.group for w in quantized.values() if isinstance(w, Int4Weight)), group)
    if bits == 8 and any(n % 8 for n in inputs):
        return f"int8 products take inputs in multiples of 8, not {inputs}"
    if bits == 4 and common_group(inputs, group) is None:
        wanted = f"groups of {group}" if group is not None else f"any group size of {GROUPS}"
        return f"int4 inputs {inputs} are not whole {wanted}"
    return None


class LowerPrecisionLayer(FusedLayer):
    """A decoder layer's sub-layers on the C driver with the products' weights at int8 or int4
    (`linear_rows_int.c`): the bf16 fused path's norms, rotary, decode-attention kernel, K/V cache
    writes and residual sums, in the same order, with only the four products changed (q/k/v fused
    into one product as the bf16 path's are, o, gate/up fused, down). `lower_precision_layer` builds
    one; `.attention` and `.mlp` take `FusedLayer`'s arguments (and `.takes`, `.takes_rows` say
    when they run, as `FusedLayer`'s do).

    The weights are quantized from the block's bf16 products (their float32 values, exactly) by
    `cpu.int_weights` (int8 per output channel; int4 in groups of `group` inputs), or are the
    `quantized` ones given (by projection name: a draft's cached copies), packed for the `width`
    build; the biases stay float32. The layer holds its own copy (`packed_bytes`) and the
    block's norms' weights, and changes nothing on the block: its bf16 `FusedLayer`, if any, runs as
    before. Each product's outputs are the bits of `Int8Linear`/`Int4Linear` on the same weights
    (each output is its own accumulator, whichever product it is fused in), so a sub-layer is the
    bits of the block's modules with those projections (tested), and a verify's rows are the draft
    steps' bits whatever the row count. A sub-layer not in `parts` is not held: calling it raises.
    Keep the layer for the model's life, as its weights are: a helper on a busy core
    (`cpu.shared_core`) late for a piece may read its weights until the decode disengages.
    """

    def __init__(
        self,
        block: nn.Module,
        bits: int,
        group: int | None = None,
        parts: tuple[str, ...] = PARTS,
        width: int | None = None,
        quantized: Quantized | None = None,
    ) -> None:
        refusal = lower_precision_refusal(block, bits, group, parts, width, quantized)
        if refusal is not None:
            raise ValueError(f"no int{bits} fused layer: {refusal}")
        if quantized is not None and bits == 4:
            group = next(w.group for w in quantized.values() if isinstance(w, Int4Weight))
        attention, mlp = block.self_attn, block.mlp
        kind = _KINDS[bits]
        self.width = width or next(iter(int_linear.builds(kind)))  # the build it runs: 16 or 8
        self.bits, self.parts = bits, tuple(part for part in PARTS if part in parts)
        self.group = common_group(_inputs(block, parts), group) if bits == 4 else None
        self.layer = attention.layer_idx
        self.kv_dtype = kv_cache_dtype(attention.config)
        # name -> (weights, aux, bias): what the driver reads
        self.products = {
            product: self._quantize(block, owner, names, quantized)
            for product, (owner, names) in PRODUCTS.items()
            if _PART_OF[owner] in self.parts
        }
        config, norms = attention.config, (block.input_layernorm, block.post_attention_layernorm)
        self.norm_weights = tuple(norm.weight for norm in norms)  # the driver reads them: kept alive

        def pointers(name: str) -> tuple[int | None, int | None, int | None]:
            weights, aux, bias = self.products.get(name, (None, None, None))
            return data_pointer(weights), data_pointer(aux), data_pointer(bias)

        (qkv, qkv_aux, qkv_bias), (o, o_aux, o_bias) = pointers("qkv"), pointers("o")
        (gate_up, gate_up_aux, gate_up_bias), (down, down_aux, down_bias) = (
            pointers("gate_up"),
            pointers("down"),
        )
        function = int_linear.builds(kind)[self.width].function
        self.spec = DriverLayer(
            None, function_address(rms_norm.load_kernel()), function_address(rotary.load_kernel()),
            function_address(attention_library(config)), function_address(silu.load_kernel()),
            attention.o_proj.out_features, config.num_attention_heads, config.num_key_value_heads,
            attention.head_dim, mlp.gate_proj.out_features,
            float(attention.scaling), norms[0].variance_epsilon, norms[1].variance_epsilon,
            self.norm_weights[0].data_ptr(), self.norm_weights[1].data_ptr(),
            qkv, o, gate_up, down, qkv_bias, o_bias, gate_up_bias, down_bias, None,
            bits, self.group or 0, ctypes.cast(function, ctypes.c_void_p).value,
            qkv_aux, o_aux, gate_up_aux, down_aux,
        )  # fmt: skip

    def _quantize(
        self, block: nn.Module, owner: str, names: tuple[str, ...], given: Quantized | None
    ) -> tuple[torch.Tensor, ...]:
        """One product of `block`'s projections `names` (same inputs): their weights as one matrix,
        quantized (or the `given` ones, joined) and packed, its scales (int8) or groups (int4), and
        their biases as one (zeros where one has none; None where none has one)."""
        projections = [getattr(getattr(block, owner), name) for name in names]
        bias = joined_bias(projections)
        if given is None:
            weight = torch.cat([projection.weight.float() for projection in projections])
        if self.bits == 8:
            if given is None:
                quantized = quantize_int8(weight)
            else:
                parts8 = [given[name] for name in names]
                quantized = Int8Weight(
                    torch.cat([w.q for w in parts8]), torch.cat([w.scale.float() for w in parts8])
                )
            return int_linear.pack_int8(quantized.q, self.width), quantized.scale.contiguous(), bias
        if given is None:
            quantized4 = quantize_int4(weight, self.group)
        else:
            parts4 = [given[name] for name in names]
            quantized4 = Int4Weight(
                *(torch.cat([getattr(w, field) for w in parts4]) for field in ("q", "scale", "zero")),
                self.group,
            )
        words, params = int_linear.pack_int4(quantized4, self.width)
        return words, params, bias

    def packed_bytes(self) -> int:
        """The bytes of the quantized copy: the values, the int8 scales or int4 groups, the biases."""
        return sum(
            tensor.numel() * tensor.element_size()
            for product in self.products.values()
            for tensor in product
            if tensor is not None
        )

    def attention(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """`FusedLayer.attention`, on the lower-precision products."""
        if ATTENTION not in self.parts:
            raise ValueError(f"layer {self.layer}'s int{self.bits} copy holds no attention sub-layer")
        return super().attention(hidden, *args, **kwargs)

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """`FusedLayer.mlp`, on the lower-precision products."""
        if MLP not in self.parts:
            raise ValueError(f"layer {self.layer}'s int{self.bits} copy holds no MLP sub-layer")
        return super().mlp(hidden)

    def describe(self) -> str:
        group = f" in groups of {self.group}" if self.group else ""
        parts = " and ".join(self.parts)
        return f"layer {self.layer}'s {parts} at int{self.bits}{group} ({self.packed_bytes()} bytes)"


def lower_precision_layer(
    block: nn.Module,
    bits: int,
    group: int | None = None,
    parts: tuple[str, ...] = PARTS,
    width: int | None = None,
    quantized: Quantized | None = None,
) -> LowerPrecisionLayer | None:
    """A lower-precision copy of `block`'s fused sub-layers for a draft: `bits` 8 or 4 (int4 in
    groups of `group` inputs, by default the smallest of 32, 64, 128 dividing every product's
    inputs, `int_weights.common_group`), only the sub-layers in `parts` (`ATTENTION`, `MLP`), for
    the `width` build (by default the widest this CPU runs; 8 runs the AVX2 build). `quantized`:
    the weights to use, by projection name (`"q_proj"`, ..., `"down_proj"`; `Int8Weight`s or
    `Int4Weight`s of one group size, e.g. a draft's cached copies), instead of quantizing the
    block's. None where the block does not fit (`lower_precision_refusal` says why). Call it once
    per block and keep the result (it quantizes and packs the layer's weights); the block's own
    fused path is unaffected."""
    if lower_precision_refusal(block, bits, group, parts, width, quantized) is not None:
        return None
    return LowerPrecisionLayer(block, bits, group, parts, width, quantized)
