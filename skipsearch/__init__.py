"""skipsearch: find which transformer layers a self-speculative draft should skip.

    import skipsearch

    result = skipsearch.search("smollm2-135m", budget=30, draft_vocab=16384, out="runs/api")
    print(result.best, result.gamma, result.predicted_speedup, result.verdict)
    decoded = skipsearch.decode("smollm2-135m", result.best, gamma=result.gamma)

- `search(model, budget=..., space=..., ...) -> SearchResult`: what `skipsearch run` does.
- `decode(model, draft, gamma=...) -> DecodeResult`: what `skipsearch decode` does.
- `load_model(model)`: a model on this device's kernel plan.
- `Draft`, `SkipMask`, `KVPattern`: what a candidate draft is.

The names load on first use (`skipsearch.api`), so `import skipsearch` and the light commands stay
quick; the command line calls the same functions.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "search": "skipsearch.api",
    "decode": "skipsearch.api",
    "load_model": "skipsearch.api",
    "SearchResult": "skipsearch.api",
    "DecodeResult": "skipsearch.api",
    "Draft": "skipsearch.masks",
    "SkipMask": "skipsearch.masks",
    "KVPattern": "skipsearch.masks",
}
__all__ = [
    "DecodeResult",
    "Draft",
    "KVPattern",
    "SearchResult",
    "SkipMask",
    "__version__",
    "decode",
    "load_model",
    "search",
]

if TYPE_CHECKING:
    from skipsearch.api import DecodeResult, SearchResult, decode, load_model, search
    from skipsearch.masks import Draft, KVPattern, SkipMask


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'skipsearch' has no attribute {name!r}")
