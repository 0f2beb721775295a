"""Carry a GGUF to the GPU machine in parts (issue 23): `split` here, `join` there.

    python experiments/gguf_parts.py split            # the embedded SmolLM2 GGUF -> .gguf-parts/
    python experiments/gguf_parts.py join --to FILE   # .gguf-parts/ -> FILE, every sha256 checked

The GPU machine has no network and a device call carries at most 64 MiB together with the working
tree (itself ~34 MiB, results/ holding most), so a part must fit beside the tree: SmolLM2's 94 MiB
GGUF goes over in parts of at most 28 MiB (`PART_BYTES`), four calls' worth, with a manifest of
sha256 sums. `make gguf-parts` runs the split; the parts and their manifest go under the ignored
`.gguf-parts/`, so a device call carries them as an ignored path (`carry`).
`experiments/gpu_real_weights.py --gguf-parts` joins them there.

`join_parts` checks each part and the whole before it writes the file, and refuses a mismatch in
one line: a part cut short or mixed up in transit would otherwise load as a corrupt model, or fail
deep inside the GGUF reader.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from skipsearch.errors import ModelLoadError, SkipsearchError
from skipsearch.models.loading import file_sha256, resolve_gguf
from skipsearch.models.registry import REGISTRY
from skipsearch.store import atomic_path, write_text_atomic

PARTS = Path(__file__).resolve().parents[1] / ".gguf-parts"
MANIFEST = "manifest.json"
PART_BYTES = 28 * 2**20


def split_file(path: Path, out_dir: Path, part_bytes: int = PART_BYTES) -> Path:
    """Cut `path` into `out_dir/<name>.partNN` of at most `part_bytes` each; returns the manifest."""
    if part_bytes < 1:
        raise ValueError(f"part size must be positive, got {part_bytes}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(f"{path.name}.part*"):
        stale.unlink()
    parts = []
    with path.open("rb") as source:
        for index, chunk in enumerate(iter(lambda: source.read(part_bytes), b"")):
            part = out_dir / f"{path.name}.part{index:02d}"
            with atomic_path(part) as staging:
                staging.write_bytes(chunk)
            parts.append(
                {"file": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()}
            )
    manifest = {"name": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path), "parts": parts}
    return write_text_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=1))


def join_parts(manifest_path: Path, target: Path) -> Path:
    """Join the parts `manifest_path` lists into `target`, checking every part's sha256 and the
    whole file's; on any mismatch nothing is written and a one-line ModelLoadError names it."""
    try:
        manifest = json.loads(manifest_path.read_text())
        listed = [(part["file"], part["sha256"]) for part in manifest["parts"]]
        whole = manifest["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"cannot read the GGUF parts manifest {manifest_path}: {error}") from None
    for name, sha256 in listed:
        part = manifest_path.parent / name
        if not part.is_file():
            raise ModelLoadError(f"GGUF part {part} is missing: carry every part the manifest lists")
        if file_sha256(part) != sha256:
            raise ModelLoadError(f"GGUF part {part} fails its sha256 check: carry it again")
    with atomic_path(target) as staging:
        with staging.open("wb") as joined:
            for name, _ in listed:
                with (manifest_path.parent / name).open("rb") as handle:
                    shutil.copyfileobj(handle, joined)
        if file_sha256(staging) != whole:
            raise ModelLoadError(f"the GGUF joined from {manifest_path.parent} fails its sha256 check")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["split", "join"])
    parser.add_argument("--model", default="smollm2-135m", help="registry alias whose GGUF to split")
    parser.add_argument("--parts", type=Path, default=PARTS, help="folder of the parts and manifest")
    parser.add_argument("--to", type=Path, help="where join writes the GGUF")
    args = parser.parse_args()
    try:
        if args.action == "split":
            manifest = split_file(resolve_gguf(REGISTRY[args.model]), args.parts)
            print(f"wrote {manifest} and its parts")
        else:
            if args.to is None:
                parser.error("join needs --to FILE")
            print(f"joined {join_parts(args.parts / MANIFEST, args.to)}")
    except SkipsearchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
