"""Do int8 and int4 weights make a draft step cheaper on this CPU: one row through all of a model's
linear products at bf16 (our kernel), int8 and int4 on our kernel (`cpu.int_linear`) and on
torch's weight-only kernels (`cpu.int_torch`) (the issue "Drafts at lower precision").

A decode step reads every weight once, so int8 should cost half a bf16 step and int4 (float32
scale and zero per group of 128) about 0.27 of it; the goal is int8 <= 0.55 and int4 <= 0.33 of the bf16
step. Every layer has its own random weights of the model's shapes (values do not change the
time), so each product streams its weights from memory as a step does; the layer's products are
called as the fused layers call them (q/k/v together, o, gate/up together, down), with `--head` the
output head too. Configurations are interleaved within each repeat (order alternating); the report
gives the median ms per pass of all products, the spread (min-max over repeats), the weights' GB/s
and the ratio to the bf16 step, for each row count of `--rows`. `--direct` calls the kernels
themselves with their arguments made beforehand: at int4 a pass of SmolLM2's 120 products reads
59 MB, ~1.6 ms at 37 GB/s, against ~0.8 ms of the modules' Python, so the modules' ratio is not the
kernels' (a fused C layer calls the kernels as `--direct` does).

    python experiments/int_kernels.py --model smollm2-135m            # ~1 min
    python experiments/int_kernels.py --model qwen2.5-coder-0.5b      # ~2 min, ~2.5 GB of memory
    python experiments/int_kernels.py --model smollm2-135m --fused    # ~1 min: whole draft steps

`--fused` times what a draft step costs, not the products alone: one row through the whole model
(random weights of its config, every layer its own, on the fp32 fallback plan: bf16 weights,
float32 activations, the kernel norms, rotary, SiLU and decode attention) on its fused bf16 layers
(`cpu.fused_layers`) against the same model's layers fused at int8 and at int4
(`fused_layers.lower_precision_layer`: only the products change), interleaved. It reports the
whole step (embedding, layers, final norm and the output head, which stays bf16 in all three) and
the layers alone, each as the median ms of the repeats, the spread, and the ratios to bf16.

Run it alone; the load average is recorded before and after, and the CPU's model and flags.
Shapes come from the alias's shipped config (`skipsearch/models/configs/`), so any `--model` of
the registry works without its weights; int4 groups are the largest of 128/64/32 that divide each
matrix's inputs unless `--group` says.
"""

from __future__ import annotations

import argparse
import functools
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


def direct_call(module: torch.nn.Module, hidden: torch.Tensor) -> Callable[[], object]:
    """`module`'s product on `hidden` as one call of its kernel with every argument made beforehand
    (`--direct`): what the products cost without the modules' Python (~6 µs a call for ours, more
    for torch's), as a fused C layer would call them."""
    rows, inputs = hidden.numel() // module.in_features, module.in_features
    out = module.out_features
    y = torch.empty(rows, out)
    if isinstance(module, (Bf16WeightLinear, Bf16Avx2)):
        function = module.function if isinstance(module, Bf16Avx2) else load_bf16_kernel().function
        args = (
            hidden.data_ptr(),
            inputs,
            rows,
            inputs,
            module.packed.data_ptr(),
            out,
            None,
            y.data_ptr(),
            out,
        )
    elif isinstance(module, Int8Linear):
        function = builds(INT8)[module.width].function
        args = (
            hidden.data_ptr(), inputs, rows, inputs, module.packed.data_ptr(), module.scale.data_ptr(), out,
            None, y.data_ptr(), out,
        )  # fmt: skip
    elif isinstance(module, Int4Linear):
        function = builds(INT4)[module.width].function
        args = (
            hidden.data_ptr(), inputs, rows, inputs, module.words.data_ptr(), module.params.data_ptr(),
            module.group, out, None, y.data_ptr(), out,
        )  # fmt: skip
    elif isinstance(module, TorchInt8Linear):
        flat = hidden.reshape(rows, inputs).to(module.dtype)
        return lambda: torch.ops.aten._weight_int8pack_mm(flat, module.q, module.scale)
    else:
        flat = hidden.reshape(rows, inputs).to(module.dtype)
        op = torch.ops.aten._weight_int4pack_mm_for_cpu
        return lambda: op(flat, module.packed, module.group, module.scale_and_zeros)
    call = functools.partial(function, *args)
    call.keep = (hidden, y)  # the buffers its pointers point into live as long as it does
    return call


