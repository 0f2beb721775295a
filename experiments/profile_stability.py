"""Does `skipsearch profile` repeat? Run the command twice and compare every sub-layer median (issue 3).

Each run is the real command in its own process (`skipsearch profile --model smollm2-135m`, default
settings: 40 samples per entry over 5 fresh processes). For every entry (table, layer, context,
positions) the ratio is the larger median over the smaller. Writes `results/profile/stability.md`
and `stability.csv`: per table the largest, 99th-percentile and median ratio and how many entries
differ by more than 20%, with the load average each run recorded (an idle 2-core CPU reads ~2).

Run: `.venv/bin/python experiments/profile_stability.py [--runs 2]` (about four minutes per run on
two idle cores; stop other work first, as `skipsearch profile` itself says).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from _common import markdown_table

from skipsearch.costmodel import LatencyProfile

MODEL = "smollm2-135m"
OUT = Path(__file__).resolve().parents[1] / "results" / "profile"
TOLERANCE = 1.2  # the bar: two runs within 20% per sub-layer median


def run_profile(out: Path) -> LatencyProfile:
    command = [sys.executable, "-m", "skipsearch", "profile", "--model", MODEL, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return LatencyProfile.load(out)


def ratios(a: LatencyProfile, b: LatencyProfile) -> pd.DataFrame:
    """One row per table: the spread of larger / smaller median over all its entries."""
    rows = []
    for name in LatencyProfile.TABLES:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        ratio = np.maximum(x, y) / np.minimum(x, y)
        rows.append(
            {
                "table": name,
                "entries": ratio.size,
                "max": ratio.max(),
                "p99": np.percentile(ratio, 99),
                "median": np.median(ratio),
                f"over {TOLERANCE:g}": int((ratio > TOLERANCE).sum()),
            }
        )
    return pd.DataFrame(rows)


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of the command; every pair is compared")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        profiles = []
        for index in range(args.runs):
            print(f"run {index + 1}/{args.runs}: skipsearch profile --model {MODEL}", flush=True)
            profiles.append(run_profile(Path(scratch) / f"run{index}.json"))
    frames = []
    for (i, a), (j, b) in itertools.combinations(enumerate(profiles), 2):
        frame = ratios(a, b)
        frame.insert(0, "runs", f"{i + 1} vs {j + 1}")
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "stability.csv", index=False, float_format="%.4f")
    loads = ", ".join(f"{p.meta['load_average']:.2f}" for p in profiles)
    meta = profiles[0].meta
    cells = [[_cell(value) for value in row] for row in table.itertuples(index=False)]
    lines = [
        f"# `skipsearch profile --model {MODEL}` run {args.runs} times",
        "",
        f"{meta['repeats']} samples per entry over {meta['processes']} fresh processes each, "
        f"{meta['threads']} threads; load average at the end of each run: {loads}.",
        f"Ratio = larger / smaller median of the same entry; the bar is {TOLERANCE:g}.",
        "",
        *markdown_table(list(table.columns), cells),
        "",
        f"Largest ratio over all entries: {table['max'].max():.3f}.",
    ]
    (OUT / "stability.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
