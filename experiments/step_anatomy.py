"""Where a decode step's time goes, kernel by kernel, against the bytes it must read (issue 19, item 3).

The memory floor of a decode step is the bytes it must read — every weight once, plus the K/V of
every cached position — over the machine's copy bandwidth. This experiment times the embedded
model's autoregressive step at each context on the default kernel plan, measures the copy
bandwidth the same way `skipsearch profile` does, and traces a few steps with `torch.profiler` to
split the step into: linear layers (the weights' bytes), attention kernels (the K/V's bytes), K/V
cache writes (`cat`/`copy_`), and everything else (norms, rotary, element-wise ops, and the
per-operator dispatch of eager PyTorch, which a 135M model pays ~20 times per layer). On the fp32
fallback plan it also splits the step without the profiler's overhead: steps with the bf16-weight
products' kernel calls timed one by one (the fused layers' C driver times its own calls), so the step
is divided into the products' kernel and the rest, and the same split of a pass over 1 to 5
positions (a verify of γ + 1) says which part of f(γ) the products' extra rows take and which the
rest (attention's extra query rows above all).

    python experiments/step_anatomy.py   # ~5 min: results/profile/step_anatomy-{model}-{dtype}{--suffix}.md

Run it alone on an idle machine; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import statistics
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from _load import load_line
from torch.profiler import ProfilerActivity, profile, record_function

from skipsearch.bench.clock import WallClock
from skipsearch.bench.latency_profiler import copy_bandwidth
from skipsearch.cpu import bf16_weights, decode_attention
from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.inventory import step_bytes
from skipsearch.cpu.native import NativeLibrary
from skipsearch.models import attention
from skipsearch.models.loading import load_model
from skipsearch.models.runner import LayerwiseRunner

RESULTS = Path(__file__).resolve().parents[1] / "results" / "profile"
KERNEL_EVENT = "skipsearch::decode_attention"  # the decode kernel's calls, named for the trace
LINEAR_EVENT = "skipsearch::linear_rows"  # the bf16-weight kernel's calls (the AVX2 fallback plan)
GROUPS = {
    "linear (weights)": (
        LINEAR_EVENT,
        "aten::linear",
        "aten::mm",
        "aten::addmm",
        "aten::matmul",
        "mkldnn::_linear_pointwise",
    ),
    "attention kernel (K/V)": ("aten::_scaled_dot_product", "aten::scaled_dot_product", KERNEL_EVENT),
    "copies and casts (K/V writes)": ("aten::cat", "aten::copy_", "aten::_to_copy"),
}


_decode_attention = decode_attention.decode_attention


def traced_kernel(*args: Any, **kwargs: Any) -> Any:
    """The decode kernel (a ctypes call, which torch.profiler does not see) under a named range."""
    with record_function(KERNEL_EVENT):
        return _decode_attention(*args, **kwargs)


_bf16_weight_product = bf16_weights.multiply


def traced_linear(*args: Any) -> torch.Tensor:
    """The bf16-weight kernel's product (a ctypes call too, from a module or a fused layer) under a
    named range."""
    with record_function(LINEAR_EVENT):
        return _bf16_weight_product(*args)


def group_of(name: str) -> str:
    return next((group for group, prefixes in GROUPS.items() if name.startswith(prefixes)), "other ops")


def steps(runner: LayerwiseRunner, context: int, count: int) -> tuple[list[float], dict[str, float], int]:
    """`count` timed one-position steps after `context` cached positions, then one traced step:
    (step seconds, self CPU ms per group in the traced steps, traced steps)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.config.vocab_size, (1, context + count + 8), generator=generator)
    cache = runner.new_cache()
    times = []
    with torch.no_grad():
        runner.forward(ids[:, :context], cache=cache)

        def step(position: int) -> None:
            runner.forward(ids[:, position : position + 1], cache=cache)
            for layer in cache.layers:
                layer.crop(-1)

        for index in range(count + 3):
            began = time.perf_counter()
            step(context + index)
            if index >= 3:
                times.append(time.perf_counter() - began)
        traced = 3
        with (
            profile(activities=[ProfilerActivity.CPU]) as trace,
            mock.patch.object(attention, "decode_attention", traced_kernel),  # the modules' calls
            mock.patch.object(decode_attention, "decode_attention", traced_kernel),  # the fused layers'
            mock.patch.object(bf16_weights, "multiply", traced_linear),
        ):
            for index in range(traced):
                step(context + index)
    groups: dict[str, float] = collections.defaultdict(float)
    for event in trace.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e3
    return times, dict(groups), traced


