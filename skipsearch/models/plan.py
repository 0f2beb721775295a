"""The kernel plan a loaded model runs on, as the rest of skipsearch sees it: the KV cache it wants
(`new_cache`), its attention path (`apply_attention`), what a decode must hold around its loop
(`engaged`), and what it runs and reads (`plan_kernels`, `step_bytes`). The CPU backend
(`skipsearch.cpu`) chooses and builds the plan; only this package imports it, so the engine, the
estimator and the harnesses see ordinary modules (docs/cpu-backend.md).
"""

from __future__ import annotations

from typing import Any

from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import kv_cache_dtype
from skipsearch.cpu.inventory import plan_kernels, step_bytes
from skipsearch.cpu.shared_core import engaged
from skipsearch.cpu.threads import busy_cpu_warning
from skipsearch.kv.cache import PlanCache
from skipsearch.models import attention as _attention

__all__ = ["apply_attention", "busy_cpu_warning", "engaged", "new_cache", "plan_kernels", "step_bytes"]
REGISTERED = _attention.supports_kv_patterns  # the registration above is what `apply_attention` needs


def new_cache(config: Any) -> PlanCache:
    """The KV cache the model's plan wants (`kv_cache_dtype`: float32 K/V beside the fp32 attention
    paths, bf16 beside the AMX kernel, else the projections' dtype); appends in place either way."""
    return PlanCache(config, kv_cache_dtype(config))


def apply_attention(model: Any, choice: AttentionChoice) -> None:
    """Switch the model to the chosen path (transformers dispatches attention through its config)."""
    if choice.path != model.config._attn_implementation:
        model.set_attn_implementation(choice.path)