def timed(
    modules: list[torch.nn.Module], row_counts: tuple[int, ...], direct: bool
) -> Callable[[int], float]:
    """A pass of `modules` over `rows` rows (contiguous inputs made beforehand), in seconds: the
    modules called, or with `direct` their kernels (`direct_call`)."""
    inputs = {
        (rows, m.in_features): torch.randn(1, rows, m.in_features) for rows in row_counts for m in modules
    }
    if direct:
        kernels = {
            rows: [direct_call(m, inputs[rows, m.in_features]) for m in modules] for rows in row_counts
        }

        def run_direct(rows: int) -> float:
            began = time.perf_counter()
            for call in kernels[rows]:
                call()
            return time.perf_counter() - began

        return run_direct
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
    parser.add_argument("--direct", action="store_true", help="call the kernels, not the modules")
    parser.add_argument(
        "--layers", type=int, help="fewer layers than the model's (a smoke run: all in cache)"
    )
    parser.add_argument(
        "--fused", action="store_true", help="whole draft steps on fused bf16, int8 and int4 layers"
    )
    parser.add_argument("--out", type=Path, help="also write the report here (Markdown)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fused:
        fused_steps(args)
        return
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
    runs = {name: timed(modules, row_counts, args.direct) for name, modules in built.items()}
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
        f"{f' --layers {args.layers}' if args.layers else ''}{' --direct' if args.direct else ''}`.",
        "",
        f"CPU: {describe_cpu()}; AMX {'exposed' if 'amx_tile' in flags else 'not exposed'}; "
        f"vector flags: {' '.join(sorted(f for f in flags if f.startswith(('avx', 'amx', 'fma'))))}. "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s). Our int builds: "
        f"int8 {sorted(builds(INT8))} floats wide, int4 {sorted(builds(INT4))}; "
        + ("the AVX2 builds (8 floats) ran, bf16's too (`--avx2`)." if args.avx2 else "the widest ran."),
        "",
        f"{layers} layers of products {', '.join(f'{o}x{i}' for o, i in shapes)} (out x in), each layer "
        f"its own weights; int4 groups of {'/'.join(map(str, groups))} with bf16 scale and zero. "
        "ms per pass of all products (median of the repeats, min-max), the bytes a pass reads over the "
        "median, the median over bf16's at the same rows, and the fastest pass over bf16's fastest (the "
        "steadier of the two on a busy machine). "
        + (
            "Each product is one kernel call, its arguments made beforehand (`--direct`: no module Python)."
            if args.direct
            else "Each product is a call of its module (as a model runs it: ~6 µs of Python a call for ours)."
        ),
        "",
        *markdown_table(
            ["configuration", "rows", "MB read", "ms", "spread ms", "GB/s", "÷ bf16", "fastest ÷ bf16's"],
            table,
        ),
        "",
        *(f"Not measured: {name} ({reason})." for name, reason in skipped.items()),
        load_line(load_before, load_after) + ".",
    ]
    write_report(lines, args.out)


def write_report(lines: list[str], out: Path | None) -> None:
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"wrote {out}")


FUSED_CONFIGS = ("bf16", "int8", "int4")
CONTEXT = 128  # cached positions before each timed step


def fused_model(name: str, layers: int | None) -> torch.nn.Module:
    """`name`'s architecture with random weights (every layer its own) on the fp32 fallback plan,
    its layers fused (as `models.backend` sets it up on a CPU without a faster plan)."""
    from skipsearch.cpu.attention_choice import AttentionChoice
    from skipsearch.cpu.attention_paths import KERNEL_FP32_ATTENTION
    from skipsearch.cpu.bf16_weights import use_bf16_weights
    from skipsearch.cpu.fused_layers import fuse_layers
    from skipsearch.cpu.rms_norm import use_kernel_norms
    from skipsearch.cpu.rotary import use_kernel_rotary
    from skipsearch.cpu.silu import use_kernel_silu
    from skipsearch.models.kernels import apply_attention
    from skipsearch.models.random_weights import RandomWeights, random_model

    model = random_model(name, "cpu", torch.float32, RandomWeights(num_layers=layers))
    apply_attention(model, AttentionChoice("float32", KERNEL_FP32_ATTENTION))
    use_bf16_weights(model)
    use_kernel_norms(model)
    use_kernel_rotary()
    use_kernel_silu(model)
    fused = fuse_layers(model)
    if fused != model.config.num_hidden_layers:
        raise SystemExit(f"only {fused} of {model.config.num_hidden_layers} layers fuse on this CPU")
    gc.collect()
    return model


