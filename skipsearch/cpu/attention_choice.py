"""Which attention path a model runs on this device
(docs/cpu-backend.md).

A speedup is a ratio of two decoders, so both must run on the fastest kernels the device offers.
The dtype of weights and activations is chosen from the CPU's flags (`cpu.dtypes`); then:
- **Attention** on the fastest of the paths (`PATH_NAMES`): SDPA in the weights' dtype; SDPA in
  float32 over a float32 K/V cache (torch's bf16 SDPA at one query reads bf16 keys slowly on such
  CPUs: 8x slower than fp32 at 8k keys, docs/cpu-backend.md); or the decode kernel
  (`cpu.decode_attention`), which reads a bf16 cache at the memory's bandwidth in float32
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

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
    NATIVE_ATTENTION,
)
from skipsearch.cpu.choices import DECISIVE, choice_path, keep_choice, median_ms, read_choice
from skipsearch.cpu.decode_attention import decode_attention, load_amx_kernel, load_kernel

# The shape the attention paths are compared on: SmolLM2's heads at a 2k context (the choice is
# about the kernel, which is the same for every model of this family).
PROBE_HEADS, PROBE_KV_HEADS, PROBE_HEAD_DIM, PROBE_KEYS = 9, 3, 64, 2048
PROBE_QUERIES = (1, 4)

log = logging.getLogger(__name__)


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
    fastest one-query kernel, as `cpu.products_choice` asks of the products)."""
    one = str(PROBE_QUERIES[0])
    vector, amx = timings.get(KERNEL_FP32_ATTENTION), timings.get(KERNEL_AMX_ATTENTION)
    slower = vector is not None and amx is not None and amx[one] > vector[one]
    candidates = [path for path in timings if not (slower and path == KERNEL_AMX_ATTENTION)]
    return sorted(candidates, key=lambda candidate: sum(timings[candidate].values()))
