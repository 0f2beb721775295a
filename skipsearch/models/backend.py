"""Put a loaded model on this device's kernel plan: the CPU backend's choices applied at load.

The plan (docs/cpu-backend.md) is the dtype `--dtype` resolved to, the attention path measured
fastest for it (`cpu.attention_choice`), and in bf16 on a CPU weights prepacked for oneDNN
(`cpu.packed`); the fp32 fallback's linear layers run the product measured fastest on this CPU
(`cpu.fp32_linear`): MKL's, oneDNN's on packed weights, or skipsearch's kernel on bf16 copies of
the weights (`cpu.bf16_weights`; on AMX tiles where they measured faster for this model,
`cpu.products_choice`), its RMSNorms, rotary embedding and SiLU one kernel call each and its
decoder layers fused; then the threads fitted to the load, and helpers on busy cores
(`cpu.shared_core`). Each choice is recorded with the measurement behind it (`KernelPlan`).
"""

from __future__ import annotations

from typing import Any

import torch

from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
    NATIVE_ATTENTION,
)
from skipsearch.cpu.dtypes import DtypeChoice
from skipsearch.cpu.fp32_linear import BF16_KERNEL, ONEDNN, Fp32Linear
from skipsearch.cpu.threads import ThreadChoice
from skipsearch.models.kernels import apply_attention, plan_kernels
from skipsearch.models.plan import KernelPlan, PlanPart
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.models.weight_layout import WeightDtypes

ATTENTION_WORDS = {
    NATIVE_ATTENTION: "SDPA attention",
    FP32_ATTENTION: "fp32 SDPA attention",
    KERNEL_ATTENTION: "decode-attention kernel",
    KERNEL_FP32_ATTENTION: "decode-attention kernel",
    KERNEL_AMX_ATTENTION: "AMX decode-attention kernel",
}
PRODUCT_WORDS = {
    "amx-kernel": "AMX-tile products",
    "bf16-kernel": "vector products",
    "onednn": "oneDNN products",
    "torch": "torch products",
}
DTYPE_WORDS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def fallback_kernels(model: Any, products: str | None) -> list[str]:
    """Put `model` on the fp32 fallback plan's kernels: its products on skipsearch's `products`
    kernel (`VECTOR` or `TILES`; None: torch's product), its RMSNorms, rotary embedding and SiLU on
    skipsearch's kernels and its decoder layers fused; the plan's words for each that applied.
    `products_choice` builds its candidates with it, so a kernel is timed with what runs around it."""
    from skipsearch.cpu.bf16_weights import use_bf16_weights
    from skipsearch.cpu.fused_layers import fuse_layers
    from skipsearch.cpu.rms_norm import use_kernel_norms
    from skipsearch.cpu.rotary import use_kernel_rotary
    from skipsearch.cpu.silu import use_kernel_silu

    parts = [] if products is None else [f"{use_bf16_weights(model, products)} weight matrices in bf16"]
    norms = use_kernel_norms(model)
    if norms:
        parts.append(f"{norms} RMSNorms on skipsearch's kernel")
    if use_kernel_rotary():
        parts.append("the rotary embedding on skipsearch's kernel (transformers' bits)")
    if use_kernel_silu(model):
        parts.append("SiLU on skipsearch's kernel")
    fused = fuse_layers(model)
    if fused:
        parts.append(
            f"{fused} decoder layers fused for short blocks, one C call a sub-layer (the modules' bits)"
        )
    return parts


def is_fallback(device_kind: str, choice: DtypeChoice, requested: str) -> bool:
    """Whether `choice` (what `--dtype requested` resolved to) runs the fp32 fallback plan."""
    return choice.name == "float32" and requested == "auto" and device_kind == "cpu"


def plan_weights(
    device_kind: str, choice: DtypeChoice, requested: str
) -> tuple[WeightDtypes, Fp32Linear | None]:
    """The dtypes the plan holds the weights in, known before any weight is made, and the fallback
    plan's choice of product (None outside it) that decides them: bf16 matrices beside float32
    activations where skipsearch's kernel multiplies them (`cpu.bf16_weights`), else every weight
    in `choice`'s dtype. Pass the product's choice on to `apply_plan`, so it runs the same one."""
    from skipsearch.cpu.fp32_linear import choose_fp32_linear

    fp32 = choose_fp32_linear() if is_fallback(device_kind, choice, requested) else None
    matrices = "bfloat16" if fp32 is not None and fp32.library == BF16_KERNEL else choice.name
    return WeightDtypes(choice.name, matrices), fp32