def kernel_split(
    runner: LayerwiseRunner, context: int, count: int, positions: int = 1
) -> tuple[float, float] | None:
    """Medians over `count` passes over `positions` new positions (1: a decode step; γ + 1: a
    verify) after `context` cached positions: (pass ms, its bf16-weight products' ms); None where
    the plan has no such products. The fused layers' C driver times its own product calls
    (`FusedLayer.time_products`); the modules' (the LM head's) are timed around their ctypes call."""
    products = [m for m in runner.model.modules() if isinstance(m, Bf16WeightLinear)]
    if not products:
        return None
    function = bf16_weights.kernel_library(products[0].kernel).function  # the plan's (vector or tiles)
    if function is None:
        return None
    spent = ctypes.c_double(0.0)

    def timed_call(*args: Any) -> int:
        began = time.perf_counter()
        failed = function(*args)
        spent.value += time.perf_counter() - began
        return failed

    fused = [layer for layer in runner.fused if layer is not None]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.config.vocab_size, (1, context + positions), generator=generator)
    cache = runner.new_cache()
    samples: dict[str, list[float]] = {"pass": [], "products": []}
    with torch.no_grad():
        runner.forward(ids[:, :context], cache=cache)
        for layer in fused:
            layer.time_products(spent)
        try:
            timed = NativeLibrary(timed_call, "timed")
            with mock.patch.object(bf16_weights, "kernel_library", lambda _kernel: timed):
                for index in range(count + 2):
                    spent.value = 0.0
                    began = time.perf_counter()
                    runner.forward(ids[:, context:], cache=cache)
                    elapsed = time.perf_counter() - began
                    for layer in cache.layers:
                        layer.crop(-positions)
                    if index >= 2:
                        samples["pass"].append(elapsed)
                        samples["products"].append(spent.value)
        finally:
            for layer in fused:
                layer.time_products(None)
    return 1e3 * statistics.median(samples["pass"]), 1e3 * statistics.median(samples["products"])


def verify_split(
    runner: LayerwiseRunner, context: int, count: int, positions: list[int], repeats: int = 3
) -> dict[int, tuple[float, float]]:
    """`kernel_split` of a pass over each of `positions` new positions after `context` cached ones,
    the position counts interleaved `repeats` times in alternating order: {positions: (pass ms,
    products ms)}, each the median over the repeats. What a verify of γ + 1 positions adds to a
    step, split into the products' extra rows and the rest (attention's extra query rows, norms,
    rotary, SiLU); empty where the plan has no products' kernel."""
    samples: dict[int, list[tuple[float, float]]] = {p: [] for p in positions}
    for repeat in range(repeats):
        for p in positions if repeat % 2 == 0 else positions[::-1]:
            split = kernel_split(runner, context, count, p)
            if split is None:
                return {}
            samples[p].append(split)
    return {
        p: (statistics.median(s[0] for s in splits), statistics.median(s[1] for s in splits))
        for p, splits in samples.items()
    }


