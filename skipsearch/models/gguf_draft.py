"""A draft cut from its model's own GGUF: the layers the draft keeps, renumbered, for llama.cpp's `-md`.

llama.cpp runs a draft as a separate model, so a self-speculative draft becomes one by copying the
target's GGUF without the layers it skips: the tokenizer and every other metadata pair, the token
embeddings, the final norm and the output head as they are; `{arch}.block_count` set to the layers
kept, `blk.N` renumbered. A GGUF layer runs its attention and its MLP, so only whole layers can be
dropped: a sub-layer skipped alone is refused (`whole_layer_refusal`).

The weights of a kept layer (`DraftWeights`): by default each sub-layer at the draft's precision —
int8 as Q8_0, int4 as Q4_0, the model's own precision as the source's bytes unchanged (so those
layers compute exactly what the target's do) — or every layer's weights at Q8_0 or Q4_0
(`--gguf-type`); a re-quantized tensor is de-quantized from the source and quantized again with
the gguf package (`gguf.quants`). Norms and biases are written as F32. The mask, the draft length
and the kept layers' source indices travel as `skipsearch.draft.*` pairs, which llama.cpp ignores
and `read_draft_gguf` checks the tensors against. The file is written to a staging name, read back
(`GGUFReader`: block count, tensor names, types and shapes against what was planned) and only
then renamed into place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skipsearch.errors import ConfigError, SkipsearchError
from skipsearch.masks import FULL_BITS, SkipMask
from skipsearch.store import atomic_path

GGUF_TYPES = ("q8_0", "q4_0")  # `--gguf-type`: every kept layer's weights at one type
AUTO = "auto"  # each sub-layer at the draft's precision; full ones keep the source's type
KEY_MASK, KEY_GAMMA = "skipsearch.draft.mask", "skipsearch.draft.gamma"
KEY_LAYERS, KEY_WEIGHTS = "skipsearch.draft.source_layers", "skipsearch.draft.weights"
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
_ATTN_PREFIXES = ("attn_", "post_attention_norm")
_MLP_PREFIXES = ("ffn_", "post_ffw_norm")


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the draft: its name there, the source tensor it comes from, its type."""

    name: str
    source: Any  # gguf.ReaderTensor
    type: Any  # gguf.GGMLQuantizationType


def whole_layer_refusal(mask: SkipMask) -> str | None:
    """Why a GGUF cannot hold `mask` (a sub-layer skipped without the rest of its layer), or None."""
    alone = [f"the attention of layer {i}" for i in sorted(mask.attn - mask.mlp)]
    alone += [f"the MLP of layer {i}" for i in sorted(mask.mlp - mask.attn)]
    if not alone:
        return None
    return (
        f"format gguf-draft drops whole layers only, but the draft {mask} skips {', '.join(alone)} alone "
        "(a GGUF layer runs both): export a layer-level draft (a run whose space skips whole layers, "
        "e.g. --space sparse) or use --format skipsearch"
    )


def kept_layers(mask: SkipMask) -> list[int]:
    return [layer for layer in range(mask.num_layers) if layer not in mask.skipped_layers]


def sublayer(suffix: str) -> str:
    """`attn` or `mlp`: the sub-layer a block tensor (`attn_q.weight`, `ffn_down.weight`) belongs to."""
    if suffix.startswith(_ATTN_PREFIXES):
        return "attn"
    if suffix.startswith(_MLP_PREFIXES):
        return "mlp"
    raise ConfigError(
        f"cannot tell whether the GGUF tensor blk.N.{suffix} belongs to the attention or the MLP: "
        "this architecture's draft cannot be cut yet; use --format skipsearch"
    )


def weight_type(mask: SkipMask, layer: int, kind: str, weights: str) -> Any:
    """The type a kept sub-layer's weight matrices are written at; None keeps the source's."""
    from gguf import GGMLQuantizationType as Q

    if weights != AUTO:
        return Q[weights.upper()]
    bits = mask.attn_bits(layer) if kind == "attn" else mask.mlp_bits(layer)
    return None if bits == FULL_BITS else {8: Q.Q8_0, 4: Q.Q4_0}[bits]