def fused_steps(args: argparse.Namespace) -> None:
    """`--fused` (module docstring)."""
    from skipsearch.cpu.fused_layers import lower_precision_layer, lower_precision_refusal
    from skipsearch.models.runner import LayerwiseRunner

    load_before = os.getloadavg()
    print(f"building {args.model} on fused bf16, int8 and int4 layers ...", flush=True)
    model = fused_model(args.model, args.layers)
    runners = {name: LayerwiseRunner(model) for name in FUSED_CONFIGS}
    bytes_read = {"bf16": sum(layer.packed_bytes() for layer in _bf16_products(model))}
    for bits in (8, 4):
        layers = [lower_precision_layer(block, bits, args.group) for block in runners["bf16"].layers]
        if any(layer is None for layer in layers):
            raise SystemExit(
                f"int{bits}: {lower_precision_refusal(runners['bf16'].layers[0], bits, args.group)}"
            )
        runners[f"int{bits}"].fused = layers
        bytes_read[f"int{bits}"] = sum(layer.packed_bytes() for layer in layers)
    groups = {layer.group for layer in runners["int4"].fused}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, CONTEXT + 1), generator=generator)
    caches, embedded = {}, None
    with torch.no_grad():
        for name, runner in runners.items():
            caches[name] = runner.new_cache()
            runner.forward(ids[:, :CONTEXT], cache=caches[name])
        embedded = runners["bf16"].embed(ids[:, CONTEXT:])
        positions = torch.tensor([[CONTEXT]])
        layer_count = runners["bf16"].num_layers

        def step(name: str, whole: bool) -> float:
            runner, cache = runners[name], caches[name]
            began = time.perf_counter()
            if whole:
                runner.forward(ids[:, CONTEXT:], cache=cache)
            else:
                runner.run_layers(embedded, 0, layer_count, positions, cache=cache)
            seconds = time.perf_counter() - began
            for layer in cache.layers:
                layer.crop(-1)
            return seconds

        cells = [(name, whole) for whole in (True, False) for name in FUSED_CONFIGS]
        samples: dict[tuple[str, bool], list[float]] = {cell: [] for cell in cells}
        for repeat in range(args.repeats + 2):  # two warm-up rounds
            for cell in cells if repeat % 2 else cells[::-1]:
                seconds = step(*cell)
                if repeat >= 2:
                    samples[cell].append(seconds)
    load_after = os.getloadavg()
    table = []
    for whole in (True, False):
        base = samples["bf16", whole]
        for name in FUSED_CONFIGS:
            values = samples[name, whole]
            table.append(
                [
                    "whole step" if whole else "layers only",
                    name,
                    f"{bytes_read[name] / 1e6:.1f}",
                    f"{1e3 * statistics.median(values):.2f}",
                    f"{1e3 * min(values):.2f}-{1e3 * max(values):.2f}",
                    f"{statistics.median(values) / statistics.median(base):.3f}",
                    f"{min(values) / min(base):.3f}",
                ]
            )
    flags = cpu_flags() or frozenset()
    lines = [
        f"# Draft steps on fused bf16, int8 and int4 layers: {args.model}",
        "",
        f"`python experiments/int_kernels.py --model {args.model} --fused --repeats {args.repeats}"
        f"{f' --group {args.group}' if args.group else ''}"
        f"{f' --threads {args.threads}' if args.threads else ''}"
        f"{f' --layers {args.layers}' if args.layers else ''}`.",
        "",
        f"CPU: {describe_cpu()}; AMX {'exposed' if 'amx_tile' in flags else 'not exposed'}; "
        f"vector flags: {' '.join(sorted(f for f in flags if f.startswith(('avx', 'amx', 'fma'))))}. "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); our int builds "
        f"{sorted(builds(INT8))} floats wide, the widest ran.",
        "",
        f"{layer_count} layers of random weights, each its own, on the fp32 fallback plan; one row after "
        f"{CONTEXT} cached positions (each step's K/V cropped after it). int4 in groups of "
        f"{'/'.join(map(str, sorted(groups)))} with bf16 scale and zero. 'MB' is the decoder layers' "
        "product weights (int: `packed_bytes`, with scales, groups and biases); the whole step also "
        "reads the bf16 output head in every configuration. ms per step: the median of the repeats "
        "and the min-max; the median over bf16's, and the fastest over bf16's fastest (the steadier "
        "of the two on a busy machine).",
        "",
        *markdown_table(
            ["pass", "layers", "MB", "ms", "spread ms", "÷ bf16", "fastest ÷ bf16's"],
            table,
        ),
        "",
        load_line(load_before, load_after) + ".",
    ]
    write_report(lines, args.out)


def _bf16_products(model: torch.nn.Module) -> list[Bf16WeightLinear]:
    """The decoder layers' bf16 products (not the head)."""
    return [m for block in model.model.layers for m in block.modules() if isinstance(m, Bf16WeightLinear)]


if __name__ == "__main__":
    main()
