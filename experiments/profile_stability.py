"""Does `skipsearch profile` repeat? Run the command twice and compare every sub-layer median (issue 3).

Each run is the real command in its own process (`skipsearch profile --model smollm2-135m`, default
settings: 40 samples per entry over 10 fresh processes). For every entry (table, layer, context,
positions) the ratio is the larger median over the smaller. Writes `results/profile/stability.md`
and `stability.csv`: per table the largest, 99th-percentile and median ratio and how many entries
differ by more than 20%, with the load average each run recorded (an idle 2-core CPU reads ~2),
and each run's profile as `results/profile/stability/run<i>.json`.

Run: `.venv/bin/python experiments/profile_stability.py [--runs 2]` (three to four minutes per run
on two idle cores; stop other work first, as `skipsearch profile` itself says); `--report-only`
recomputes the tables from the saved profiles.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from _common import markdown_table

from skipsearch.cost.latency import LatencyProfile

MODEL = "smollm2-135m"
OUT = Path(__file__).resolve().parents[1] / "results" / "profile"
RUNS = OUT / "stability"
TOLERANCE = 1.2  # the bar: two runs within 20% per sub-layer median


def run_profile(out: Path) -> None:
    command = [sys.executable, "-m", "skipsearch", "profile", "--model", MODEL, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


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


def by_positions(a: LatencyProfile, b: LatencyProfile) -> list[list[str]]:
    """The largest attention and MLP ratio at each number of new positions, over layers and contexts."""
    rows = []
    for index, positions in enumerate(a.positions):
        worst = []
        for name in ("attn", "mlp"):
            x, y = np.asarray(getattr(a, name))[:, :, index], np.asarray(getattr(b, name))[:, :, index]
            worst.append(f"{(np.maximum(x, y) / np.minimum(x, y)).max():.3f}")
        rows.append([str(positions), *worst])
    return rows


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of the command; every pair is compared")
    parser.add_argument("--report-only", action="store_true", help="tables from the saved profiles")
    args = parser.parse_args()
    paths = [RUNS / f"run{index + 1}.json" for index in range(args.runs)]
    if not args.report_only:
        RUNS.mkdir(parents=True, exist_ok=True)
        for index, path in enumerate(paths):
            print(f"run {index + 1}/{args.runs}: skipsearch profile --model {MODEL}", flush=True)
            run_profile(path)
    profiles = [LatencyProfile.load(path) for path in paths]
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
        "Each process's median full pass (shortest context, most positions), in ms, shows its speed draw:",
        "",
        *(f"- run {i + 1}: {', '.join(map(str, p.meta['process_pass_ms']))}" for i, p in enumerate(profiles)),
        "",
        *markdown_table(list(table.columns), cells),
        "",
        f"Largest ratio over all entries: {table['max'].max():.3f}.",
        "",
        "Largest ratio per number of new positions (runs 1 vs 2):",
        "",
        *markdown_table(["positions", "attn", "mlp"], by_positions(profiles[0], profiles[1])),
    ]
    (OUT / "stability.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
