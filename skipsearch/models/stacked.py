"""Stacked projections: one matrix product where a layer multiplies one input by two or three
matrices (docs/theory.md, "The kernel plan").

On `F.linear`, a decode step of a small model on a CPU was bound by the number of matrix
products, not by their bytes: SmolLM2-135M runs 211 a step, each reading 0.2–1.8 MB, and a bf16
product of one position paid a fixed cost in oneDNN (the reorder of its weight, which
`models.packed` now does once) that a larger matrix amortises. Attention's q/k/v projections read the
same normed input, and so do the MLP's gate and up projections, so their weights are stacked into
one matrix per group: five products a layer become two, with the same bytes read.

transformers' modules stay as they are and call `q_proj`, `k_proj`, `v_proj` (and `gate_proj`,
`up_proj`) in turn on one tensor. A `StackedLinear` beside them (`qkv_proj`, `gate_up_proj`) holds
the stacked weight — the only copy, so memory does not grow and `.to()` moves it — and computes the
product once per input; each projection becomes a `SliceOfStack` that hands out its slice.
Each output column is the same dot product as before, so the outputs equal the separate
projections' (checked in the tests); every decoder (draft, verify, autoregressive, HF `generate`)
runs the same stacked modules either way. `load_model` stacks half-precision models only: in fp32
the stacked decode gained nothing on this CPU (−3% to +2% over two runs), and fp32 stays the
exact, unchanged reference. On packed weights stacking no longer pays in bf16 either
(results/kernels/stacked_projections.md, by `experiments/kernel_change.py --change stacked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from skipsearch.models.packed import plain_linear

# (parent module, the stack's name, the projections it replaces), named as vLLM names its stacks
GROUPS = (
    ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
)


class StackedLinear(nn.Module):
    """The product of an input with the stacked weights of a group, computed once per input and
    handed out slice by slice; the stash is released once every slice has been taken, so a long
    prefill's outputs do not outlive the layer."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.sizes = [linear.out_features for linear in linears]
        self.in_features, self.out_features = linears[0].in_features, sum(self.sizes)
        stacked = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        bias = torch.cat([b.detach() for b in biases]) if biases[0] is not None else None
        # A module of its own, so the plan's later steps (packing) find the stack's product too.
        self.product = plain_linear(stacked, bias)
        self._input: torch.Tensor | None = None
        self._slices: tuple[torch.Tensor, ...] = ()
        self._untaken: set[int] = set()

    def slice(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        if hidden is not self._input or index not in self._untaken:
            self._slices = self.product(hidden).split(self.sizes, dim=-1)
            self._input, self._untaken = hidden, set(range(len(self.sizes)))
        out = self._slices[index]
        self._untaken.discard(index)
        if not self._untaken:
            self._input, self._slices = None, ()
        return out

    @property
    def weight(self) -> torch.Tensor:
        return self.product.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.product.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The whole stacked product (transformers' modules call the slices instead)."""
        return self.product(hidden)


class SliceOfStack(nn.Module):
    """Stands in for one projection of a group: its slice of the stacked product, and a `weight`
    (and `bias`) that are views of its rows of the stack, so code that reads a projection's weight
    still finds it. The stack is held outside this module, so its weight is counted and moved once."""

    def __init__(self, stack: StackedLinear, index: int) -> None:
        super().__init__()
        self._stack = (stack,)
        self.index = index
        self.start = sum(stack.sizes[:index])
        self.in_features, self.out_features = stack.in_features, stack.sizes[index]

    @property
    def weight(self) -> torch.Tensor:
        return self._stack[0].weight[self.start : self.start + self.out_features]

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self._stack[0].bias
        return None if bias is None else bias[self.start : self.start + self.out_features]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._stack[0].slice(self.index, hidden)


def _stackable(linears: Sequence[Any]) -> bool:
    return (
        all(type(linear) is nn.Linear for linear in linears)
        and len({linear.in_features for linear in linears}) == 1
        and len({linear.bias is None for linear in linears}) == 1
        and len({(linear.weight.dtype, linear.weight.device) for linear in linears}) == 1
    )


def stack_projections(model: Any) -> int:
    """Stack every layer's q/k/v and gate/up projections in place; returns the groups stacked.

    A group is left alone where its modules are not plain `nn.Linear`s of one input width, bias
    presence, dtype and device (a quantised or adapted model), or are already stacked.
    """
    stacked = 0
    for layer in model.model.layers:
        for parent_name, stack_name, names in GROUPS:
            parent = getattr(layer, parent_name, None)
            linears = [getattr(parent, name, None) for name in names]
            if parent is None or not _stackable(linears):
                continue
            stack = StackedLinear(linears)
            parent.add_module(stack_name, stack)
            for index, name in enumerate(names):
                setattr(parent, name, SliceOfStack(stack, index))
            stacked += 1
    return stacked


def is_stacked(model: Any) -> bool:
    """Whether `stack_projections` stacked any group of this model (part of a cached reference's
    key: the numbers are computed by different kernels)."""
    return any(isinstance(module, StackedLinear) for module in model.modules())
