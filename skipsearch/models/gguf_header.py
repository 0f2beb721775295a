"""A GGUF's header and tensor table read without its weights, to tell a whole file from one cut
short or damaged before the slow conversion starts.

transformers' GGUF reader meets a truncated file deep inside (`unpack_from requires a buffer of at
least 101 bytes`, `cannot reshape array`), after its conversion began; the gguf package's reader
builds every tensor and takes seconds. The layout is small (GGUF v2/v3: magic, version, counts,
key-value metadata, tensor infos, aligned tensor data), so it is walked here in a fraction of a
second, and the file's size checked against the end of its last tensor.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from skipsearch.errors import ModelLoadError

MAGIC = b"GGUF"
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"


class _Truncated(Exception):
    """The table runs past the end of the file."""


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise _Truncated
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_value(self, kind: int) -> int | None:
        """Skip one metadata value; its integer when it is one (for the alignment)."""
        if kind in _SCALARS:
            raw = self.take(_SCALARS[kind])
            return int.from_bytes(raw, "little") if kind in (4, 10) else None
        if kind == _STRING:
            self.string()
            return None
        if kind == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _SCALARS:
                self.take(_SCALARS[item] * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
            return None
        raise ValueError(f"metadata value type {kind} is not a GGUF type")


def check_gguf_file(path: Path) -> None:
    """One `ModelLoadError` naming `path`, what is wrong and what to do, for a file that is not a
    whole GGUF: too short for its header, metadata or tensor table, a value of no GGUF type, or
    shorter than its last tensor's end."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size < 24:
            raise _truncated(path, size, 24)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = _tensor_data_end(path, data)
    if end > size:
        raise _truncated(path, size, end)


def _tensor_data_end(path: Path, data: mmap.mmap) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    cursor = _Cursor(data)
    try:
        if cursor.take(4) != MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic bytes): pass a .gguf model file")
        version = cursor.u32()
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not 2 or 3")
        tensors, keys = cursor.u64(), cursor.u64()
        alignment = 32
        for _ in range(keys):
            key = cursor.string()
            value = cursor.skip_value(cursor.u32())
            if key == _ALIGNMENT_KEY.encode() and value:
                alignment = value
        ends = []
        for _ in range(tensors):
            cursor.string()
            dims = [cursor.u64() for _ in range(cursor.u32())]
            kind, offset = cursor.u32(), cursor.u64()
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            elements = 1
            for dim in dims:
                elements *= dim
            ends.append(offset + elements // block * block_bytes)
    except _Truncated:
        raise _truncated(path, len(data), None) from None
    except (ValueError, KeyError) as error:
        raise ModelLoadError(f"{path} is damaged ({error} at byte {cursor.at}): download it again") from None
    start = -(-cursor.at // alignment) * alignment
    return start + max(ends, default=0)


def _truncated(path: Path, size: int, needed: int | None) -> ModelLoadError:
    needs = "" if needed is None else f", its tensors need {needed:,}"
    return ModelLoadError(
        f"{path} is truncated: the file ends at byte {size:,}{needs}; download it again (a copy cut short "
        "in transit or by a full disk)"
    )
