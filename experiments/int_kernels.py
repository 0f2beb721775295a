"""Do int8 and int4 weights make a draft step cheaper on this CPU: one row through all of a model's
linear products at bf16 (our kernel), int8 and int4 on our kernel (`cpu.int_linear`) and on
torch's weight-only kernels (`cpu.int_torch`) (the issue "Drafts at lower precision").

A decode step reads every weight once, so int8 should cost half a bf16 step and int4 (float32
scale and zero per group) about 0.28 of it; the goal is int8 <= 0.55 and int4 <= 0.33 of the bf16
step. Every layer has its own random weights of the model's shapes (values do not change the
time), so each product streams its weights from memory as a step does; the layer's products are
called as the fused layers call them (q/k/v together, o, gate/up together, down), with `--head` the
output head too. Configurations are interleaved within each repeat (order alternating); the report
gives the median ms per pass of all products, the spread (min-max over repeats), the weights' GB/s
and the ratio to the bf16 step, for each row count of `--rows`.

    python experiments/int_kernels.py --model smollm2-135m            # ~1 min
    python experiments/int_kernels.py --model qwen2.5-coder-0.5b      # ~2 min, ~2.5 GB of memory

Run it alone; the load average is recorded before and after, and the CPU's model and flags.
Shapes come from the alias's shipped config (`skipsearch/models/configs/`), so any `--model` of
the registry works without its weights; int4 groups are the largest of 128/64/32 that divide each
matrix's inputs unless `--group` says.
"""

from __future__ import annotations

import argparse
import gc
import importlib.resources
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _common import markdown_table
from _load import load_line

from skipsearch.cpu import bf16_weights
from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.bf16_weights import load_kernel as load_bf16_kernel
from skipsearch.cpu.dtypes import cpu_flags, describe_cpu
from skipsearch.cpu.int_linear import INT4, INT8, Int4Linear, Int8Linear, builds
from skipsearch.cpu.int_torch import TorchInt4Linear, TorchInt8Linear, available
from skipsearch.cpu.int_weights import GROUPS, quantize_int4, quantize_int8
from skipsearch.cpu.native import load_native

CONFIGS = ("bf16 ours", "int8 ours", "int4 ours", "int8 torch", "int4 torch")
AVX2 = 8  # `--avx2`: our kernels' 8-float builds (the AVX2-only EPYCs' path), on a CPU that has wider


