"""`skipsearch report RUN`: regenerate tables and plots from a run directory (no model needed)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="tables and plots of a run directory")
    parser.add_argument("run_dir", help="a directory written by `skipsearch run` or `compare`")
    parser.add_argument(
        "--study", help="one study of a `compare` directory, e.g. learned-s0 (report in RUN/studies/NAME)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.run.owner import check_read_only
    from skipsearch.run.report import study_dir, write_run_outputs
    from skipsearch.store import BEST_FILE, SUMMARY_FILE, TRIALS_TABLE, check_output_dir

    run_dir = Path(args.run_dir)
    out = study_dir(run_dir, args.study)
    if run_dir.is_dir():  # the report is rewritten in place: a directory it cannot write fails first
        check_read_only(run_dir, "report")
        check_output_dir(out, "the run directory")
    report = write_run_outputs(run_dir, args.study)
    print(report.text)
    print(f"rewrote {TRIALS_TABLE}, {BEST_FILE}, {SUMMARY_FILE} and plots in {out}")
    return 0
