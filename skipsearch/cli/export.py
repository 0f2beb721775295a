"""`skipsearch export RUN|best.json`: engine configs for a run's best draft (no model needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from skipsearch.models.gguf_draft import GGUF_TYPES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="engine configs (skipsearch, HF, Draft & Verify, LayerSkip) or a llama.cpp draft GGUF for "
        "a run's best mask",
        description="Write the best draft of a run in the formats other engines read; every file is read "
        "back to check it, and README.md says what each engine can and cannot express.",
    )
    parser.add_argument("run", help="a run directory (`skipsearch run --out`) or its best.json")
    parser.add_argument(
        "--format",
        choices=("skipsearch", "hf", "skip-layers", "layerskip", "gguf-draft", "all"),
        default="all",
        help="which config to write (default all: every config the run's masks allow; gguf-draft, "
        "the draft as a GGUF for llama.cpp's -md, only when named)",
    )
    parser.add_argument(
        "--gguf-type",
        choices=GGUF_TYPES,
        help="gguf-draft: every kept layer's weights at this type (default: each sub-layer at the draft's "
        "precision, int8 as q8_0, int4 as q4_0, full at the model's own type)",
    )
    parser.add_argument("--out", help="directory for the files (default RUN/exports)")
    parser.add_argument("--study", help="one study of a `compare` directory, e.g. learned-s0")
    parser.add_argument(
        "--export-key",
        metavar="KEY",
        help="the key of skip_layers.json (default: the model name, for Draft & Verify, and "
        "MODEL_TASK, for SWIFT)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.run.export import check_export_dir, export
    from skipsearch.run.export_source import load_source
    from skipsearch.run.owner import check_read_only
    from skipsearch.run.report import study_dir
    from skipsearch.store import EXPORT_README

    if args.out:  # before the run is read
        check_export_dir(Path(args.out))
    if Path(args.run).is_dir():
        check_read_only(Path(args.run), "export")
    source = load_source(Path(args.run), args.study, args.export_key, args.gguf_type)
    run_dir = source.run_dir or source.path.parent
    out = Path(args.out) if args.out else study_dir(run_dir, args.study) / "exports"
    for item in export(source, [args.format], out):
        what = f"mask {item.draft.mask} γ={item.draft.gamma}" if item.draft else "tier set"
        print(f"{item.format:<12} {item.path}  read back OK  ({what})")
    print(f"what each engine can and cannot express: {out / EXPORT_README}")
    return 0
