"""The kernel plan a loaded model runs on, as the rest of skipsearch sees it.

The CPU backend (`skipsearch.cpu`) chooses and builds the plan when `models.backend` applies it at
load; only `models` imports the backend, so the engine, the estimator and the harnesses see
ordinary modules (docs/cpu-backend.md). From here they get the KV cache the plan wants
(`new_cache`), its attention path (`apply_attention`), what a decode holds around its loop
(`engaged`), what a step runs and reads (`plan_kernels`, `step_bytes`), and the CPU and its load
in words (`describe_cpu`, `busy_cpu_warning`).
"""

from __future__ import annotations

from typing import Any

from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import kv_cache_dtype
from skipsearch.cpu.dtypes import describe_cpu
from skipsearch.cpu.inventory import plan_kernels, step_bytes
from skipsearch.cpu.shared_core import engaged
from skipsearch.cpu.threads import busy_cpu_warning
from skipsearch.kv.plan_kv import PlanKVCache
from skipsearch.models import attention  # noqa: F401  (registers the plan's attention functions)

__all__ = [
    "apply_attention",
    "busy_cpu_warning",
    "describe_cpu",
    "engaged",
    "new_cache",
    "plan_kernels",
    "step_bytes",
]


def new_cache(config: Any) -> PlanKVCache:
    """The KV cache the model's plan wants (`kv_cache_dtype`: float32 K/V beside the fp32 attention
    paths, bf16 beside the AMX kernel, else the projections' dtype); appends in place either way."""
    return PlanKVCache(config, kv_cache_dtype(config))


def apply_attention(model: Any, choice: AttentionChoice) -> None:
    """Switch the model to the chosen path (transformers dispatches attention through its config)."""
    if choice.path != model.config._attn_implementation:
        model.set_attn_implementation(choice.path)