def plan_tensors(reader: Any, mask: SkipMask, weights: str) -> list[PlannedTensor]:
    """The draft's tensors in the source's order: every non-block tensor as it is, each kept layer's
    renumbered, vectors at F32 and matrices at `weight_type`."""
    from gguf import GGMLQuantizationType as Q

    new_index = {old: new for new, old in enumerate(kept_layers(mask))}
    planned = []
    for tensor in reader.tensors:
        block = _BLOCK.fullmatch(tensor.name)
        if block is None:
            planned.append(PlannedTensor(tensor.name, tensor, tensor.tensor_type))
            continue
        layer, suffix = int(block[1]), block[2]
        if layer not in new_index:
            continue
        chosen = Q.F32 if len(tensor.shape) == 1 else weight_type(mask, layer, sublayer(suffix), weights)
        name = f"blk.{new_index[layer]}.{suffix}"
        planned.append(PlannedTensor(name, tensor, chosen or tensor.tensor_type))
    return planned


def _field(reader: Any, key: str, path: Path) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ConfigError(f"{path} has no {key}: export it again")
    return field.contents()


def write_draft_gguf(source: Path, mask: SkipMask, gamma: int, weights: str, out: Path) -> Path:
    """Write the draft of `mask` cut from the GGUF `source` to `out` (staged, read back, renamed)."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = str(_field(reader, "general.architecture", source))
    depth = int(_field(reader, f"{arch}.block_count", source))
    mask.check_fits(depth)
    planned = plan_tensors(reader, mask, weights)
    kept = kept_layers(mask)
    with atomic_path(out) as staging:
        writer = gguf.GGUFWriter(staging, arch)
        _copy_metadata(reader, writer, arch, depth, kept)
        writer.add_block_count(len(kept))
        writer.add_file_type(_file_type(reader, planned))
        writer.add_key_value(KEY_MASK, str(mask), gguf.GGUFValueType.STRING)
        writer.add_key_value(KEY_GAMMA, gamma, gguf.GGUFValueType.UINT32)
        writer.add_key_value(KEY_WEIGHTS, weights, gguf.GGUFValueType.STRING)
        writer.add_key_value(KEY_LAYERS, kept, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32)
        for item in planned:
            _add_tensor(writer, item)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        check_written(staging, planned, arch, len(kept))
    return out


def _copy_metadata(reader: Any, writer: Any, arch: str, depth: int, kept: Sequence[int]) -> None:
    """Every key-value pair but those the writer or the draft sets; a per-layer array (one value a
    source layer, under `{arch}.`) keeps the kept layers' values."""
    from gguf import GGUFValueType as V

    own = {"general.architecture", "general.file_type", f"{arch}.block_count"}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in own:
            continue
        if name == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
            continue
        value, kind = field.contents(), field.types[0]
        sub_type = field.types[-1] if kind == V.ARRAY else None
        if kind == V.ARRAY and len(field.types) > 2:
            raise ConfigError(f"the GGUF key {name} holds nested arrays, which the draft cannot copy yet")
        if kind == V.ARRAY and name.startswith(f"{arch}.") and len(value) == depth and sub_type != V.STRING:
            value = [value[layer] for layer in kept]
        writer.add_key_value(name, value, kind, sub_type)


def _file_type(reader: Any, planned: Sequence[PlannedTensor]) -> int:
    """`general.file_type`, what llama.cpp names the model by: the type most of the layers' matrices
    were written at when it is Q8_0 or Q4_0, else the source's own."""
    from gguf import GGMLQuantizationType as Q
    from gguf import LlamaFileType

    counts: dict[Any, int] = {}
    for item in planned:
        if item.name.startswith("blk.") and len(item.source.shape) > 1:
            counts[item.type] = counts.get(item.type, 0) + 1
    common = max(counts, key=lambda t: counts[t], default=None)
    named = {Q.Q8_0: LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: LlamaFileType.MOSTLY_Q4_0}
    if common in named:
        return int(named[common])
    field = reader.fields.get("general.file_type")
    return int(field.contents()) if field is not None else int(LlamaFileType.GUESSED)


def _add_tensor(writer: Any, item: PlannedTensor) -> None:
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    tensor = item.source
    if item.type == tensor.tensor_type:
        writer.add_tensor(item.name, tensor.data, raw_dtype=tensor.tensor_type)
        return
    values = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    if item.type == Q.F32:
        writer.add_tensor(item.name, values)
        return
    try:
        writer.add_tensor(item.name, quants.quantize(values, item.type), raw_dtype=item.type)
    except quants.QuantError as error:
        raise ConfigError(
            f"cannot write {tensor.name} ({list(tensor.shape)}) at {item.type.name} ({error}): its rows "
            "are not a whole number of the 32-weight blocks Q8_0 and Q4_0 need; use --format skipsearch"
        ) from None