def apply_plan(
    model: Any, device_kind: str, choice: DtypeChoice, requested: str, fp32: Fp32Linear | None = None
) -> KernelPlan:
    """Put `model` (loaded in `choice`'s dtype, which `--dtype requested` resolved to, its matrices
    perhaps already in the plan's: `plan_weights`) on this device's kernel plan and return the
    plan's record (module docstring). `fp32` is the fallback's product as `plan_weights` chose it
    (None: chosen here). The choices are looked up when called, so a test or an experiment that
    stands one in is heard."""
    from skipsearch.cpu.attention_choice import choose_attention
    from skipsearch.cpu.fp32_linear import choose_fp32_linear
    from skipsearch.cpu.packed import pack_linears
    from skipsearch.cpu.products_choice import choose_products
    from skipsearch.cpu.shared_core import choose_shared_cores, set_plan
    from skipsearch.cpu.threads import fit_threads_to_load

    torch_dtype = getattr(torch, choice.name)
    parts = [PlanPart("dtype", f"{choice.name} ({choice.reason})")]
    fallback = is_fallback(device_kind, choice, requested)
    attention = choose_attention(torch_dtype, device_kind, fallback)
    apply_attention(model, attention)
    parts.append(PlanPart("attention", attention.describe()))
    force, kernel = False, None
    if fallback:
        fp32 = fp32 or choose_fp32_linear()  # MKL, oneDNN or the kernel, measured on this CPU
        parts.append(PlanPart("linear layers", fp32.describe()))
        if fp32.library == BF16_KERNEL:
            # the vector kernel or AMX tiles, measured on whole steps of copies built like this one
            products = choose_products(model, fallback_kernels, LayerwiseRunner)
            kernel = products.kernel
            parts.append(PlanPart("products", products.describe()))
        parts.extend(PlanPart("kernels", words) for words in fallback_kernels(model, kernel))
        force = fp32.library == ONEDNN
    packed = pack_linears(model, force)
    if packed:
        parts.append(PlanPart("packing", f"{packed} weight matrices prepacked for oneDNN"))
    threads = fit_threads_to_load() if device_kind == "cpu" else None
    shared = None
    if threads is not None:
        parts.append(PlanPart("threads", threads.reason))
        shared = choose_shared_cores(threads.threads, threads.shares, kernel)
        set_plan(shared)
        if shared is not None:
            parts.append(PlanPart("shared cores", shared.describe()))
    words = plan_words(model, choice.name, device_kind, threads, shared)
    return KernelPlan(words, tuple(parts), threads.busy if threads is not None else 0.0)


def plan_words(
    model: Any, activations: str, device_kind: str, threads: ThreadChoice | None, shared: Any
) -> tuple[str, ...]:
    """The one-line plan's words: weights, activations, products, attention, fused layers and
    threads (or the device), read off the model as the plan left it (`plan_kernels`)."""
    kernels = plan_kernels(model)
    products = kernels["products"]
    dtype = DTYPE_WORDS.get(activations, activations)
    weights = "bf16" if products in ("amx-kernel", "bf16-kernel") else dtype  # bf16 copies of the weights
    words = [
        f"{weights} weights",
        f"{dtype} activations",
        PRODUCT_WORDS.get(products, f"{products} products"),
        ATTENTION_WORDS.get(kernels["attention"], kernels["attention"]),
    ]
    if kernels["layers"] == "fused-c":
        words.append("fused layers")
    if threads is None:
        words.append(device_kind)
    else:
        count = f"{threads.threads} thread{'s' if threads.threads != 1 else ''}"
        helpers = ""
        if shared is not None:
            many = len(shared.helpers)
            helpers = f" + {many} helpers on busy cores" if many > 1 else " + a helper on a busy core"
        words.append(count + helpers)
    return tuple(words)
