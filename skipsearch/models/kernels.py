"""The attention half of the kernel plan: which attention path a model runs on this device
(docs/theory.md, "The kernel plan").

A speedup is a ratio of two decoders, so both must run on the fastest kernels the device offers.
The dtype of weights and activations is chosen from the CPU's flags (`models.dtypes`); then:
- **Attention** on the fastest of the paths (`PATH_NAMES`): SDPA in the weights' dtype; SDPA in
  float32 over a float32 K/V cache (torch's bf16 SDPA at one query reads bf16 keys slowly on such
  CPUs: 8x slower than fp32 at 8k keys on an EPYC); or the decode kernel
  (`models.native_attention`), which reads a bf16 cache at the memory's bandwidth in float32
  arithmetic. The fp32 fallback of `--dtype auto` (a CPU without native bf16) weighs fp32 SDPA
  against the decode kernel over its float32 cache (AVX2) and, on a CPU with AMX, its AMX build
  (which makes a verify's extra query rows nearly free). The choice is measured once per machine
  on a fixed shape, at one query (a decode or draft step) and at four (a verify of 3 drafts), and
  cached beside the converted models, so every process of a run — driver, profile processes, Ray
  workers — runs the same plan, and the measurement is shown next to the choice.

K and V come out of bf16 projections, so a bf16 cache holds them exactly and an fp32 cache holds
them exactly upcast: every path attends over the same K/V; the float32 paths differ in summation
order. The AMX kernel of float32 activations rounds what it multiplies to bf16, and keeps its K/V
in a bf16 cache, rounded. The draft, the verify, the
autoregressive baseline, the estimator and HF `generate` all run through the model's attention
implementation and `new_cache`, so they share the plan.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from skipsearch.models.attention import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
    NATIVE_ATTENTION,
    kv_cache_dtype,
)
from skipsearch.models.bf16_weights import TILES, Bf16WeightLinear
from skipsearch.models.cache import PlanCache
from skipsearch.models.fused_layers import fused_layer
from skipsearch.models.native_attention import decode_attention, load_amx_kernel, load_kernel
from skipsearch.models.packed import PackedLinear
from skipsearch.models.rms_norm import KernelRMSNorm
from skipsearch.models.rotary import runs_kernel_rotary
from skipsearch.models.threads import BUSY, busy_cores
from skipsearch.store import kernel_choice_path, write_text_atomic

# The shape the attention paths are compared on: SmolLM2's heads at a 2k context (the choice is
# about the kernel, which is the same for every model of this family).
PROBE_HEADS, PROBE_KV_HEADS, PROBE_HEAD_DIM, PROBE_KEYS = 9, 3, 64, 2048
PROBE_QUERIES = (1, 4)
PROBE_REPEATS = 9
DECISIVE = 0.15  # the least relative gap between the paths that decides
Choice = TypeVar("Choice")  # a measured choice's dataclass (`read_choice`, `keep_choice`)

log = logging.getLogger(__name__)


def new_cache(config: Any) -> PlanCache:
    """The KV cache the model's plan wants (`kv_cache_dtype`: float32 K/V beside the fp32 attention
    paths, bf16 beside the AMX kernel, else the projections' dtype); appends in place either way."""
    return PlanCache(config, kv_cache_dtype(config))


# -- choosing the attention path ------------------------------------------------------------------
PATH_NAMES = {
    NATIVE_ATTENTION: "SDPA in the weights' dtype",
    FP32_ATTENTION: "SDPA in float32 over a float32 K/V cache",
    KERNEL_ATTENTION: "the decode kernel over a bf16 K/V cache, float32 arithmetic",
    KERNEL_FP32_ATTENTION: "the decode kernel over a float32 K/V cache",
    KERNEL_AMX_ATTENTION: "the AMX decode kernel over a bf16 K/V cache, bf16 products",
}


@dataclass(frozen=True)
class AttentionChoice:
    """Which attention path a dtype runs on this machine, and the measurement behind it: ms per
    call at `PROBE_KEYS` keys, by path and query count, and why a path was not a candidate."""

    dtype: str
    path: str  # a key of PATH_NAMES
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    unavailable: str = ""  # why the decode kernel was not measured, where it was not
    kernel_build: str = ""  # the build of the decode kernel measured (`NativeLibrary.build`)

    def describe(self) -> str:
        if not self.timings:
            path = f"attention in {self.dtype}" if self.path == NATIVE_ATTENTION else PATH_NAMES[self.path]
            return f"{path} (decode kernel not used: {self.unavailable})" if self.unavailable else path
        cells = "; ".join(
            f"{PATH_NAMES[path].split(' over')[0].split(',')[0]} "
            + ", ".join(f"{ms:.2f}" for ms in by_queries.values())
            for path, by_queries in self.timings.items()
        )
        queries = "/".join(next(iter(self.timings.values())))
        kernel = f"; kernel not used: {self.unavailable}" if self.unavailable else ""
        return f"{PATH_NAMES[self.path]} (ms at {PROBE_KEYS} keys, {queries} queries: {cells}{kernel})"


