"""The products' kernel built 16 floats wide (AVX-512) against its AVX2 build, paired in one process.

`linear_rows.c` is one source with two builds (`cpu.bf16_weights.SOURCES`): where the CPU has
AVX-512 the plan loads the wide one. This experiment times both on a decoder layer's products, each
build on its own packed layout (`pack_weight(weight, lanes)`), at 1 to 5 rows: SmolLM2's seven
projections through 16 layers' weights and Qwen2.5-Coder's through 4 (random weights, so every call
reads its weights from memory as a step does). The builds alternate repeat by repeat (the order
flips); the report gives each build's median µs per layer, its interquartile range, and the ratio
wide ÷ AVX2 of the medians, with the largest difference between the two builds' outputs (they sum
in another order: rounding, not bits).

    python experiments/linear_widths.py   # ~1 min; results/kernels/linear_widths{--suffix}.md

Run it alone on a CPU with AVX-512; the load average is recorded before and after.
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

from skipsearch.cpu import bf16_weights
from skipsearch.cpu.native import load_native

OUT = Path(__file__).resolve().parents[1] / "results" / "kernels"


def layer_shapes(hidden: int, kv_width: int, intermediate: int) -> tuple[tuple[int, int], ...]:
    """(inputs, outputs) of a decoder layer's products: q, k, v, o, gate, up, down."""
    q, kv, up, down = (hidden, hidden), (hidden, kv_width), (hidden, intermediate), (intermediate, hidden)
    return q, kv, kv, q, up, up, down


# Each model's layer, and how many layers' weights are streamed.
LAYERS = {
    "smollm2-135m": (layer_shapes(576, 192, 1536), 16),
    "qwen2.5-coder-0.5b": (layer_shapes(896, 128, 4864), 4),
}
ROWS = (1, 2, 3, 4, 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    args = parser.parse_args()
    wide_source, narrow_source = bf16_weights.SOURCES
    builds = {"AVX-512": load_native(wide_source), "AVX2": load_native(narrow_source)}
    for name, library in builds.items():
        if library.function is None:
            parser.error(f"the {name} build does not load here: {library.reason}")
    before = os.getloadavg()
    generator = torch.Generator().manual_seed(0)
    table = []
    for model, (shapes, layers) in LAYERS.items():
        weights = [torch.randn(o, i, generator=generator) for _ in range(layers) for i, o in shapes]
        packed = {
            name: [bf16_weights.pack_weight(w, library.handle.linear_rows_lanes()) for w in weights]
            for name, library in builds.items()
        }
        for rows in ROWS:
            inputs = {i: torch.randn(1, rows, i, generator=generator) for i, _ in shapes}
            seconds: dict[str, list[float]] = {name: [] for name in builds}
            outputs: dict[str, torch.Tensor] = {}
            for repeat in range(args.repeats + 1):
                for name in builds if repeat % 2 else reversed(builds):
                    function = builds[name].function
                    began = time.perf_counter()
                    for weight, matrix in zip(weights, packed[name], strict=True):
                        out, width = weight.shape
                        x = inputs[width]
                        outputs[name] = bf16_weights.multiply(function, x, rows, matrix, out, None)
                    if repeat:  # the first round warms both builds up
                        seconds[name].append((time.perf_counter() - began) / layers * 1e6)
            medians = {name: statistics.median(times) for name, times in seconds.items()}
            spreads = {name: statistics.quantiles(times, n=4) for name, times in seconds.items()}
            difference = (outputs["AVX-512"] - outputs["AVX2"]).abs().max().item()
            table.append(
                [model, str(rows)]
                + [f"{medians[name]:.0f} ({spreads[name][2] - spreads[name][0]:.0f})" for name in builds]
                + [f"{medians['AVX-512'] / medians['AVX2']:.2f}", f"{difference:.1e}"]
            )
            print(table[-1])
    after = os.getloadavg()
    OUT.mkdir(parents=True, exist_ok=True)
    report = [
        "# The products' kernel: the AVX-512 build against the AVX2 build",
        "",
        f"`python experiments/linear_widths.py --repeats {args.repeats}"
        f"{f' --suffix={args.suffix}' if args.suffix else ''}` (see its docstring); "
        f"{torch.get_num_threads()} threads.",
        "",
        *markdown_table(
            [
                "model",
                "rows",
                "AVX-512 µs a layer (IQR)",
                "AVX2 µs a layer (IQR)",
                "AVX-512 ÷ AVX2",
                "largest difference",
            ],
            table,
        ),
        "",
        load_line(before, after) + ".",
    ]
    path = OUT / f"linear_widths{args.suffix}.md"
    path.write_text("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
