"""The kernel plan's attention functions, registered with transformers by name (docs/theory.md,
"The kernel plan").

- `sdpa_fp32kv` (`FP32_ATTENTION`): SDPA in float32 over a float32 K/V cache, beside bf16
  weights, where that is faster than attention in bf16 (`cpu.attention_choice` measures and chooses).
- `kernel_bf16kv` (`KERNEL_ATTENTION`): the decode-attention kernel (`cpu.decode_attention`)
  over a bf16 K/V cache for short query blocks (decode, draft and verify passes), in float32
  arithmetic; longer blocks (prefills) run `sdpa_fp32kv` on the cache upcast.
- `kernel_fp32kv` (`KERNEL_FP32_ATTENTION`): the fp32 fallback plan's decode kernel, over its float32
  K/V cache, for the same short blocks; longer blocks run `sdpa_fp32kv`.
- `kernel_fp32kv_amx` (`KERNEL_AMX_ATTENTION`): float32 activations attending on AMX tiles
  (`decode_attention_amx.c`) over a bf16 K/V cache: it rounds what it multiplies to bf16, so the
  cache holds the keys and values it would multiply in half the bytes, and a verify's extra rows are
  nearly free; longer blocks run `sdpa_fp32kv` on the cache upcast.
- `sdpa_plan` (`NATIVE_ATTENTION`): transformers' own SDPA in the weights' dtype.

All five read a draft step's KV pattern (`kv.patterns`); transformers' plain names would
ignore it, so a model runs one of these (`apply_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
    NATIVE_ATTENTION,
)
from skipsearch.cpu.decode_attention import decode_attention
from skipsearch.kv.patterns import (
    KV_PATTERN_KEYWORD,
    OWN_MASK_KEYWORD,
    StaticKeys,
    pattern_attention,
    static_pattern_attention,
)
from skipsearch.kv.pillars import PILLAR_KEYWORD, PillarChoice, PillarKeys, query_scores

# Query blocks up to GROUPED_QUERIES long over at least GROUPED_KEYS keys stack their grouped heads
# (`grouped_queries`). Measured on SmolLM2 (README, "grouped query rows"): at 8k keys the step ran
# 19% faster and a 5-position pass 27%; at 128-2k keys a 2-9 position pass ran 10-25% slower, as
# 3 K/V heads make 3 tasks for SDPA's threads where 9 query heads make 9.
GROUPED_QUERIES, GROUPED_KEYS = 16, 4096


# -- the fp32 attention path ----------------------------------------------------------------------
def sdpa_fp32kv(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA in float32 (K/V come fp32 from `new_cache`), the output back in the query's dtype for
    the output projection.

    Grouped K/V heads are never repeated: transformers' own SDPA path repeats K/V per query head
    whenever there is a mask (every verify pass), which copies the whole cache three times over on
    a 3:1 model. A short query block (a decode, draft or verify pass) goes further: the query heads
    of one K/V head become rows of one query (`grouped_queries`), so each K/V head is read once,
    not once per query head — at long context the K/V is the larger read of a step, and SDPA's
    `enable_gqa` streams it from memory once per query head. Over a short cache the K/V stays in
    the CPU's caches and `enable_gqa`'s finer split over threads wins (`GROUPED_KEYS`). A long
    block (a prefill) keeps `enable_gqa` and `is_causal`, which need no mask the size of the block.
    """
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    queries, keys = query.shape[2], key.shape[2]
    group = query.shape[1] // key.shape[1]
    # No mask means SDPA's `is_causal`, which aligns top-left: transformers skips the mask only
    # where that is right (one query, a block as long as the keys, a static cache's prefill from
    # slot 0, whose empty slots come after every query), so a mask aligned to the keys' end would
    # attend a static cache's empty slots.
    short, long_cache = queries <= GROUPED_QUERIES, keys >= GROUPED_KEYS
    if group > 1 and short and long_cache and (attention_mask is not None or queries == 1):
        out = grouped_queries(query.float(), key.float(), value.float(), attention_mask, scaling)
        return out.to(query.dtype), None
    out = F.scaled_dot_product_attention(
        query.float(),
        key.float(),
        value.float(),
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(causal and attention_mask is None and query.shape[2] > 1),
        enable_gqa=group > 1,
    )
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def grouped_queries(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """SDPA of `query` `[b, H, M, D]` with its `H / KV` heads per K/V head stacked as rows of one
    query per K/V head (`[b, KV, group * M, D]`, the mask repeated to match); the output in
    transformers' layout `[b, M, H, D]`. Each row's arithmetic is the row's own, so this is the
    same attention, with each K/V head streamed once."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    rows = query.reshape(batch, kv_heads, heads // kv_heads * queries, dim)
    if (
        attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == heads > kv_heads
    ):
        # a mask per query head (the estimator's pillars) stacks as the query's rows do
        attention_mask = attention_mask.expand(batch, heads, queries, key.shape[2])
        attention_mask = attention_mask.reshape(batch, kv_heads, heads // kv_heads * queries, key.shape[2])
    elif attention_mask is not None:
        attention_mask = attention_mask.expand(*attention_mask.shape[:-2], queries, key.shape[2])
        attention_mask = attention_mask.repeat(*[1] * (attention_mask.dim() - 2), heads // kv_heads, 1)
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous()


def _kernel_reads(module: torch.nn.Module, kwargs: dict) -> bool:
    """Whether the decode kernel's attention is this layer's: causal over the whole cache (no
    sliding window) without dropout. Its mask is then the causal one, as a single sequence's is
    (the kernel declines a batch, whose masks may pad)."""
    causal = kwargs.get("is_causal")
    return bool(
        (causal if causal is not None else getattr(module, "is_causal", True))
        and not getattr(module, "sliding_window", None)  # Qwen2's sliding layers say so here,
        and not kwargs.get("sliding_window")  # Mistral's in the call
        and not kwargs.get("dropout")
    )


def with_kv_patterns(
    attention: Callable[..., tuple[torch.Tensor, None]],
    kernel: Callable[..., torch.Tensor | None] | None = None,
) -> Callable[..., Any]:
    """`attention`, or the decode kernel `kernel` (a `decode_attention`) for short blocks, or
    `pattern_attention` where the layer runs a draft step whose KV pattern (`kv_pattern` keyword:
    a `KVPattern`, or the round's `PillarKeys`; `kv.patterns`) leaves keys out, or
    `static_pattern_attention` for a graphed draft step's (`StaticKeys`). A
    `PillarChoice` under the `pillar_choice` keyword (a verify's, or the estimator's) records the
    layer's pillars from its rows' scores (`kv.pillars`)."""

    def attend(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        pattern = kwargs.pop(KV_PATTERN_KEYWORD, None)
        choice: PillarChoice | None = kwargs.pop(PILLAR_KEYWORD, None)
        own_mask = kwargs.pop(OWN_MASK_KEYWORD, False)
        scaling = kwargs.get("scaling")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if isinstance(pattern, StaticKeys):  # a graphed draft step over a static cache
            return static_pattern_attention(query, key, value, pattern, scale), None
        pillars = None
        if isinstance(pattern, PillarKeys):
            pattern, pillars = pattern.pattern, pattern.of_layer(module.layer_idx)
        if (
            kernel is not None
            and not own_mask
            and _kernel_reads(module, kwargs)
            and (choice is None or choice.rows == 1)
        ):
            sink, window = (pattern.sink, pattern.window) if pattern is not None else (0, 0)
            scores = None
            if choice is not None:
                scores = torch.full((query.shape[1], key.shape[2]), float("-inf"), device=query.device)
            out = kernel(query, key, value, scale, sink, window, pillars, scores)
            if out is not None:
                if choice is not None:
                    choice.record(module.layer_idx, scores[None, :, None])
                return out, None
        if choice is not None:
            scores = query_scores(query, key, scale, attention_mask, choice.rows)
            choice.record(module.layer_idx, scores)
        if pattern is not None:
            out = pattern_attention(query, key, value, pattern, scale, pillars)
            if out is not None:
                return out, None
        return attention(module, query, key, value, attention_mask, *args, **kwargs)

    return attend


for _name, _attention, _kernel in (
    (NATIVE_ATTENTION, sdpa_attention_forward, None),
    (FP32_ATTENTION, sdpa_fp32kv, None),
    (KERNEL_ATTENTION, sdpa_fp32kv, decode_attention),
    (KERNEL_FP32_ATTENTION, sdpa_fp32kv, decode_attention),
    (KERNEL_AMX_ATTENTION, sdpa_fp32kv, partial(decode_attention, amx=True)),
):
    AttentionInterface.register(_name, with_kv_patterns(_attention, _kernel))
    AttentionMaskInterface.register(_name, sdpa_mask)


def supports_kv_patterns(config: Any) -> bool:
    """Whether the model runs one of the plan's attention functions, which read KV patterns
    (transformers' own ignore the keyword: a pattern would silently attend to every key)."""
    return getattr(config, "_attn_implementation", None) in (
        NATIVE_ATTENTION,
        FP32_ATTENTION,
        KERNEL_ATTENTION,
        KERNEL_FP32_ATTENTION,
        KERNEL_AMX_ATTENTION,
    )