def median_ms(call: Callable[[], Any], repeats: int = PROBE_REPEATS) -> float:
    """Median milliseconds of `repeats` calls (the kernel plan's probes)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2] * 1e3


def pass_samples(
    runners: Mapping[str, Any], context: int, positions: Sequence[int], rounds: int, repeats: int
) -> dict[tuple[str, int], list[float]]:
    """Whole passes of each of `runners` (layer-wise runners of one model on different plans) over
    each of `positions` new positions after `context` cached ones: per (runner, positions), one
    `median_ms` of `repeats` passes a round, the cells interleaved in an order that flips every
    round, so a drift of the machine falls on every plan alike. Each pass's K/V is cropped off after
    it, so every pass sees the same context (the probes that choose a plan on whole steps)."""
    first = next(iter(runners.values()))
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(0, first.config.vocab_size, (1, context + max(positions)), generator=generator)
    ids = ids.to(first.device)
    caches = {}
    with torch.no_grad():
        for name, runner in runners.items():
            caches[name] = runner.new_cache()
            runner.forward(ids[:, :context], cache=caches[name])

        def one_pass(name: str, rows: int) -> None:
            runners[name].forward(ids[:, context : context + rows], cache=caches[name])
            for layer in caches[name].layers:
                layer.crop(-rows)

        cells = [(name, rows) for rows in positions for name in runners]
        for cell in cells:
            one_pass(*cell)  # warm-up
        samples: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
        for round_ in range(rounds):
            for cell in cells if round_ % 2 == 0 else cells[::-1]:
                samples[cell].append(median_ms(partial(one_pass, *cell), repeats))
    return samples


def _native_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _fp32_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask, enable_gqa=True).to(q.dtype)


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return decode_attention(q, k, v, PROBE_HEAD_DIM**-0.5)


def _amx_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return decode_attention(q, k, v, PROBE_HEAD_DIM**-0.5, amx=True)  # k, v: its bf16 cache


def _kernel_library(dtype: torch.dtype) -> Any:
    """The decode kernel a `dtype` model's plan may run (the fp32 one for the fallback plan)."""
    return load_kernel(torch.float32 if dtype == torch.float32 else torch.bfloat16)


def _kernel_builds(dtype: torch.dtype) -> str:
    """The builds of the decode kernels a `dtype` model's plan may run: a changed one is measured again."""
    libraries = [_kernel_library(dtype), *([load_amx_kernel()] if dtype == torch.float32 else [])]
    return "+".join(library.build for library in libraries if library.function is not None)


def candidate_paths(dtype: torch.dtype) -> list[str]:
    """The attention paths a `dtype` model may run on a CPU: for float32 (the fallback plan) fp32
    SDPA and, where they load, the decode kernel over the fp32 cache and its AMX build; for a half
    dtype SDPA in it, fp32 SDPA and, where it loads and the dtype is bf16, the decode kernel over
    the bf16 cache."""
    loads = _kernel_library(dtype).function is not None
    if dtype == torch.float32:
        amx = load_amx_kernel().function is not None
        return [
            FP32_ATTENTION,
            *([KERNEL_FP32_ATTENTION] if loads else []),
            *([KERNEL_AMX_ATTENTION] if amx else []),
        ]
    return [
        NATIVE_ATTENTION,
        FP32_ATTENTION,
        *([KERNEL_ATTENTION] if loads and dtype == torch.bfloat16 else []),
    ]


