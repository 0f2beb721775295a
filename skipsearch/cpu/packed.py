"""Prepacked weights: every linear layer's matrix reordered once, at load, into the blocked layout
oneDNN's bf16 matrix product reads (docs/cpu-backend.md).

`F.linear` on a bf16 CPU tensor hands oneDNN a plain row-major weight, and oneDNN reorders it into
its blocked layout on every call: the reorder reads and writes the whole matrix again, so a decode
step, whose products have one to five rows, pays for it twice. Reordering once and calling oneDNN's
linear on the packed weight — `torch.ops.mkldnn._reorder_linear_weight` and
`torch.ops.mkldnn._linear_pointwise`, the pair torch's inductor emits for frozen CPU models — made
SmolLM2's and Qwen's products 1.5–2.5× faster on a CPU with avx512_bf16, with the same bits out: the
arithmetic is the same oneDNN kernel's (docs/cpu-backend.md, "Packed weights for oneDNN"). An output
row is mostly independent of how many rows a call has (checked in the tests on a small shape), but
not always: Qwen's down projection (4864 → 896) gives other bits from 4 rows on, and SmolLM2's down
projection did so in one layer on real activations. So a verify may differ from decode steps in the
last bit, and bf16 losslessness is judged against a measured tolerance (`bench.lossless`).

bf16 on a CPU is packed. fp16 needs CPU instructions (AVX512-FP16) this project has not
measured. fp32 is packed only in the fallback plan of a CPU without native bf16, and only where
oneDNN measured faster than MKL there (`cpu.fp32_linear`); `--dtype float32` stays the exact
reference: oneDNN's packed fp32 product gives other bits than MKL's and is not row-independent.

The packed matrix is opaque (no views, no `.to()`), so a packed model is for inference where it
was loaded. A `PackedLinear` keeps the plain weight only where another module shares it (a head
tied to the input embedding, which the lookup still reads); otherwise the packed copy replaces
it and the weight's memory does not grow.
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.cpu.replace import replace_children

PACKED_DTYPES = (torch.bfloat16,)


class PackedLinear(nn.Module):
    """`nn.Linear`'s product on a weight packed once for oneDNN.

    `weight` stays readable for code that reads a projection's matrix (a draft vocabulary gathers
    the head's rows): it is the shared plain weight where one is kept, else a plain copy unpacked
    on each read — a full reorder, so read it once, not per step.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_plain: bool) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
        self.bias = bias
        self.plain = weight if keep_plain else None

    @property
    def weight(self) -> torch.Tensor:
        return self.plain if self.plain is not None else self.packed.to_dense()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, self.packed, self.bias, "none", [], "")

    def packed_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for oneDNN"


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether weights of `dtype` on `device` are packed: bf16 on a CPU whose oneDNN runs bf16."""
    return (
        torch.device(device).type == "cpu"
        and dtype in PACKED_DTYPES
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def packs(weight: torch.Tensor, force: bool = False) -> bool:
    """Whether `weight` is packed: where `can_pack`, or on a CPU whatever its dtype with `force`."""
    return can_pack(weight.dtype, weight.device) or (force and weight.device.type == "cpu")


def linear_product(weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False) -> nn.Module:
    """The product `x @ weight.T + bias` on the fastest kernel for the weight's dtype and device:
    packed where `can_pack` or `pack` asks (a CPU matrix beside a model packed by
    `pack_linears(force=True)`), else `F.linear` (for matrices built after load, like a draft head)."""
    if packs(weight, force=pack):
        return PackedLinear(weight, bias, keep_plain=False)
    return plain_linear(weight, bias)


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An `nn.Linear` holding `weight` and `bias` themselves (no copy, no initialisation)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def pack_linears(model: nn.Module, force: bool = False) -> int:
    """Replace every `nn.Linear` of `model` whose weight `can_pack` by a `PackedLinear`; returns
    how many. A weight that another module also holds (a tied head) keeps its plain copy.
    `force` packs every CPU weight whatever its dtype: the fp32 fallback plan where oneDNN
    measured faster (`cpu.fp32_linear`), and experiments (`experiments/linear_rows.py --pack`)."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    return replace_children(
        model,
        lambda child: (
            PackedLinear(child.weight, child.bias, keep_plain=holders.get(id(child.weight), 0) > 1)
            if type(child) is nn.Linear and packs(child.weight, force)
            else None
        ),
    )