def verify_table(context: int, split: dict[int, tuple[float, float]]) -> list[str]:
    """Rows of the report's per-position table: each pass against the fewest positions' (a step)."""
    if not split:
        return []
    step, products = split[min(split)]
    return [
        f"| {context} | {p} | {ms:.2f} | {ms / step:.3f} | {kernel:.2f} (+{kernel - products:.2f}) | "
        f"{ms - kernel:.2f} (+{ms - kernel - (step - products):.2f}) |"
        for p, (ms, kernel) in sorted(split.items())
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--contexts", default="512,2048,8000")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    parser.add_argument(
        "--positions",
        default="1,2,3,4,5",
        help="positions per pass in the verify split (1, the step, is always in)",
    )
    args = parser.parse_args()
    positions = sorted({1, *(int(p) for p in args.positions.split(","))})  # f is against the step
    load_before = os.getloadavg()
    loaded = load_model(args.model, dtype=args.dtype)
    runner = LayerwiseRunner(loaded.model)
    weights, per_position = step_bytes(loaded.model)
    bandwidth = copy_bandwidth(runner.device, WallClock())
    lines = [
        f"# Anatomy of a decode step: {args.model}",
        "",
        f"`python experiments/step_anatomy.py --model {args.model} --contexts {args.contexts} "
        f"--dtype {args.dtype}{f' --suffix={args.suffix}' if args.suffix else ''}`",
        f"Kernel plan: {loaded.plan}; {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}.",
        f"A step reads {weights / 1e6:.0f} MB of weights + {per_position / 1e3:.1f} kB of K/V per cached "
        f"position; copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write of a 256 MiB copy, best of 7).",
        "",
        "| context | step ms (median, IQR) | floor ms | step ÷ floor | "
        + " | ".join(f"{g} ms" for g in [*GROUPS, "other ops"])
        + " |",
        "|---|---|---|---|" + "---|" * (len(GROUPS) + 1),
    ]
    splits, verifies = [], []
    for context in (int(c) for c in args.contexts.split(",")):
        by_positions = verify_split(runner, context, args.steps, positions)
        verifies += verify_table(context, by_positions)
        split = by_positions.get(1)  # the step: the verify split's one-position passes
        if split is not None:
            step, kernel = split
            rest = step - kernel
            shares = f"{kernel:.2f} ({kernel / step:.0%}) | {rest:.2f} ({rest / step:.0%})"
            splits.append(f"| {context} | {step:.2f} | {shares} |")
            print(splits[-1])
        times, groups, traced = steps(runner, context, args.steps)
        median = statistics.median(times)
        quartiles = statistics.quantiles(times, n=4)
        floor = (weights + per_position * context) / bandwidth
        shares = " | ".join(f"{groups.get(g, 0.0) / traced:.2f}" for g in [*GROUPS, "other ops"])
        spread = 1e3 * (quartiles[2] - quartiles[0])
        lines.append(
            f"| {context} | {1e3 * median:.2f} ({spread:.2f}) | {1e3 * floor:.2f} | {median / floor:.2f} | "
            f"{shares} |"
        )
        print(lines[-1])
    load_after = os.getloadavg()
    lines += [
        "",
        "Group columns are self CPU time per step from `torch.profiler`, which adds overhead of its own; "
        "Python time between operators is in no group.",
    ]
    if any(layer is not None for layer in runner.fused):
        lines.append(
            "The fused layers' C driver calls its kernels where `torch.profiler` does not see them: on "
            "this plan the group columns hold the embedding's and the head's operators only, and the "
            "split below is the step's anatomy."
        )
    if splits:
        lines += [
            "",
            f"Without the profiler: steps with the bf16-weight products' kernel calls timed one by one (by "
            "the fused layers' C driver, and around the LM head's call): the one-position passes of the "
            f"split below (three samples of {args.steps} steps, medians):",
            "",
            "| context | step ms | products' kernel calls ms (share) | the rest ms (share) |",
            "|---|---|---|---|",
            *splits,
        ]
    if verifies:
        lines += [
            "",
            f"A pass over each number of positions (a verify of γ + 1 = positions), split the same way "
            f"({args.steps} passes a sample, the position counts interleaved three times in alternating "
            "order, medians), against the one-position step: the products' kernel calls and the rest "
            "(attention's query rows, norms, rotary, SiLU), each with what it adds to the step's:",
            "",
            "| context | positions | pass ms | ÷ step (f) | products ms (+ over the step) | rest ms (+) |",
            "|---|---|---|---|---|---|",
            *verifies,
        ]
    lines += ["", load_line(load_before, load_after) + "."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"step_anatomy-{args.model}-{loaded.model.dtype}{args.suffix}".replace("torch.", "")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
