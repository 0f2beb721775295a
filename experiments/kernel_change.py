"""One change of the kernel plan against the plan without it, in one process, paired (issue 19).

`load_model` builds a model's plan in steps after the attention path: the fp32 fallback's weights
in bf16 for skipsearch's AVX2 kernel (`cpu.bf16_weights`), its RMSNorms on a kernel too
(`cpu.rms_norm`), then weights prepacked for oneDNN
(`cpu.packed`: reordered once at load instead of on every call). `--change` names the step
under test. The model is loaded once without the steps, copied, and the
copies get the plan without that step and the whole plan. `--change kernel` tests the attention
path instead: the whole plan with fp32 SDPA over an fp32 cache against the decode kernel
(`cpu.decode_attention`) over the plan's cache, bf16 where the weights are bf16 and fp32 on the
fp32 fallback (a CPU without native bf16). Then the experiment times one-position steps (a decode or
draft step) and four-position passes (a verify of 3 drafts) of both, alternating the order, at each
context, and checks that both give the same logits. Then, per dtype (`--dtypes`), it times whole
autoregressive decodes of HumanEval prompts with both, alternating prompt by prompt. Writes
`results/kernels/packed_weights.md` or `results/kernels/decode_kernel.md`.

    python experiments/kernel_change.py --change packed --dtypes auto    # ~3 min on two idle cores
    python experiments/kernel_change.py --change kernel --dtypes auto --contexts 128,512,2048,8000
    python experiments/kernel_change.py --change kernel --dtypes auto --contexts 512,2048,8000 \
        --repeats 20 --suffix=-avx2                      # the fp32 kernel, on a CPU without AVX-512
    python experiments/kernel_change.py --change packed --force-pack --dtypes auto --suffix=-fp32-avx2

`--force-pack` packs fp32 weights too: on a CPU without native bf16 it measures the fp32 fallback's
packing (`cpu.fp32_linear`), which `load_model` applies only where oneDNN measured faster. With
`--change bf16-weights --force-pack` it compares the fallback's two fastest products: bf16 weights
on the kernel against fp32 weights packed for oneDNN.

    python experiments/kernel_change.py --change bf16-weights --force-pack --dtypes auto --suffix=-avx2

`--change norms` tests the fallback plan's RMSNorms in one kernel call each (`cpu.rms_norm`),
`--change rotary` its rotary embedding on a kernel (`cpu.rotary`, process-wide: the two plans
share one model and take turns call by call).

    python experiments/kernel_change.py --change norms --dtypes auto --suffix=-avx2
    python experiments/kernel_change.py --change rotary --dtypes auto --suffix=-avx2

`--change layers` tests the fused decoder layers (`cpu.fused_layers`) on one model, the runner
without them running transformers' modules:

    python experiments/kernel_change.py --change layers --dtypes auto --suffix=-avx2

`--change tiles` tests the products on AMX tiles (`cpu.products_choice`) against the vector
kernel, on a CPU with AMX; the logits differ (the tiles round the inputs to bf16), by the figure
the report prints:

    python experiments/kernel_change.py --change tiles --models qwen2.5-coder-0.5b --dtypes auto

`--change amx-attention` tests the AMX decode-attention kernel (`decode_attention_amx.c`, over the
bf16 cache it keeps) against the AVX2 one over the fp32 fallback's float32 cache, on a CPU with AMX;
the logits differ (it rounds what it multiplies to bf16):

    python experiments/kernel_change.py --change amx-attention --dtypes auto --contexts 128,512,2048,8000

Stacked q/k/v and gate/up projections were the other step until packing made them 5-6% slower;
their report and module were removed with them (re-run from commit fadcaca).

Run it alone on an idle machine; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from _load import load_line

from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.cpu import bf16_weights, fused_layers, packed, rms_norm, rotary
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
)
from skipsearch.engine import autoregressive_decode
from skipsearch.models.kernels import apply_attention
from skipsearch.models.loading import load_model
from skipsearch.models.registry import REGISTRY, available_offline
from skipsearch.models.runner import LayerwiseRunner

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kernels"
POSITIONS = (1, 4)


def on_tiles(model: Any) -> int:
    """Every bf16-weight product of `model` moved to the AMX kernel, repacked for it (`load_model`
    packs for it directly where `cpu.products_choice` measured it faster); how many."""
    moved = 0
    for module in model.modules():
        if isinstance(module, bf16_weights.Bf16WeightLinear):
            module.packed, module.kernel = bf16_weights.pack_tiles(module.weight), bf16_weights.TILES
            moved += 1
    return moved


# The plan's steps after the attention path, in `load_model`'s order: (module, function, the step
# applied to a model with `force`, the fp32 fallback's packing).
STEPS = {
    "bf16-weights": (bf16_weights, "use_bf16_weights", lambda model, _: bf16_weights.use_bf16_weights(model)),
    "tiles": (bf16_weights, "use_bf16_weights", lambda model, _: on_tiles(model)),
    "norms": (rms_norm, "use_kernel_norms", lambda model, _: rms_norm.use_kernel_norms(model)),
    "layers": (fused_layers, "fuse_layers", lambda model, _: fused_layers.fuse_layers(model)),
    "packed": (packed, "pack_linears", lambda model, force: packed.pack_linears(model, force)),
}
# Attention paths compared on the whole plan, by the model's dtype: (without, with).
PATHS = {
    "kernel": {
        torch.bfloat16: (FP32_ATTENTION, KERNEL_ATTENTION),
        torch.float32: (FP32_ATTENTION, KERNEL_FP32_ATTENTION),
    },
    "amx-attention": {torch.float32: (KERNEL_FP32_ATTENTION, KERNEL_AMX_ATTENTION)},
}


@contextlib.contextmanager
def rotary_kernel(on: bool) -> Iterator[None]:
    """The supported families' rotary function on the kernel or transformers' own while the block
    runs (`cpu.rotary` installs it for the whole process, so the two plans take turns)."""
    modules = [importlib.import_module(name) for name in rotary.FAMILIES]
    saved = [getattr(module, rotary.ROTARY_FUNCTION) for module in modules]
    for module, function in zip(modules, saved, strict=True):
        reference = getattr(function, "reference", function)
        setattr(module, rotary.ROTARY_FUNCTION, rotary.kernel_rotary(reference) if on else reference)
    try:
        yield
    finally:
        for module, function in zip(modules, saved, strict=True):
            setattr(module, rotary.ROTARY_FUNCTION, function)


# Plan changes that are process-wide, not per model: both runners run the whole plan, and the
# change is switched off for the plan without it call by call.
SWITCHES = {"rotary": rotary_kernel}
# Plan changes that one model can run with and without: the runner without it never takes it.
ONE_MODEL = {*SWITCHES, "layers"}


def variant(change: str, name: str) -> contextlib.AbstractContextManager[None]:
    """The context a call of the plan `name` ("without" or "with") runs in."""
    return SWITCHES[change](name == "with") if change in SWITCHES else contextlib.nullcontext()


REPORTS = {
    "packed": "packed_weights.md",
    "kernel": "decode_kernel.md",
    "bf16-weights": "bf16_weights.md",
    "norms": "rms_norm.md",
    "rotary": "rotary.md",
    "layers": "fused_layers.md",
    "tiles": "amx_tiles.md",
    "amx-attention": "amx_attention.md",
}
TITLES = {
    "bf16-weights": "bf16 weights on skipsearch's AVX2 kernel against the fp32 plan's products",
    "norms": "RMSNorms on skipsearch's kernel against transformers' eight operations",
    "rotary": "The rotary embedding on skipsearch's kernel against transformers' operations",
    "layers": "Fused decoder layers (a few kernel calls a sub-layer) against transformers' modules",
    "packed": "Weights prepacked for oneDNN against F.linear's plain weights",
    "tiles": "The products on skipsearch's AMX kernel against its vector kernel",
    "kernel": "The decode kernel over the plan's cache against fp32 SDPA over an fp32 cache",
    "amx-attention": "The AMX decode kernel over a bf16 cache against the AVX2 one over the float32 cache",
}


def runners(
    model: str, change: str, dtype: str = "auto", force: bool = False
) -> tuple[LayerwiseRunner, LayerwiseRunner, Any]:
    """(without, with) runners of one model: the plan of `dtype` without the step `change`, and the
    whole plan (each step applied whatever the dtype; packing leaves fp32 alone unless `force`, the
    fp32 fallback's packing); and the loaded model. For an attention change, the whole plan on each
    of the two paths of its dtype (`PATHS`). For a change one model runs with and without
    (`ONE_MODEL`), that model with the whole plan twice: a copy's weights sit elsewhere in memory,
    which can time differently."""
    with contextlib.ExitStack() as steps_off:
        for module, function, _ in STEPS.values():
            steps_off.enter_context(mock.patch.object(module, function, lambda model, force=False: 0))
        loaded = load_model(model, dtype=dtype, announce=False)
    if change in ONE_MODEL:
        for _, _, apply in STEPS.values():
            apply(loaded.model, force)
        without = LayerwiseRunner(loaded.model)
        if change == "layers":
            without.fused = [None] * without.num_layers
        return without, LayerwiseRunner(loaded.model), loaded
    without, whole = loaded.model, copy.deepcopy(loaded.model)
    if change in PATHS and without.dtype in PATHS[change]:  # first: the fused layers take the path's kernel
        dtype_name = str(without.dtype).removeprefix("torch.")
        for copy_of_model, path in zip((without, whole), PATHS[change][without.dtype], strict=True):
            apply_attention(copy_of_model, AttentionChoice(dtype_name, path))
    for step, (_, _, apply) in STEPS.items():
        if step != change:
            apply(without, force)
        apply(whole, force)
    return LayerwiseRunner(without), LayerwiseRunner(whole), loaded


def decode_speeds(
    model: str, change: str, dtype: str, prompts: int, new_tokens: int, repeats: int, force: bool
) -> dict[str, list[float]]:
    """Autoregressive tok/s (prefill included) per prompt and repeat, without and with alternating."""
    without, with_change, loaded = runners(model, change, dtype, force)
    spec = PromptSpec(n_prompts=prompts, max_prompt_tokens=256, new_tokens=new_tokens)
    encoded = [p.ids for p in encode_prompts(spec, loaded.tokenizer)]
    pair = {"without": without, "with": with_change}
    for runner in pair.values():  # warm-up
        autoregressive_decode(runner, encoded[0], 4)
    speeds: dict[str, list[float]] = {name: [] for name in pair}
    for repeat in range(repeats):
        for index, prompt in enumerate(encoded):
            order = list(pair) if (repeat + index) % 2 == 0 else list(reversed(pair))
            for name in order:
                with variant(change, name):
                    result = autoregressive_decode(pair[name], prompt, new_tokens)
                speeds[name].append(len(result.tokens) / result.seconds)
    return speeds


def timings(
    pair: dict[str, LayerwiseRunner], context: int, repeats: int, change: str
) -> dict[tuple[str, int], list[float]]:
    """ms per pass, by (variant, positions), the variants alternating in order every repeat."""
    ids = torch.randint(
        0, pair["without"].config.vocab_size, (1, context + 8), generator=torch.Generator().manual_seed(0)
    )
    caches = {}
    with torch.no_grad():
        for name, runner in pair.items():
            caches[name] = runner.new_cache()
            runner.forward(ids[:, :context], cache=caches[name])

        def one(name: str, positions: int) -> float:
            began = time.perf_counter()
            with variant(change, name):
                pair[name].forward(ids[:, context : context + positions], cache=caches[name])
            elapsed = time.perf_counter() - began
            for layer in caches[name].layers:
                layer.crop(-positions)
            return 1e3 * elapsed

        for _ in range(3):  # warm-up
            for name in pair:
                one(name, 1)
        times: dict[tuple[str, int], list[float]] = {(n, p): [] for n in pair for p in POSITIONS}
        for repeat in range(repeats):
            for positions in POSITIONS:
                for name in list(pair) if repeat % 2 == 0 else reversed(list(pair)):
                    times[name, positions].append(one(name, positions))
    return times


def same_logits(pair: dict[str, LayerwiseRunner], change: str) -> float:
    """The largest logit difference between the pair over a 64-token prefill and then cached passes
    of 1 and 4 positions: a prefill runs SDPA on both sides, so only the cached passes reach the
    decode kernel."""
    ids = torch.randint(
        0, pair["without"].config.vocab_size, (1, 69), generator=torch.Generator().manual_seed(1)
    )
    caches = {name: runner.new_cache() for name, runner in pair.items()}
    largest = 0.0
    with torch.no_grad():
        for begin, end in ((0, 64), (64, 65), (65, 69)):
            logits = []
            for name, runner in pair.items():
                with variant(change, name):
                    logits.append(runner.forward(ids[:, begin:end], cache=caches[name]).float())
            a, b = logits
            largest = max(largest, float((a - b).abs().max()))
    return largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--change",
        choices=sorted([*STEPS, *PATHS, *SWITCHES]),
        required=True,
        help="the plan's step or path under test",
    )
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--contexts", default="128,512,2048")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtypes", default="auto,float32", help="plans whose decodes are compared")
    parser.add_argument("--decode-prompts", type=int, default=4)
    parser.add_argument("--decode-repeats", type=int, default=2)
    parser.add_argument(
        "--force-pack", action="store_true", help="pack fp32 weights too (the fp32 fallback plan's packing)"
    )
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    change = args.change
    lines = [
        f"# {TITLES[change]} (issue 19)",
        "",
        f"`python experiments/kernel_change.py --change {change} --contexts {args.contexts} "
        f"--repeats {args.repeats} --dtypes {args.dtypes}{' --force-pack' if args.force_pack else ''}"
        f"{f' --suffix={args.suffix}' if args.suffix else ''}`: "
        "one process per model, the plan without "
        f"`{change}` and the whole plan timed alternately, median ms per pass (interquartile range in "
        "brackets).",
        "",
        "| model | context | positions | without ms | with ms | with ÷ without |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for model in args.models.split(","):
        if not available_offline(REGISTRY[model]):
            print(f"skipping {model}: not installed")
            continue
        without, with_change, loaded = runners(model, change, force=args.force_pack)
        pair = {"without": without, "with": with_change}
        notes.append(
            f"- {model}: largest logit difference between the two over a prefill and cached passes of "
            f"1 and 4 positions {same_logits(pair, change):.3g}; plan: {loaded.plan}"
        )
        for context in (int(c) for c in args.contexts.split(",")):
            times = timings(pair, context, args.repeats, change)
            for positions in POSITIONS:
                cells = []
                for name in pair:
                    quartiles = statistics.quantiles(times[name, positions], n=4)
                    cells.append(f"{quartiles[1]:.2f} ({quartiles[0]:.2f}–{quartiles[2]:.2f})")
                ratio = statistics.median(times["with", positions]) / statistics.median(
                    times["without", positions]
                )
                lines.append(f"| {model} | {context} | {positions} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
                print(lines[-1], flush=True)
    lines += [
        "",
        f"Autoregressive decodes, {args.decode_prompts} HumanEval prompts × 48 new tokens × "
        f"{args.decode_repeats} repeats, without and with alternating prompt by prompt (tok/s with the "
        "prefill; median and range of the per-prompt ratios):",
        "",
        "| model | dtype | without tok/s | with tok/s | with ÷ without (per prompt) |",
        "|---|---|---|---|---|",
    ]
    for model in args.models.split(","):
        if not available_offline(REGISTRY[model]):
            continue
        for dtype in args.dtypes.split(","):
            speeds = decode_speeds(
                model, change, dtype, args.decode_prompts, 48, args.decode_repeats, args.force_pack
            )
            ratios = [b / a for a, b in zip(speeds["without"], speeds["with"], strict=True)]
            lines.append(
                f"| {model} | {dtype} | {statistics.mean(speeds['without']):.1f} | "
                f"{statistics.mean(speeds['with']):.1f} | {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}–{max(ratios):.3f}) |"
            )
            print(lines[-1], flush=True)
    load_after = os.getloadavg()
    lines += [
        "",
        *notes,
        "",
        f"{torch.get_num_threads()} torch threads. {load_line(load_before, load_after)}.",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = Path(REPORTS[change])
    (RESULTS / f"{report.stem}{args.suffix}{report.suffix}").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
