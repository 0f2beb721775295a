"""The transformers API the layer-wise runner calls, checked once per process, by the first runner.

The runner hands each layer's cache to transformers by keyword: `create_causal_mask(cache=...)`
and `self_attn(cache=...)` (transformers >= 5.24; 5.17 names it `past_key_values`), and rolls
static caches back through each `StaticLayer`'s device-side `cumulative_length`. An older
transformers does not fail loudly: attention swallows the unknown keyword in `**kwargs`, writes
no K/V, and decoding breaks far from the cause. So the names are checked up front and a mismatch
is one line naming the fix. The model families the runner knows are checked here too
(`check_architecture`), before any weight is read.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from skipsearch.errors import ModelLoadError

PINNED = "5.24.0"
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


def api_problems(
    create_mask: Callable[..., Any], attention_forward: Callable[..., Any], static_layer: type
) -> list[str]:
    """What the runner needs from transformers that these objects lack (empty: all there)."""
    problems = []
    for name, function in (
        ("create_causal_mask", create_mask),
        ("LlamaAttention.forward", attention_forward),
    ):
        if "cache" not in inspect.signature(function).parameters:
            problems.append(f"{name} takes no `cache` argument")
    if not hasattr(static_layer(max_cache_len=1), "cumulative_length"):
        problems.append("StaticLayer keeps no cumulative_length")
    return problems


def check_transformers(
    version: str, create_mask: Callable[..., Any], attention_forward: Callable[..., Any], static_layer: type
) -> None:
    """Raise ModelLoadError in one line when this transformers cannot run the layer-wise runner."""
    problems = api_problems(create_mask, attention_forward, static_layer)
    if problems:
        raise ModelLoadError(
            f"transformers {version} is not supported ({'; '.join(problems)}): "
            f"install the pinned version, `pip install --no-deps transformers=={PINNED}`"
        )


@functools.cache
def check_installed_transformers() -> None:
    """`check_transformers` on the installed package; the installed package does not change while
    the process runs, so the check runs once (a failed check raises again: `cache` keeps no error)."""
    import transformers
    from transformers.cache_utils import StaticLayer
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaAttention

    check_transformers(transformers.__version__, create_causal_mask, LlamaAttention.forward, StaticLayer)


def check_architecture(config: object) -> None:
    """Refuse, in one line, a model family whose layers the runner does not know how to run."""
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture {model_type!r}: the layer-wise runner supports "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}; pass a model of one of those families"
        )
