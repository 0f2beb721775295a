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
quick; the command line calls the same functions. `skipsearch.search` is the function even once
the subpackage of the same name is imported (`_Package`); the subpackage is reached by its
dotted name (`from skipsearch.search import spaces`).
"""

from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "search": "skipsearch.api",
    "decode": "skipsearch.api",
    "load_model": "skipsearch.models.loading",
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
    from skipsearch.api import DecodeResult, SearchResult, decode, search
    from skipsearch.masks import Draft, KVPattern, SkipMask
    from skipsearch.models.loading import load_model


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'skipsearch' has no attribute {name!r}")


class _Package(ModuleType):
    """This package, whose API names win over its subpackages': importing `skipsearch.search` (the
    search's package) would otherwise rebind `skipsearch.search` from the API's function to it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
