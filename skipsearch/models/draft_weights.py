"""Draft weights at lower precision: int8 or int4 copies of a decoder's linear layers, read by a draft
whose mask runs a sub-layer at `w8` or `w4` (`masks.SkipMask.attn_bits`; the issue "Drafts at lower
precision"). The runner runs such a sub-layer with the layer's own modules, its projections swapped
for these (`LayerwiseRunner.attention`, `.mlp`); the norms, rotary embedding, attention kernel and K/V
cache stay the layer's own. The head stays at the model's precision (a draft vocabulary's head is
`models.draft_head`).

The quantization is `cpu.int_weights`' (int8 symmetric per output channel; int4 asymmetric in groups
along the input, of `group` inputs: by default 32, the smallest, which costs 0.31 of bf16's bytes
where 128 costs 0.27 but agrees far more often: a checkpoint that came from a 4-bit GGUF already
holds its weights in blocks of 32, which groups of 32 reproduce, and coarser groups lose; see
docs/drafts.md), of the weights the target multiplies by (after the plan's bf16
rounding, where it rounds). With float32 activations on a CPU the copies run on skipsearch's int8 /
int4 kernels (`cpu.int_linear`); elsewhere they are plain linear layers holding the dequantized
matrices (the draft's numerics, not its bytes).

A loaded checkpoint's copies are quantized once per precision and group and kept in the cache
(`draft_weights_path`), keyed by the checkpoint (`remember_checkpoint`, called at load), a fingerprint
of the weights as the draft reads them, the precision and the group; later runs read from that file
only the sub-layers a mask uses. A model of no known checkpoint (random weights, a test's) quantizes
in memory. Loading states its bytes and refuses, in one line, copies that would not fit in the memory
available (`DraftWeights.prepare`).

A copy is held once: where a sub-layer also runs in the fused driver, its fused layer packs the
products' weights (q/k/v joined, gate/up joined) and the swapped modules' int kernels are then
pointed at their rows of that copy (`_share`: the layouts are by blocks of outputs, so a projection
whose outputs are whole blocks, as every family we run has, is a slice of its product), so the
draft holds about its packed bytes (`held_bytes`), not twice them.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from skipsearch.cpu.fused_layers import (
    ATTENTION,
    PRODUCTS,
    fused_layer,
    lower_precision_layer,
    lower_precision_refusal,
)
from skipsearch.cpu.fused_layers import MLP as FUSED_MLP
from skipsearch.cpu.int_linear import Int4Linear, Int8Linear
from skipsearch.cpu.int_weights import (
    GROUPS,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)
from skipsearch.errors import ConfigError
from skipsearch.masks import LOW_BITS, SkipMask
from skipsearch.store import atomic_path, cache_dir, slug

log = logging.getLogger(__name__)

ATTN, MLP = "attn", "mlp"
PROJECTIONS = {
    ATTN: ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
    MLP: ("mlp", ("gate_proj", "up_proj", "down_proj")),
}
DRAFT_WEIGHTS_DIR = "draft_weights"

_CHECKPOINTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_GROUPS: weakref.WeakKeyDictionary[nn.Module, int | None] = weakref.WeakKeyDictionary()
_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, dict[int | None, DraftWeights]] = weakref.WeakKeyDictionary()


def remember_checkpoint(model: nn.Module, location: str) -> None:
    """Record which checkpoint `model` was loaded from (`models.loading`: a directory or a hub id), so
    its draft weights are kept in the cache under that name (a converted GGUF's directory is named by
    the GGUF's sha256; the weights' fingerprint tells apart directories of one name)."""
    path = Path(location).expanduser()
    _CHECKPOINTS[model] = slug(path.name if path.is_dir() else location)[-120:]


def group_for(inputs: int, group: int | None = None) -> int:
    """The int4 group of a matrix with `inputs` inputs: `group` when given (it must divide them),
    else the smallest of `GROUPS` (32 first) that does."""
    if group is not None:
        if group not in GROUPS or inputs % group:
            raise ConfigError(
                f"int4 groups of {group} do not fit a matrix of {inputs} inputs: use one of "
                f"{', '.join(map(str, GROUPS))} that divides every input width of the model"
            )
        return group
    for size in sorted(GROUPS):
        if inputs % size == 0:
            return size
    raise ConfigError(f"a matrix of {inputs} inputs has no int4 group ({', '.join(map(str, GROUPS))})")


def quantized_bytes(out: int, inputs: int, bits: int, group: int) -> int:
    """The bytes of one matrix's copy: int8 values and a float32 scale per output; int4 values (half a
    byte) and a bf16 scale and zero per group (`cpu.int_linear`'s layouts)."""
    if bits == 8:
        return out * inputs + 4 * out
    return out * inputs // 2 + 4 * out * (inputs // group)


def available_memory() -> int:
    """Bytes this machine can still give a process without swapping (Linux's MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


FORMAT = 2  # the cache files' layout: raised whenever what `cpu.int_weights` stores changes


def draft_weights_path(checkpoint: str, fingerprint: str, bits: int, group: int | None) -> Path:
    """Where a checkpoint's copies at `bits` (and int4 `group`, None: the default) are kept; the
    name holds the group the copies are in and the files' format, so no change of either reads an
    older file."""
    precision = "int8" if bits == 8 else f"int4-g{group or min(GROUPS)}"
    name = f"{checkpoint}-{fingerprint[:12]}-{precision}-v{FORMAT}.safetensors"
    return cache_dir() / DRAFT_WEIGHTS_DIR / name


def _fits(needed: int, what: str) -> None:
    free = available_memory()
    if needed > free:
        raise ConfigError(
            f"{what} need {needed / 1e6:.0f} MB but {free / 1e6:.0f} MB of memory are available: "
            "draft fewer sub-layers at lower precision, or free memory"
        )


class DraftWeights:
    """The int8 / int4 copies of one model's linear layers, built or read when first asked for and
    kept for the model's life (`draft_weights_of` shares them between runners)."""

    def __init__(self, model: nn.Module, group: int | None = None) -> None:
        self.layers = list(model.model.layers)
        self.group = group
        self.dtype = model.model.embed_tokens.weight.dtype
        self.checkpoint = _CHECKPOINTS.get(model)
        self._modules: dict[tuple[int, str, int], nn.Module] = {}
        self._fused: dict[tuple[int, str, int], Any] = {}
        self._fingerprint: str | None = None

    # -- what a mask uses ---------------------------------------------------------------------
    def _linears(self, layer: int, kind: str) -> list[tuple[str, nn.Module]]:
        owner, names = PROJECTIONS[kind]
        module = getattr(self.layers[layer], owner)
        return [(name, getattr(module, name)) for name in names]

    def _bytes(self, layer: int, kind: str, bits: int) -> int:
        total = 0
        for _, linear in self._linears(layer, kind):
            out, inputs = linear.out_features, linear.in_features
            group = group_for(inputs, self.group) if bits == 4 else 0
            total += quantized_bytes(out, inputs, bits, group)
        return total

    @staticmethod
    def used(mask: SkipMask) -> list[tuple[int, str, int]]:
        """(layer, kind, bits) of every sub-layer `mask` runs at lower precision."""
        found = []
        for layer in range(mask.num_layers):
            for kind, bits in ((ATTN, mask.attn_bits(layer)), (MLP, mask.mlp_bits(layer))):
                if bits in LOW_BITS:
                    found.append((layer, kind, bits))
        return found

    def nbytes(self, mask: SkipMask) -> int:
        """The bytes of the copies `mask` reads (values, scales and zeros)."""
        return sum(self._bytes(*key) for key in self.used(mask))

    @property
    def loaded_bytes(self) -> int:
        """The bytes of the copies held now."""
        return sum(self._bytes(*key) for key in self._modules)

    def prepare(self, mask: SkipMask) -> None:
        """Load every copy `mask` reads, refusing (ConfigError) copies that would not fit in the memory
        available; a mask at full precision loads nothing."""
        missing = [key for key in self.used(mask) if key not in self._modules]
        if not missing:
            return
        needed = sum(self._bytes(*key) for key in missing)
        _fits(needed, f"the draft weights of {mask}")
        for key in missing:
            self._module(*key)
        log.info("draft weights for %s: %.1f MB held", mask, self.loaded_bytes / 1e6)

    # -- the swapped modules ------------------------------------------------------------------
    def self_attn(self, layer: int, bits: int) -> nn.Module:
        """Layer `layer`'s attention module with q/k/v/o at `bits`: its other parts the layer's own."""
        return self._module(layer, ATTN, bits)

    def mlp(self, layer: int, bits: int) -> nn.Module:
        """Layer `layer`'s MLP module with gate/up/down at `bits`."""
        return self._module(layer, MLP, bits)

    def fused(self, layer: int, kind: str, bits: int) -> Any:
        """Layer `layer`'s attention (`ATTN`) or MLP at `bits` in one call of the fused driver
        (`cpu.fused_layers.lower_precision_layer`) over the same quantized weights as the swapped
        modules, so both paths give the same bits; None where the layer has no fused path (a plan
        with bf16 activations, a GPU), and the modules run it. Built once and kept for the model's
        life: a helper on a busy core may read its weights until a decode disengages."""
        key = (layer, kind, bits)
        if key not in self._fused:
            module = self._module(layer, kind, bits)
            block = self.layers[layer]
            built = None
            if fused_layer(block) is not None:
                quantized = {
                    name: projection.quantized()  # the int kernels' modules unpack their copy
                    for name in PROJECTIONS[kind][1]
                    if isinstance(projection := getattr(module, name), (Int8Linear, Int4Linear))
                }
                part = ATTENTION if kind == ATTN else FUSED_MLP
                if len(quantized) == len(PROJECTIONS[kind][1]):
                    built = lower_precision_layer(block, bits, parts=(part,), quantized=quantized)
                    if built is None:
                        why = lower_precision_refusal(block, bits, parts=(part,), quantized=quantized)
                        log.info("layer %d's %s at int%d runs the modules: %s", layer, kind, bits, why)
                    else:
                        _share(module, built)
            self._fused[key] = built
        return self._fused[key]

    def held_bytes(self) -> int:
        """The bytes of the tensors the copies hold now (the swapped modules' and the fused layers'),
        each storage counted once and the model's own tensors (norms, biases it shares) not at all:
        what the draft adds to the process's memory."""
        own = {p.untyped_storage().data_ptr() for layer in self.layers for p in layer.parameters()}
        tensors = [t for module in self._modules.values() for t in _int_tensors(module)]
        tensors += [t for built in self._fused.values() if built is not None for t in _fused_tensors(built)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(size for ptr, size in storages.items() if ptr not in own)

    def _module(self, layer: int, kind: str, bits: int) -> nn.Module:
        key = (layer, kind, bits)
        if key not in self._modules:
            if bits not in LOW_BITS:
                raise ConfigError(f"draft weights are int8 or int4, not {bits} bits")
            owner, _ = PROJECTIONS[kind]
            module = copy.copy(getattr(self.layers[layer], owner))  # shares every parameter
            module._modules = dict(module._modules)
            for name, linear in self._linears(layer, kind):
                module._modules[name] = self._linear(layer, kind, name, linear, bits)
            self._modules[key] = module
        return self._modules[key]

    def _linear(self, layer: int, kind: str, name: str, linear: nn.Module, bits: int) -> nn.Module:
        quantized = self._quantized(layer, kind, name, linear, bits)
        bias, device = linear.bias, self.layers[layer].input_layernorm.weight.device
        if self.dtype == torch.float32 and device.type == "cpu":
            shape = torch.empty(linear.out_features, linear.in_features, device="meta")
            if isinstance(quantized, Int8Weight):
                return Int8Linear(shape, bias, quantized=quantized)
            return Int4Linear(shape, bias, quantized.group, quantized=quantized)
        dense = (
            dequantize_int8(quantized) if isinstance(quantized, Int8Weight) else dequantize_int4(quantized)
        )
        plain = nn.Linear(linear.in_features, linear.out_features, bias is not None, device="meta")
        plain.weight = nn.Parameter(dense.to(device, self.dtype), requires_grad=False)
        if bias is not None:
            plain.bias = nn.Parameter(bias.detach().to(device, self.dtype), requires_grad=False)
        return plain

    # -- quantizing, and the cache ------------------------------------------------------------
    def _quantize(self, linear: nn.Module, bits: int) -> Int8Weight | Int4Weight:
        weight = linear.weight.detach().float().cpu()
        if bits == 8:
            return quantize_int8(weight)
        return quantize_int4(weight, group_for(weight.shape[1], self.group))

    def _quantized(
        self, layer: int, kind: str, name: str, linear: nn.Module, bits: int
    ) -> Int8Weight | Int4Weight:
        if self.checkpoint is None:
            return self._quantize(linear, bits)
        from safetensors import safe_open

        path = self._path(bits)
        with safe_open(str(path), framework="pt") as stored:
            prefix = f"{layer}.{kind}.{name}"
            q, scale = stored.get_tensor(f"{prefix}.q"), stored.get_tensor(f"{prefix}.scale")
            if bits == 8:
                return Int8Weight(q, scale)
            zero = stored.get_tensor(f"{prefix}.zero")
            return Int4Weight(q, scale, zero, q.shape[1] // scale.shape[1])

    def fingerprint(self) -> str:
        """A hash of the first and last layers' weights as the draft quantizes them: two copies of a
        checkpoint read differently (bf16-rounded by the plan, or not) never share a cache file."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for layer in (0, len(self.layers) - 1):
                for kind in (ATTN, MLP):
                    for _, linear in self._linears(layer, kind)[:1]:
                        digest.update(linear.weight.detach().float().cpu().contiguous().numpy().tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def _path(self, bits: int) -> Path:
        """The cache file of this checkpoint's copies at `bits`, quantized and written when missing."""
        assert self.checkpoint is not None
        path = draft_weights_path(self.checkpoint, self.fingerprint(), bits, self.group)
        if path.is_file():
            return path
        from safetensors.torch import save_file

        total = sum(
            self._bytes(layer, kind, bits) for layer in range(len(self.layers)) for kind in PROJECTIONS
        )
        _fits(total, f"quantizing every layer at int{bits} (once, into {path})")
        log.warning(
            "quantizing %s's weights at int%d once (%.0f MB, cached in %s)",
            self.checkpoint,
            bits,
            total / 1e6,
            path,
        )
        tensors: dict[str, torch.Tensor] = {}
        for layer in range(len(self.layers)):
            for kind in PROJECTIONS:
                for name, linear in self._linears(layer, kind):
                    quantized = self._quantize(linear, bits)
                    prefix = f"{layer}.{kind}.{name}"
                    tensors[f"{prefix}.q"], tensors[f"{prefix}.scale"] = quantized.q, quantized.scale
                    if isinstance(quantized, Int4Weight):
                        tensors[f"{prefix}.zero"] = quantized.zero
        with atomic_path(path) as staging:
            save_file(tensors, str(staging), metadata={"checkpoint": self.checkpoint, "bits": str(bits)})
        return path


_LAYOUT = {Int8Linear: ("packed", "scale"), Int4Linear: ("words", "params")}  # what the int kernels read


def _int_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The tensors of a swapped module's int kernels (its values and scales, or groups, and biases)."""
    found = []
    for linear in module._modules.values():
        names = _LAYOUT.get(type(linear), ("weight",))
        found += [
            getattr(linear, name) for name in (*names, "bias") if getattr(linear, name, None) is not None
        ]
    return [t for t in found if isinstance(t, torch.Tensor)]


def _fused_tensors(built: Any) -> list[torch.Tensor]:
    return [t for product in built.products.values() for t in product if t is not None]


def _same(view: torch.Tensor, tensor: torch.Tensor) -> bool:
    return view.shape == tensor.shape and view.dtype == tensor.dtype and torch.equal(view, tensor)


def _share(module: nn.Module, built: Any) -> None:
    """Point `module`'s int kernels (`Int8Linear`, `Int4Linear`) at their rows of the fused layer
    `built`'s copy of the same weights, where those rows hold the same bytes, so the draft holds them
    once. A fused product joins projections by their outputs, and both layouts are laid out by blocks
    of outputs (the values first, then the int8 scales by output or the int4 groups by block): a
    projection whose outputs fill whole blocks (every family we run) is a slice of its product. One
    that is not (its rows differ) keeps its own copy, as do the projections after it."""
    for product, (_, names) in PRODUCTS.items():
        held = built.products.get(product)
        if held is None:
            continue
        at = [0, 0]  # rows of the product's values and of its scales or groups before this projection
        for name in names:
            linear = module._modules.get(name)
            layout = _LAYOUT.get(type(linear))
            if layout is None or getattr(linear, "width", None) != built.width:
                break
            mine = [getattr(linear, field) for field in layout]
            views = [
                theirs[start : start + t.shape[0]]
                for theirs, start, t in zip(held[:2], at, mine, strict=True)
            ]
            if not all(_same(view, t) for view, t in zip(views, mine, strict=True)):
                log.info(
                    "%s's int%d rows are not a slice of the fused %s: held twice", name, built.bits, product
                )
                break
            for field, view in zip(layout, views, strict=True):
                setattr(linear, field, view)
            at = [start + t.shape[0] for start, t in zip(at, mine, strict=True)]


def set_int4_group(model: nn.Module, group: int | None) -> None:
    """The int4 group `model`'s runners quantize in from now on (None: each matrix's default,
    `group_for`); checked against every matrix of the model at once."""
    if group is not None:
        for layer in model.model.layers:
            for owner, names in PROJECTIONS.values():
                for name in names:
                    group_for(getattr(getattr(layer, owner), name).in_features, group)
    _GROUPS[model] = group


def draft_weights_of(model: nn.Module, group: int | None = None) -> DraftWeights:
    """The model's draft weights at int4 `group` (None: the one `set_int4_group` set, else each
    matrix's default), one set per model and group whichever runner asks."""
    group = group if group is not None else _GROUPS.get(model)
    found = _WEIGHTS.setdefault(model, {})
    if group not in found:
        found[group] = DraftWeights(model, group)
    return found[group]