def check_written(path: Path, planned: Sequence[PlannedTensor], arch: str, blocks: int) -> None:
    """The file as written against the plan: its block count and every tensor's name, type and shape."""
    import gguf

    reader = gguf.GGUFReader(path)
    count = int(_field(reader, f"{arch}.block_count", path))
    found = [(t.name, t.tensor_type, tuple(int(d) for d in t.shape)) for t in reader.tensors]
    meant = [(p.name, p.type, tuple(int(d) for d in p.source.shape)) for p in planned]
    if count != blocks or found != meant:
        differ = next((f"{a} != {b}" for a, b in zip(found, meant, strict=False) if a != b), "")
        raise SkipsearchError(
            f"{path} reads back wrong: {count} blocks for {blocks}, {len(found)} tensors for {len(meant)} "
            f"{differ}".rstrip()
        )


def read_draft_gguf(path: Path, num_layers: int) -> tuple[SkipMask, int]:
    """The mask and γ a draft GGUF records, checked against its tensors: one block per kept layer,
    the blocks numbered 0..n-1 with the same tensors each, vectors at F32, matrices at the type
    the recorded mask and weights choice give."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path} as a GGUF ({error}): export it again") from None
    arch = str(_field(reader, "general.architecture", path))
    mask = SkipMask.parse(str(_field(reader, KEY_MASK, path)), num_layers)
    weights = str(_field(reader, KEY_WEIGHTS, path))
    if weights not in (AUTO, *GGUF_TYPES):
        raise ConfigError(f"{path}: {KEY_WEIGHTS} is {weights!r}, not {AUTO} or {' or '.join(GGUF_TYPES)}")
    layers = [int(x) for x in _field(reader, KEY_LAYERS, path)]
    blocks = int(_field(reader, f"{arch}.block_count", path))
    if layers != kept_layers(mask) or blocks != len(layers):
        raise ConfigError(
            f"{path}: block_count {blocks} and source layers {layers} disagree with mask {mask}: "
            "export it again"
        )
    blocks_found = [(_BLOCK.fullmatch(t.name), t) for t in reader.tensors]
    by_block: dict[int, set[str]] = {}
    for block, _ in (item for item in blocks_found if item[0] is not None):
        by_block.setdefault(int(block[1]), set()).add(block[2])
    if sorted(by_block) != list(range(blocks)) or len({frozenset(s) for s in by_block.values()}) != 1:
        raise ConfigError(f"{path}: its blocks are not numbered 0..{blocks - 1} with the same tensors each")
    for block, tensor in (item for item in blocks_found if item[0] is not None):
        kind = sublayer(block[2])
        wanted = (
            gguf.GGMLQuantizationType.F32
            if len(tensor.shape) == 1
            else weight_type(mask, layers[int(block[1])], kind, weights)
        )
        if wanted is not None and tensor.tensor_type != wanted:
            raise ConfigError(
                f"{path}: {tensor.name} is {tensor.tensor_type.name}, not {wanted.name}: export it again"
            )
    return mask, int(_field(reader, KEY_GAMMA, path))


def source_gguf(model: str, model_source: str | None) -> Path:
    """The GGUF a run's model was loaded from: the file it recorded, else its registry alias's or its
    path's; a model from Hugging Face has none (and no GGUF tokenizer metadata to copy)."""
    from skipsearch.models.loading import resolve_gguf
    from skipsearch.models.registry import REGISTRY

    if model_source and model_source.endswith(".gguf") and Path(model_source).is_file():
        return Path(model_source)
    entry = REGISTRY.get(model)
    if entry is not None and entry.kind != "hub":
        return resolve_gguf(entry)
    if model.endswith(".gguf") and Path(model).expanduser().is_file():
        return Path(model).expanduser()
    raise ConfigError(
        f"format gguf-draft is cut from the model's own GGUF, but {model} was loaded from "
        f"{model_source or model}, not a .gguf file (and a Hugging Face model has no GGUF tokenizer "
        "metadata): convert it with llama.cpp's convert_hf_to_gguf.py, search that file (--model "
        "PATH.gguf) and export that run"
    )