def measure_attention_paths(dtype: torch.dtype) -> dict[str, dict[str, float]]:
    """Median ms per candidate path (`candidate_paths`) and query count; the best of three
    interleaved medians each, so a burst of load hits every path alike."""
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, dict[str, float]] = {path: {} for path in candidate_paths(dtype)}
    for queries in PROBE_QUERIES:
        q = torch.randn(1, PROBE_HEADS, queries, PROBE_HEAD_DIM, generator=generator).to(dtype)
        k, v = (torch.randn(1, PROBE_KV_HEADS, PROBE_KEYS, PROBE_HEAD_DIM, generator=generator) for _ in "kv")
        mask = torch.ones(queries, PROBE_KEYS, dtype=torch.bool).tril(PROBE_KEYS - queries)
        calls = {
            NATIVE_ATTENTION: partial(_native_sdpa, q, k.to(dtype), v.to(dtype), mask),
            FP32_ATTENTION: partial(_fp32_sdpa, q, k, v, mask),
            KERNEL_ATTENTION: partial(_kernel, q, k.to(dtype), v.to(dtype), mask),
            KERNEL_FP32_ATTENTION: partial(_kernel, q, k, v, mask),
            KERNEL_AMX_ATTENTION: partial(_amx_kernel, q, k.bfloat16(), v.bfloat16(), mask),
        }
        calls = {path: call for path, call in calls.items() if path in timings}
        for call in calls.values():
            call()  # warm-up
        rounds = [{path: median_ms(call) for path, call in calls.items()} for _ in range(3)]
        for path in calls:
            timings[path][str(queries)] = min(medians[path] for medians in rounds)
    return timings


def choice_path(dtype_name: str) -> Path:
    """One measurement per machine, torch version and dtype, and per thread count where the user
    set one (`OMP_NUM_THREADS`): a one-thread process read SmolLM2's step faster on the vector
    kernel and cached that for the default processes after it."""
    machine = f"{platform.machine()}-{platform.processor() or 'cpu'}-torch{torch.__version__}"
    threads = os.environ.get("OMP_NUM_THREADS")
    return kernel_choice_path(machine, f"{dtype_name}-omp{threads}" if threads else dtype_name)


def _cached(path: Path, dtype: torch.dtype) -> AttentionChoice | None:
    """The stored choice, unless damaged, of an older form, or made without the decode kernel that
    loads now (a compiler installed since, or another build of the kernel)."""
    cached = read_choice(path, AttentionChoice)
    if cached is None:
        return None
    stale = cached.kernel_build != _kernel_builds(dtype)
    return (
        cached if cached.path in PATH_NAMES and set(cached.timings) <= set(PATH_NAMES) and not stale else None
    )


def choose_attention(dtype: torch.dtype, device_kind: str, fallback: bool = False) -> AttentionChoice:
    """The fastest attention path for `dtype` on this device, measured once and cached.

    Accelerators (whose bf16 SDPA kernels are the fast ones) run the native path unmeasured, and
    float32 models on a CPU the fp32 path unmeasured: the same SDPA as transformers' own without
    its copies (under a mask, a verify pass's, that one repeats grouped K/V heads, so it copies
    the cache once per query head of a group: 7 times a layer on Qwen2.5) — unless the float32 is
    `--dtype auto`'s `fallback` on a CPU without native bf16, whose plan is the fastest one, not
    the plain reference `--dtype float32` asks for. On a CPU with a half dtype, or for the
    fallback, the path with the least summed time over one and four queries is chosen
    (`rank_paths`: the AMX kernel only where no slower at one query). A
    measurement whose two fastest paths lie within `DECISIVE` of each other says nothing (on a
    loaded CPU they all wait on the scheduler): it is not cached, and the faster of the two
    serves until a later process measures decisively. Nor is one taken while other processes
    keep a core busy (`keep_choice`).
    """
    name = str(dtype).removeprefix("torch.")
    if device_kind != "cpu":
        return AttentionChoice(name, NATIVE_ATTENTION)
    if dtype == torch.float32 and not fallback:  # the same SDPA, minus the copies of grouped K/V heads
        return AttentionChoice(name, FP32_ATTENTION)
    library = _kernel_library(dtype)  # built on first use: only where the plan may run it
    unavailable = "" if library.function is not None else library.reason
    if dtype == torch.float32 and library.function is None:
        return AttentionChoice(name, FP32_ATTENTION, unavailable=unavailable)
    path = choice_path(name)
    cached = _cached(path, dtype) if path.is_file() else None
    if cached is not None:
        return cached
    timings = measure_attention_paths(dtype)
    ranked = rank_paths(timings)
    choice = AttentionChoice(name, ranked[0], timings, unavailable, _kernel_builds(dtype))
    runner_up = sum(timings[ranked[1]].values()) / sum(timings[ranked[0]].values())
    if runner_up - 1 < DECISIVE:
        log.warning("attention paths measured alike (%s); is the CPU busy? not kept", choice.describe())
        return choice
    keep_choice(path, choice, "the attention paths")
    return choice


