"""skipsearch's AMX products kernel (`skipsearch/cpu/linear_rows_amx.c`) against its AVX-512
products kernel, at 1, 3 and 5 rows, on a model's decode-step products (issue 19).

A verify of γ + 1 positions costs 1.2-1.3 steps on the project's Xeon (f(4) in
`results/profile/amx-chunks/`), and half of what each extra row adds is the products' arithmetic:
the AVX-512 kernel widens the bf16 weights and does one FMA per weight and row. AMX multiplies a
16 x 32 block of bf16 by 32 x 16 in one instruction whatever the row count up to 16, so the extra
rows would be free, if the tiles streamed the weights as fast as the vector kernel at one row
(the autoregressive baseline must run the fastest one-row kernel, and the verify the same bits as
the steps). This experiment builds both kernels of the package under other names with a harness
(`amx_products.c`), runs one pass of every product of a
decode step (the model's layers' q+k+v, o, gate+up and down, and the LM head; distinct weights
per layer, so each pass reads them from memory), alternating the kernels, and writes each
kernel's median ms a pass with the quartiles, the AMX outputs' bits alone and in a block, and
their distance from a float64 product. The AMX kernel rounds its inputs to bf16, which the
vector kernel's float32 activations do not: choosing it changes the plan's numbers, not only its
speed (`skipsearch.cpu.products_choice` chooses per model).

    python experiments/amx_products.py --model smollm2-135m   # ~1 min
    # -> results/kernels/amx_products-{model}{--suffix}.md

Run it alone on a CPU with AMX (amx_tile, amx_bf16); the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import markdown_table, write_report
from _load import load_line

from skipsearch.cpu.dtypes import cpu_flags
from skipsearch.cpu.native import compiler
from skipsearch.cpu.threads import fit_threads_to_load
from skipsearch.models.random_weights import architecture_config, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "kernels"
HARNESS = Path(__file__).with_name("amx_products.c")
KERNEL = ROOT / "skipsearch" / "models" / "linear_rows.c"
AMX_KERNEL = ROOT / "skipsearch" / "models" / "linear_rows_amx.c"
NEEDED = ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl")
FLAGS = (
    "-O3", "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile",
    "-mamx-bf16", "-fopenmp",
)  # fmt: skip


def step_products(config: dict) -> list[tuple[int, int, int]]:
    """(inputs, outputs, count) of a decode step's products, as the fused layers call them: q, k
    and v in one product, gate and up in one, per layer; the LM head once."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    inner = config["intermediate_size"]
    return [
        (hidden, q + 2 * kv, layers),
        (q, hidden, layers),
        (hidden, 2 * inner, layers),
        (inner, hidden, layers),
        (hidden, config["vocab_size"], 1),
    ]


def build(directory: Path, cc: str) -> Path:
    """The harness linked with the package's kernels renamed `avx512_rows` and `amx_rows`; its path."""
    objects = []
    for source, name in ((KERNEL, "avx512_rows"), (AMX_KERNEL, "amx_rows")):
        renamed = (
            f"-Dlinear_rows={name}",
            f"-Dlinear_rows_lanes={name}_lanes",
            f"-Dlinear_rows_amx_ready={name}_ready",
            # both kernels export shared_core.h's functions (unused here)
            *(f"-Dshared_core_{verb}={name}_{verb}" for verb in ("engage", "disengage", "hold", "counts")),
        )
        objects.append(directory / f"{name}.o")
        subprocess.run([cc, *FLAGS, "-c", *renamed, "-o", str(objects[-1]), str(source)], check=True)
    binary = directory / "amx_products"
    subprocess.run([cc, *FLAGS, "-o", str(binary), str(HARNESS), *map(str, objects)], check=True)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=shipped_configs())
    parser.add_argument("--repeats", type=int, default=15, help="timed passes per kernel and row count")
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    parser.add_argument("--out", type=Path, default=OUT, help="the report's folder")
    args = parser.parse_args()
    missing = [flag for flag in NEEDED if flag not in (cpu_flags() or ())]
    if missing:
        parser.error(f"this CPU lacks {', '.join(missing)}: the AMX kernel needs AMX")
    cc = compiler()
    if cc is None:
        parser.error("no C compiler (cc or gcc) on PATH")
    products = step_products(architecture_config(args.model))
    threads = fit_threads_to_load()
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        binary = build(Path(directory), cc)
        shapes = [str(n) for shape in products for n in shape]
        environment = {**os.environ, "OMP_NUM_THREADS": str(threads.threads), "OMP_PROC_BIND": "close"}
        done = subprocess.run(
            [str(binary), str(args.repeats), *shapes],
            capture_output=True,
            text=True,
            env=environment,
            check=False,
        )
    after = os.getloadavg()
    if done.returncode != 0:
        sys.exit(f"amx_products: the harness failed: {done.stderr.strip()}")
    lines = done.stdout.strip().splitlines()
    times = {}
    for line in lines[:6]:  # "<kernel> rows <n>: <median> ms (<q1>-<q3>)"
        kernel, _, rows, rest = line.split(" ", 3)
        times[kernel, int(rows.rstrip(":"))] = rest.replace(" ms (", " (")
    rows_table = [
        [str(rows), times["avx512", rows], times["amx", rows]] for rows in (1, 3, 5)
    ]  # fmt: skip
    medians = {key: float(value.split()[0]) for key, value in times.items()}
    report = [
        f"# The products on AMX tiles against skipsearch's AVX-512 kernel: {args.model}",
        "",
        f"`{' '.join(['python', 'experiments/amx_products.py', *sys.argv[1:]])}` (see its docstring); "
        f"{threads.reason}. One pass runs every product of a decode step "
        f"({', '.join(f'{n} x {i}→{o}' for i, o, n in products)}), distinct weights per layer; "
        f"median ms a pass of {args.repeats}, the kernels alternating, with the quartiles.",
        "",
        *markdown_table(["rows", "AVX-512 kernel ms", "AMX kernel ms"], rows_table),
        "",
        "AMX ÷ AVX-512 at 1 / 3 / 5 rows: "
        + " / ".join(f"{medians['amx', r] / medians['avx512', r]:.2f}" for r in (1, 3, 5))
        + f"; a pass of 5 rows against one: AVX-512 {medians['avx512', 5] / medians['avx512', 1]:.2f}, "
        f"AMX {medians['amx', 5] / medians['amx', 1]:.2f}.",
        "",
        *(f"- {line[0].upper()}{line[1:]}." for line in lines[6:]),
        "",
        load_line(before, after) + ".",
        "",
    ]
    write_report(args.out / f"amx_products-{args.model}{args.suffix}.md", report)


if __name__ == "__main__":
    main()
