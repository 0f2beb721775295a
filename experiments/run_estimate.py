"""Does `skipsearch run`'s printed cost estimate hold? (issue 60: "within its first minute; on the
embedded model within 25% of the run's actual wall time")

Runs `skipsearch run` as a user would, in a fresh process with a cache of its own that holds only
the calibrated profiles and kernel choices of `--from-cache` (so the model's conversion, the reference
states and the draft copies are all made in the run, as on a first search), and reads each line that
begins `search cost` as it is printed: when it came (seconds since the command started), the total it
predicts, and that total's error against the command's actual wall time.

    .venv/bin/python experiments/run_estimate.py --from-cache ~/.cache/skipsearch --out estimate \\
        -- --model smollm2-135m --space precision --budget 30 --draft-vocab 16384

(the demo's run; ~3 min). Run it alone: the estimate is a timing.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "search_cost"
KEPT = ("profiles", "kernels")  # what a calibrated machine has before its first search
TOTAL = re.compile(r"about ([\d.]+) (s|min|h) in all")
UNIT = {"s": 1, "min": 60, "h": 3600}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from-cache", type=Path, required=True, help="the cache whose profiles and kernels to keep"
    )
    parser.add_argument("--out", help="write results/search_cost/OUT.md")
    parser.add_argument("run", nargs=argparse.REMAINDER, help="-- then `skipsearch run`'s options (no --out)")
    args = parser.parse_args()
    words = [w for w in args.run if w != "--"]
    if "--out" in words or not words:
        sys.exit("run_estimate: give `skipsearch run`'s options after --, without --out")
    with tempfile.TemporaryDirectory(prefix="estimate-") as work:
        cache = Path(work) / "cache"
        cache.mkdir()
        for name in KEPT:
            if (args.from_cache / name).is_dir():
                shutil.copytree(args.from_cache / name, cache / name)
        command = [
            str(ROOT / ".venv" / "bin" / "skipsearch"),
            "run",
            *words,
            "--out",
            str(Path(work) / "run"),
        ]
        env = {**os.environ, "SKIPSEARCH_CACHE": str(cache), "COLUMNS": "250", "PYTHONUNBUFFERED": "1"}
        load_before = os.getloadavg()
        start = time.monotonic()
        seen: list[tuple[float, str]] = []
        with subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as run:
            assert run.stdout is not None
            for line in run.stdout:
                if line.startswith("search cost"):
                    seen.append((time.monotonic() - start, line.strip()))
        wall = time.monotonic() - start
        if run.returncode:
            sys.exit(f"run_estimate: skipsearch run exited {run.returncode}")
    rows = []
    for at, line in seen:
        found = TOTAL.search(line)
        predicted = float(found.group(1)) * UNIT[found.group(2)] if found else None
        error = f"{(predicted - wall) / wall:+.0%}" if predicted else "-"
        rows.append(f"| {at:.0f} s | {line} | {error} |")
    text = "\n".join(
        [
            "# `skipsearch run`'s printed estimate against its wall time",
            "",
            f"Command: `skipsearch run {shlex.join(words)}` in a fresh cache holding only "
            f"{' and '.join(KEPT)}; load average {load_before[0]:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after. "
            f"Wall time of the command: **{wall:.0f} s**.",
            "",
            "| printed at | line | its total against the wall time |",
            "|---:|---|---:|",
            *rows,
            "",
            f"`{shlex.join(['experiments/run_estimate.py', *sys.argv[1:]])}`",
            "",
        ]
    )
    print(text)
    if args.out:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.out}.md").write_text(text)


if __name__ == "__main__":
    main()
