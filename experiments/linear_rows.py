"""What a verify's extra rows cost in the linear layers on this CPU, projection by projection (issue 19).

`f(γ)`, a verify of γ + 1 positions over one step, is the one number the SSD round pays for
speculating. On the kernel plan a bf16 product packed for oneDNN reads its weights once whatever
the rows, so a verify should cost a step plus the rows' arithmetic. This experiment checks that
where it happens: each of the model's own projections (`q_proj`, ..., `down_proj`, the head), with
the plan's packed weights, for 1 to 5 rows, every layer's copy called in turn so that each call
reads its weights from memory as a decode step does. The row counts are interleaved within each
repeat (order alternating); the report gives the median µs per call, its ratio to one row, the
weights' GB/s at one row, and the whole model's extra ms per extra row.

    python experiments/linear_rows.py --model smollm2-135m   # ~1 min; results/kernels/linear_rows-*.md

Run it alone; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _common import markdown_table
from _load import load_line

from skipsearch.cpu.packed import pack_linears
from skipsearch.models.loading import load_model
from skipsearch.models.runner import LayerwiseRunner

OUT = Path(__file__).resolve().parents[1] / "results" / "kernels"
ROWS = (1, 2, 3, 4, 5)


def matrix_bytes(module: torch.nn.Module) -> int:
    """The bytes a call reads of the module's matrix: its packed copy where it has one (oneDNN's,
    or the bf16 kernel's), else the plain weight."""
    if hasattr(module, "packed_bytes"):
        return int(module.packed_bytes())
    return module.weight.numel() * module.weight.element_size()


def projections(runner: LayerwiseRunner) -> dict[str, list[torch.nn.Module]]:
    """Each projection name of a decoder layer -> that projection in every layer, plus the head."""
    found: dict[str, list[torch.nn.Module]] = {}
    for layer in runner.layers:
        for name, module in layer.named_modules():
            if name.endswith("_proj"):
                found.setdefault(name.rsplit(".", 1)[-1], []).append(module)
    found["lm_head"] = [runner.model.get_output_embeddings()]
    return found


def per_call_seconds(
    modules: list[torch.nn.Module], repeats: int, dtype: torch.dtype, row_counts: tuple[int, ...]
) -> dict[int, float]:
    """Median seconds per call at each row count, the row counts interleaved in every repeat."""
    width = modules[0].in_features
    inputs = {rows: torch.randn(1, rows, width, dtype=dtype) * 0.1 for rows in row_counts}
    samples: dict[int, list[float]] = {rows: [] for rows in row_counts}
    with torch.no_grad():
        for repeat in range(repeats + 2):
            for rows in row_counts if repeat % 2 else tuple(reversed(row_counts)):
                began = time.perf_counter()
                for module in modules:
                    module(inputs[rows])
                if repeat >= 2:
                    samples[rows].append((time.perf_counter() - began) / len(modules))
    return {rows: statistics.median(values) for rows, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--dtype", default="auto", help="the kernel plan's dtype (default auto)")
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU, dtype)")
    parser.add_argument(
        "--pack",
        action="store_true",
        help="pack every weight for oneDNN, whatever the plan (fp32 on a CPU without bf16)",
    )
    parser.add_argument(
        "--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated, from 1"
    )
    args = parser.parse_args()
    row_counts = tuple(int(r) for r in args.rows.split(","))
    load_before = os.getloadavg()
    loaded = load_model(args.model, dtype=args.dtype)
    if args.pack:
        loaded.plan += (
            f"; {pack_linears(loaded.model, force=True)} weight matrices packed for oneDNN by --pack"
        )
    runner = LayerwiseRunner(loaded.model)
    rows_table, extra = [], {rows: 0.0 for rows in row_counts}
    for name, modules in projections(runner).items():
        seconds = per_call_seconds(modules, args.repeats, loaded.model.dtype, row_counts)
        weight_bytes = matrix_bytes(modules[0])
        calls = len(runner.layers) if name != "lm_head" else 1
        for rows in row_counts:
            extra[rows] += calls * (seconds[rows] - seconds[1])
        rows_table.append(
            [
                f"`{name}` {modules[0].in_features}→{modules[0].out_features}",
                *(f"{1e6 * seconds[r]:.0f} ({seconds[r] / seconds[1]:.2f})" for r in row_counts),
                f"{weight_bytes / seconds[1] / 1e9:.1f}",
            ]
        )
        print(rows_table[-1], flush=True)
    lines = [
        f"# The linear layers against the rows of a pass: {args.model}",
        "",
        f"`python experiments/linear_rows.py --model {args.model} --repeats {args.repeats} --dtype "
        f"{args.dtype}{' --pack' if args.pack else ''} --rows {args.rows}"
        f"{f' --suffix={args.suffix}' if args.suffix else ''}`. Kernel plan: {loaded.plan}.",
        "",
        *markdown_table(
            [
                "projection",
                *(f"{r} row{'s' if r > 1 else ''} µs (÷ 1 row)" for r in row_counts),
                "GB/s at 1 row",
            ],
            rows_table,
        ),
        "",
        "Extra ms a whole pass spends in these products over one row (every layer's projections "
        "and the head): " + ", ".join(f"{r} rows {1e3 * extra[r]:+.2f}" for r in row_counts[1:]) + ".",
        "",
        load_line(load_before, os.getloadavg()) + ".",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"linear_rows-{args.model}{args.suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
