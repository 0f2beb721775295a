"""`experiments/gguf_parts.py`: a GGUF cut into parts and joined back: the bytes survive, and a damaged
part is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.gguf_parts import MANIFEST, join_parts, split_file
from skipsearch.errors import ModelLoadError


@pytest.fixture
def original(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * 41 + b"tail")  # 10,500 bytes: not a multiple of the part size
    return path


def test_split_and_join_give_the_same_bytes(original: Path, tmp_path: Path) -> None:
    manifest = split_file(original, tmp_path / "parts", part_bytes=4000)
    listed = json.loads(manifest.read_text())["parts"]
    assert [p["bytes"] for p in listed] == [4000, 4000, 2500]
    joined = join_parts(manifest, tmp_path / "joined.gguf")
    assert joined.read_bytes() == original.read_bytes()


@pytest.mark.parametrize("damage", ["flip a byte", "drop a part"])
def test_a_damaged_part_is_refused_and_nothing_is_written(
    original: Path, tmp_path: Path, damage: str
) -> None:
    split_file(original, tmp_path / "parts", part_bytes=4000)
    part = tmp_path / "parts" / "model.gguf.part01"
    if damage == "flip a byte":
        data = bytearray(part.read_bytes())
        data[10] ^= 1
        part.write_bytes(bytes(data))
    else:
        part.unlink()
    with pytest.raises(ModelLoadError, match="part01"):
        join_parts(tmp_path / "parts" / MANIFEST, tmp_path / "joined.gguf")
    assert not (tmp_path / "joined.gguf").exists()
