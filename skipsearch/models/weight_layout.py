"""The dtype each weight of a model is held in under its kernel plan, from the first byte loaded.

A plan runs its activations in one dtype and may keep its weight matrices in another: the fallback
plan of a CPU with skipsearch's kernel multiplies float32 activations by bf16 weights
(`cpu.bf16_weights`). The matrices are most of a model's bytes, so a model made or read in float32
and rounded after needs twice its bf16 bytes at the peak (a 7B: ~29 GB, where its plan holds
~15 GB). Here each matrix is held in the plan's dtype as it is made: random weights one module at
a time (`random_weights`), a checkpoint read in the matrices' dtype by transformers (tensor by
tensor), with the few other tensors (embedding, norms, biases) read again from its safetensors in
the activations' dtype, so they hold the values they held in float32, exactly. A GGUF is
de-quantized the same way on its first conversion: the matrices in their dtype, the others
de-quantized again from the file (`read_exact_gguf`), so no float32 model is made on the way.

Rounding a float32 matrix to bf16 here is the rounding the kernel's packing did (round to nearest
even), so the packed weights, and every output, keep their bits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the light commands import this module's `WeightDtypes` without torch
    import torch
    from torch import nn


@dataclass(frozen=True)
class WeightDtypes:
    """The plan's activations dtype (a torch dtype's name) and the dtype its weight matrices are held in."""

    activations: str
    matrices: str

    @property
    def mixed(self) -> bool:
        return self.matrices != self.activations

    @property
    def cache_suffix(self) -> str:
        """A converted GGUF's directory suffix: none for float32 (the name it had first), the dtype
        for one dtype, `-bf16-matrices` for bf16 matrices beside float32 for the rest."""
        if not self.mixed:
            return "" if self.activations == "float32" else f"-{self.activations}"
        return f"-{short(self.matrices)}-matrices"

    def bytes_of(self, model: nn.Module) -> int:
        """The bytes `model`'s weights take in this layout (a model on the meta device will do)."""
        dtypes = self.dtypes(model)
        return sum(p.numel() * dtypes[id(p)].itemsize for p in unique_parameters(model))

    def dtypes(self, model: nn.Module) -> dict[int, torch.dtype]:
        """The dtype of each parameter of `model`, by id: the matrices' for a weight only matrices
        hold (`is_matrix`; a head tied to the input embedding stays with it), else the activations'."""
        import torch

        matrices, activations = getattr(torch, self.matrices), getattr(torch, self.activations)
        held: dict[int, bool] = {}
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                matrix = is_matrix(module) and name == "weight"
                held[id(parameter)] = held.get(id(parameter), True) and matrix
        return {key: matrices if matrix else activations for key, matrix in held.items()}

    @staticmethod
    def targets(module: nn.Module, dtypes: dict[int, torch.dtype]) -> dict[str, torch.dtype]:
        """The dtype of each of `module`'s own parameters by name, from `dtypes` (`self.dtypes`)."""
        return {name: dtypes[id(p)] for name, p in module.named_parameters(recurse=False) if id(p) in dtypes}

    @staticmethod
    def apply(module: nn.Module, targets: dict[str, torch.dtype]) -> None:
        """Cast `module`'s own parameters to their dtype in `targets` (`WeightDtypes.targets`)."""
        from torch import nn

        for name, parameter in list(module.named_parameters(recurse=False)):
            dtype = targets.get(name, parameter.dtype)
            if parameter.dtype != dtype:
                setattr(module, name, nn.Parameter(parameter.detach().to(dtype), requires_grad=False))


def short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def is_matrix(module: nn.Module) -> bool:
    """A linear layer whose weight the plan holds in the matrices' dtype: one that skipsearch's
    kernel multiplies (`cpu.bf16_weights.fits`: inputs a multiple of `INPUT_MULTIPLE`)."""
    from torch import nn

    from skipsearch.cpu.bf16_weights import INPUT_MULTIPLE

    return type(module) is nn.Linear and module.in_features % INPUT_MULTIPLE == 0


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for _, p in model.named_parameters(remove_duplicate=False)}.values())