def rank_paths(timings: dict[str, dict[str, float]]) -> list[str]:
    """The measured paths, fastest first by their summed time over the query counts probed; the
    AMX kernel only where it is no slower at one query than the AVX2 kernel it would replace (the
    autoregressive baseline, which every speedup divides by, runs one query: it must run the
    fastest one-query kernel, as `models.products_choice` asks of the products)."""
    one = str(PROBE_QUERIES[0])
    vector, amx = timings.get(KERNEL_FP32_ATTENTION), timings.get(KERNEL_AMX_ATTENTION)
    slower = vector is not None and amx is not None and amx[one] > vector[one]
    candidates = [path for path in timings if not (slower and path == KERNEL_AMX_ATTENTION)]
    return sorted(candidates, key=lambda candidate: sum(timings[candidate].values()))


def read_choice(path: Path, kind: type[Choice]) -> Choice | None:
    """The choice `keep_choice` kept at `path` (a `kind` dataclass), or None where there is none,
    or it is damaged or of an older form; the caller checks that it still holds."""
    try:
        return kind(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def keep_choice(path: Path, choice: Any, what: str) -> bool:
    """Cache a measured choice (a dataclass) for every later process on this machine, unless
    other processes keep a core busy now: a measurement shared with them is not this machine's
    (a probe run beside a test suite read oneDNN/MKL 0.83 where idle it reads 0.45), and a cached
    choice is never measured again. Returns whether it was kept."""
    busy = busy_cores()
    if busy >= BUSY:
        log.warning("%s were measured while other processes kept %.1f cores busy: not kept", what, busy)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(asdict(choice), indent=1))
    return True


def apply_attention(model: Any, choice: AttentionChoice) -> None:
    """Switch the model to the chosen path (transformers dispatches attention through its config)."""
    if choice.path != model.config._attn_implementation:
        model.set_attn_implementation(choice.path)


# -- what a step must read ------------------------------------------------------------------------
def step_bytes(model: Any) -> tuple[int, int]:
    """(weight bytes, K/V bytes per cached position) that one decode step must read.

    Every weight matrix is read once per step except the input embedding, of which a step reads one
    row per position — unless the LM head is tied to it and reads it whole. A packed matrix
    (`models.packed`, `models.bf16_weights`) is read in its packed copy; a tied head's plain copy
    then serves only the lookup. The K/V of every cached position is read in every layer, in the
    cache's dtype (float32 beside fp32 attention).
    """
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    read = {id(parameter): parameter for parameter in model.parameters() if parameter is not embedding}
    for module in model.modules():
        if isinstance(module, PackedLinear):
            read.pop(id(module.plain), None)
        if isinstance(module, PackedLinear | Bf16WeightLinear):
            read[id(module.packed)] = module.packed
    if not isinstance(head, PackedLinear | Bf16WeightLinear) and head.weight is embedding:
        read[id(embedding)] = embedding
    weights = sum(tensor.numel() * tensor.element_size() for tensor in read.values())
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_dtype = kv_cache_dtype(config)
    kv_element = kv_dtype.itemsize if kv_dtype is not None else embedding.element_size()
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * kv_element
    return weights, per_position


def plan_kernels(model: Any) -> dict[str, str]:
    """The kernels a step of `model` runs, in the keys a latency profile records them under: the
    attention path and the dtype of the K/V it reads, the linear layers' product (`bf16-kernel`,
    its AMX build `amx-kernel`, `onednn` or `torch`), the norms' and the rotary embedding's
    (`kernel` or `torch`), and whether short blocks run the fused decoder layers (`fused-c`: their C
    driver, `models.fused_layers`) or the modules. A profile of
    other kernels prices another plan (`LatencyProfile.warn_other_plan`)."""
    modules = list(model.modules())
    kernels = {module.kernel for module in modules if isinstance(module, Bf16WeightLinear)}
    if kernels:
        products = "amx-kernel" if TILES in kernels else "bf16-kernel"
    elif any(isinstance(module, PackedLinear) for module in modules):
        products = "onednn"
    else:
        products = "torch"
    kv = kv_cache_dtype(model.config)
    return {
        "attention": str(model.config._attn_implementation),
        # The same attention path timed over another cache's dtype (the AMX kernel's first version
        # read a float32 one) streams other bytes: a profile says which it timed.
        "kv_cache": "projections" if kv is None else str(kv).removeprefix("torch."),
        "products": products,
        "norms": "kernel" if any(isinstance(module, KernelRMSNorm) for module in modules) else "torch",
        "rotary": "kernel" if runs_kernel_rotary(model) else "torch",
        "layers": "fused-c" if any(fused_layer(block) for block in model.model.layers) else "modules",
    }