class Bf16Avx2(torch.nn.Module):
    """`Bf16WeightLinear`'s product on the AVX2 build of `linear_rows.c` (`--avx2`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = bf16_weights.pack_weight(weight, AVX2)
        self.function = load_native(bf16_weights.SOURCES[-1]).function

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.numel() // self.in_features
        return bf16_weights.multiply(self.function, hidden, rows, self.packed, self.out_features, None)

    def packed_bytes(self) -> int:
        return self.packed.numel() * 2


def model_shapes(model: str, head: bool) -> tuple[list[tuple[int, int]], int]:
    """`[(out, in)]` of one decoder layer's products as the fused layers call them, and the layers;
    with `head`, the output head is one more product (counted once, as a last 'layer' of its own)."""
    text = importlib.resources.files("skipsearch.models.configs").joinpath(f"{model}.json").read_text()
    config = json.loads(text)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    head_dim = config.get("head_dim") or hidden // heads
    shapes = [
        ((heads + 2 * kv_heads) * head_dim, hidden),
        (hidden, heads * head_dim),
        (2 * inter, hidden),
        (hidden, inter),
    ]
    extra = [(config["vocab_size"], hidden)] if head else []
    return shapes + extra, config["num_hidden_layers"]


def loads(kind: str, width: int | None) -> bool:
    """Whether our `kind` kernel has a build of `width` floats here (None: any)."""
    return width in builds(kind) if width else bool(builds(kind))


def group_for(inputs: int, requested: int | None) -> int:
    return requested or next(group for group in sorted(GROUPS, reverse=True) if inputs % group == 0)


def build(
    shapes: list[tuple[int, int]],
    layers: int,
    head: bool,
    group: int | None,
    configs: tuple[str, ...],
    width: int | None = None,
) -> dict[str, list[torch.nn.Module]]:
    """Every configuration's copies of every layer's products (the head once), each from its own
    random weights, quantized once for both int8 kernels and once for both int4 ones; ours on the
    builds of `width` floats (None: the widest)."""
    built: dict[str, list[torch.nn.Module]] = {name: [] for name in configs}
    generator = torch.Generator().manual_seed(0)
    per_layer = shapes[:-1] if head else shapes
    matrices = [shape for _ in range(layers) for shape in per_layer] + ([shapes[-1]] if head else [])
    for out, inputs in matrices:
        weight = torch.randn(out, inputs, generator=generator) * inputs**-0.5
        if "bf16 ours" in built:
            built["bf16 ours"].append(Bf16WeightLinear(weight, None) if width is None else Bf16Avx2(weight))
        if {"int8 ours", "int8 torch"} & set(built):
            q8 = quantize_int8(weight)
            if "int8 ours" in built:
                built["int8 ours"].append(Int8Linear(weight, None, q8, width))
            if "int8 torch" in built:
                built["int8 torch"].append(TorchInt8Linear(weight, None, q8))
        if {"int4 ours", "int4 torch"} & set(built):
            q4 = quantize_int4(weight, group_for(inputs, group))
            if "int4 ours" in built:
                built["int4 ours"].append(Int4Linear(weight, None, quantized=q4, width=width))
            if "int4 torch" in built:
                built["int4 torch"].append(TorchInt4Linear(weight, None, quantized=q4, keep=False))
        del weight
    gc.collect()
    return built


def timed(modules: list[torch.nn.Module], row_counts: tuple[int, ...]) -> Callable[[int], float]:
    """A pass of `modules` over `rows` rows (contiguous inputs made beforehand), in seconds."""
    inputs = {
        (rows, m.in_features): torch.randn(1, rows, m.in_features) for rows in row_counts for m in modules
    }
    calls = {rows: [(m, inputs[rows, m.in_features]) for m in modules] for rows in row_counts}

    def run(rows: int) -> float:
        began = time.perf_counter()
        for module, hidden in calls[rows]:
            module(hidden)
        return time.perf_counter() - began

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="a registry alias (its shipped config's shapes)"
    )
    parser.add_argument("--repeats", type=int, default=9, help="timed passes of each configuration")
    parser.add_argument("--rows", default="1", help="row counts, comma-separated (1: a draft step)")
    parser.add_argument(
        "--group", type=int, choices=GROUPS, help="int4 group (default: the largest dividing)"
    )
    parser.add_argument("--head", action="store_true", help="the output head too")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which, comma-separated")
    parser.add_argument("--avx2", action="store_true", help="our kernels' AVX2 builds (on an AVX-512 CPU)")
    parser.add_argument(
        "--layers", type=int, help="fewer layers than the model's (a smoke run: all in cache)"
    )
    parser.add_argument("--out", type=Path, help="also write the report here (Markdown)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    row_counts = tuple(int(r) for r in args.rows.split(","))
    configs = tuple(name.strip() for name in args.configs.split(","))
    width = AVX2 if args.avx2 else None
    bf16 = load_native(bf16_weights.SOURCES[-1]) if args.avx2 else load_bf16_kernel()
    missing = {
        "bf16 ours": bf16.reason if bf16.function is None else None,
        "int8 ours": None if loads(INT8, width) else "no such build of the int8 kernel loads",
        "int4 ours": None if loads(INT4, width) else "no such build of the int4 kernel loads",
        "int8 torch": available(),
        "int4 torch": available(),
    }
    skipped = {name: missing[name] for name in configs if missing.get(name)}
    configs = tuple(name for name in configs if name not in skipped)
    load_before = os.getloadavg()
    shapes, layers = model_shapes(args.model, args.head)
    layers = min(layers, args.layers or layers)
    print(f"building {len(configs)} configurations of {layers} layers of {shapes} ...", flush=True)
    built = build(shapes, layers, args.head, args.group, configs, width)
    weight_bytes = {name: sum(int(m.packed_bytes()) for m in modules) for name, modules in built.items()}
    runs = {name: timed(modules, row_counts) for name, modules in built.items()}
    samples: dict[tuple[str, int], list[float]] = {
        (name, rows): [] for name in configs for rows in row_counts
    }
    with torch.no_grad():
        for repeat in range(args.repeats + 2):  # two warm-up passes
            order = configs if repeat % 2 else configs[::-1]
            for rows in row_counts:
                for name in order:
                    seconds = runs[name](rows)
                    if repeat >= 2:
                        samples[name, rows].append(seconds)
    load_after = os.getloadavg()
    flags = cpu_flags() or frozenset()
    table = []
    for rows in row_counts:
        bf16_samples = samples.get(("bf16 ours", rows))
        for name in configs:
            values = samples[name, rows]
            median = statistics.median(values)
            ratios = (
                ("n/a", "n/a")
                if not bf16_samples
                else (
                    f"{median / statistics.median(bf16_samples):.3f}",
                    f"{min(values) / min(bf16_samples):.3f}",
                )
            )
            table.append(
                [
                    name,
                    str(rows),
                    f"{weight_bytes[name] / 1e6:.1f}",
                    f"{1e3 * median:.2f}",
                    f"{1e3 * min(values):.2f}-{1e3 * max(values):.2f}",
                    f"{weight_bytes[name] / median / 1e9:.1f}",
                    *ratios,
                ]
            )
    groups = sorted({group_for(inputs, args.group) for _, inputs in shapes})
    lines = [
        f"# int8 and int4 weight-only products: {args.model}",
        "",
        f"`python experiments/int_kernels.py --model {args.model} --repeats {args.repeats} --rows {args.rows}"
        f"{' --head' if args.head else ''}{f' --group {args.group}' if args.group else ''}"
        f"{f' --threads {args.threads}' if args.threads else ''}{' --avx2' if args.avx2 else ''}"
        f"{f' --layers {args.layers}' if args.layers else ''}`.",
        "",
        f"CPU: {describe_cpu()}; AMX {'exposed' if 'amx_tile' in flags else 'not exposed'}; "
        f"vector flags: {' '.join(sorted(f for f in flags if f.startswith(('avx', 'amx', 'fma'))))}. "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s). Our int builds: "
        f"int8 {sorted(builds(INT8))} floats wide, int4 {sorted(builds(INT4))}; "
        + ("the AVX2 builds (8 floats) ran, bf16's too (`--avx2`)." if args.avx2 else "the widest ran."),
        "",
        f"{layers} layers of products {', '.join(f'{o}x{i}' for o, i in shapes)} (out x in), each layer "
        f"its own weights; int4 groups of {'/'.join(map(str, groups))} with float32 scale and zero. "
        "ms per pass of all products (median of the repeats, min-max), the bytes a pass reads over the "
        "median, the median over bf16's at the same rows, and the fastest pass over bf16's fastest (the "
        "steadier of the two on a busy machine).",
        "",
        *markdown_table(
            ["configuration", "rows", "MB read", "ms", "spread ms", "GB/s", "÷ bf16", "fastest ÷ bf16's"],
            table,
        ),
        "",
        *(f"Not measured: {name} ({reason})." for name, reason in skipped.items()),
        load_line(load_before, load_after) + ".",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