def weight_files(location: Path) -> dict[str, Path]:
    """Which safetensors file of the directory `location` holds each tensor (by its index, or the
    single file's own names); empty where the weights are not safetensors."""
    from safetensors import safe_open

    index = location / "model.safetensors.index.json"
    if index.is_file():
        mapping = json.loads(index.read_text())["weight_map"]
        return {name: location / file for name, file in mapping.items()}
    files: dict[str, Path] = {}
    for path in sorted(location.glob("*.safetensors")):
        with safe_open(path, "pt") as handle:
            files.update(dict.fromkeys(handle.keys(), path))
    return files


def read_exact(model: nn.Module, location: str, layout: WeightDtypes) -> int:
    """Give every parameter of `model` (loaded with its weights in `layout.matrices`) that the
    layout holds in the activations' dtype the checkpoint's own value in that dtype, read again
    from its safetensors one tensor at a time, in place (a tied head keeps sharing it); returns
    how many. Where the checkpoint has no safetensors, they are cast up from what was loaded."""
    import torch
    from safetensors import safe_open

    dtypes = layout.dtypes(model)
    activations = getattr(torch, layout.activations)
    path = Path(location)
    files = weight_files(path) if path.is_dir() else {}
    read = 0
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if dtypes[id(parameter)] != activations or parameter.dtype == activations:
                continue
            if name in files:
                with safe_open(files[name], "pt") as handle:
                    parameter.data = handle.get_tensor(name).to(activations)
                read += 1
            else:
                parameter.data = parameter.data.to(activations)
    return read


def cast_to_layout(model: nn.Module, layout: WeightDtypes) -> Any:
    """`model` with each parameter in its layout dtype, module by module (for a converted cache)."""
    dtypes = layout.dtypes(model)
    for module in model.modules():
        layout.apply(module, layout.targets(module, dtypes))
    return model


class _Names:
    """What transformers' GGUF name map reads of a model (its config, its tensors' names), for the
    names given alone: the map then pairs only those with the file's tensors."""

    def __init__(self, config: Any, names: list[str]) -> None:
        self.config, self._names = config, names

    def state_dict(self) -> dict[str, None]:
        return dict.fromkeys(self._names)

    def named_children(self) -> Iterator[tuple[str, Any]]:
        return iter(())


def read_exact_gguf(model: nn.Module, gguf: Path, layout: WeightDtypes) -> list[str]:
    """`read_exact` for a model transformers de-quantized from the GGUF `gguf` with its weights in
    `layout.matrices`: every parameter the layout holds in the activations' dtype is de-quantized
    again from the file, one tensor at a time, by transformers' own name map and tensor processor
    (as its loader, `load_gguf_checkpoint`, does), and set in place in that dtype (a tied head keeps
    sharing it). Returns the names of those it found no tensor for (none for the families we run),
    which the caller must not round."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    dtypes = layout.dtypes(model)
    activations = getattr(torch, layout.activations)
    wanted = {
        name: parameter
        for name, parameter in model.named_parameters()
        if dtypes[id(parameter)] == activations and parameter.dtype != activations
    }
    if not wanted:
        return []
    reader = GGUFReader(str(gguf))
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(model.config.to_dict())
    names = get_gguf_hf_weights_map(_Names(model.config, list(wanted)), processor)
    with torch.no_grad():
        for tensor in reader.tensors:
            if tensor.name not in names:
                continue  # a matrix: transformers has it in its dtype already
            found = processor.process(
                weights=dequantize(tensor.data, tensor.tensor_type),
                name=tensor.name,
                tensor_key_mapping=names,
                parsed_parameters={"tensors": {}},
            )
            parameter = wanted.pop(names.get(found.name, ""), None)
            if parameter is not None:
                # a de-quantized array is new and writable; a float tensor read in place is
                # the file's read-only map, copied
                weights = np.require(found.weights, requirements=("W", "C"))
                parameter.data = torch.from_numpy(weights).to(activations)
    return sorted(wanted)
