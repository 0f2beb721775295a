"""Carry a GGUF to the GPU machine in parts (issue 23): `split` here, `join` there.

    python experiments/gguf_parts.py split            # the embedded SmolLM2 GGUF -> .gguf-parts/
    python experiments/gguf_parts.py join --to FILE   # .gguf-parts/ -> FILE, every sha256 checked

`make gguf-parts` runs the split. The parts (at most 45 MiB each) and their manifest go under the
ignored `.gguf-parts/`, so a device call carries them as an ignored path (`carry`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skipsearch.errors import SkipsearchError
from skipsearch.models.gguf_parts import MANIFEST, join_parts, split_file
from skipsearch.models.loading import resolve_gguf
from skipsearch.models.registry import REGISTRY

PARTS = Path(__file__).resolve().parents[1] / ".gguf-parts"


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
