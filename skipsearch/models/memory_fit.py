"""Whether a model fits this machine's memory under its kernel plan, asked before any weight is made.

A model that does not fit would fill the memory for minutes and then be killed (or swap the
machine to a halt); the bytes it needs are known from its config alone. The model is laid out on
the meta device (no memory) and its weights counted in the dtypes the plan holds them in
(`models.weight_layout`), plus headroom: `HEADROOM_BYTES` for the process (torch, the kernels,
the K/V cache and activations of a decode) and one decoder layer in the activations' dtype (a
layer's worth of weights stands in float32 while it is made or read, and a packing copies a
matrix). That is compared with what the kernel says it can give (`MemAvailable`), and a model
that does not fit is refused in one line that names the flag that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skipsearch.errors import ModelLoadError
from skipsearch.models.weight_layout import WeightDtypes

HEADROOM_BYTES = 1 << 30  # the process, the K/V cache and activations of a decode (module docstring)
GB = 1e9


@dataclass(frozen=True)
class ModelBytes:
    """What a model takes under a layout: the weights outside its decoder layers, one layer's
    (every layer of the families we run has the same shape), one layer in the activations' dtype,
    and its depth."""

    outside: int
    layer: int
    wide_layer: int
    layers: int

    def total(self, layers: int | None = None) -> int:
        """The bytes with `layers` layers (None: its own depth), headroom included."""
        depth = self.layers if layers is None else layers
        return self.outside + depth * self.layer + self.wide_layer + HEADROOM_BYTES

    def layers_within(self, available: int) -> int:
        """The most layers that fit in `available` bytes (0: not even one)."""
        spare = available - self.outside - self.wide_layer - HEADROOM_BYTES
        return max(0, min(self.layers, spare // self.layer)) if self.layer else self.layers


def available_bytes() -> int | None:
    """The memory this machine can give a new process without swapping (`MemAvailable` of
    /proc/meminfo); None where the kernel does not say (not Linux)."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def empty_model(config: Any) -> Any:
    """The architecture of `config` on the meta device: its shapes, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def model_bytes(config: Any, layout: WeightDtypes) -> ModelBytes:
    """The bytes of the model `config` describes under `layout` (module docstring)."""
    model = empty_model(config)
    layers = list(getattr(getattr(model, "model", None), "layers", []))
    total = layout.bytes_of(model)
    if not layers:
        return ModelBytes(total, 0, 0, 0)
    layer = layout.bytes_of(layers[0])
    wide = WeightDtypes(layout.activations, layout.activations).bytes_of(layers[0])
    return ModelBytes(total - len(layers) * layer, layer, wide, len(layers))


def check_fits(
    config: Any, layout: WeightDtypes, model_id: str, depth_flag: bool, other: WeightDtypes | None = None
) -> ModelBytes:
    """Refuse (`ModelLoadError`) the model `config` describes where its bytes under `layout` exceed
    the available memory, naming what would fit: `other` (a layout of fewer bytes `--dtype bfloat16`
    gives) and, with `depth_flag` (a weight-free model), `--num-layers N`."""
    needed = model_bytes(config, layout)
    available = available_bytes()
    if available is None or needed.total() <= available:
        return needed
    fixes = []
    if other is not None and model_bytes(config, other).total() <= available:
        fixes.append("--dtype bfloat16")
    depth = needed.layers_within(available)
    if depth_flag and depth >= 1:
        fixes.append(f"--num-layers {depth}")
    fix = " or ".join(fixes) if fixes else "a machine with more memory, or a smaller model"
    raise ModelLoadError(
        f"{model_id} needs about {needed.total() / GB:.1f} GB under its plan ({layout.matrices} weights, "
        f"{layout.activations} activations) and this machine has {available / GB:.1f} GB available: "
        f"use {fix}"
    )
