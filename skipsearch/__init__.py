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

Subpackages, top layer first (docs/architecture.md, "Layers"; a package imports only from below):
- `cli`: the `skipsearch` command, one module per sub-command; nothing imports it.
- `run`: a run end to end: the pipeline, its run directory, report and exports.
- `search`: spaces, strategies, the Optuna study loop, scoring and the evaluation cache.
- `executors`: where masks are evaluated: in this process or on Ray actors.
- `validate`: fidelity: the estimator and the cost model against the engine.
- `bench`: measurement harnesses over the engine: decode checks, benchmarks, the latency profiler.
- `engine`: real self-speculative decoding, the ground truth.
- `tiers`: tier sets: the runtime policy, its simulation and the manifest.
- `cost`: the cost model: closed forms and the calibrated form over a LatencyProfile (pure).
- `acceptance`: measuring acceptance: prompts, the reference cache, the estimator, AcceptanceProfile.
- `models`: the registry, loading, the layer-wise runner, the kernel plan as the rest sees it.
- `cpu`: the CPU backend: the kernel plan's measured choices and its C kernels.
- `kv`: the kernel plan's KV cache and what a draft's attention reads of it.
- `masks`: `SkipMask`, `KVPattern` and `Draft`: what a draft skips, reads and proposes (pure).

Top-level modules:
- `api`: the Python API above: `search`, `decode`, `load_model`.
- `__main__`: `python -m skipsearch`, the command line.
- `config`: `RunConfig`: what a run measures and how it searches.
- `tree_shapes`: token-tree drafts: a tree's shape and what a round of it accepts.
- `progress`: progress bars for the slow parts, on stderr.
- `store`: where skipsearch keeps files, and writes that a kill never leaves half done.
- `options`: every numeric setting's legal values, declared once.
- `settings_rules`: settings judged as a whole: the combinations a command or an API call cannot mean.
- `errors`: the errors a user can fix; the command line prints each as one line.

Terms (docs/theory.md):
- *SkipMask*: the attention and MLP sub-layers a draft skips; `s1`, its first layer whose input
  differs from the full model's: below it the draft's K/V are exact and verify reuses them.
- *γ* (gamma): the tokens a round drafts; a round commits 1 to γ + 1 tokens.
- *AcceptanceProfile*: what the estimator measures of a draft, per prompt and position.
- *LatencyProfile*: the device's measured times of each part of a pass (`skipsearch profile`).
- *kernel plan*: the kernels a model runs on this device (docs/cpu-backend.md).
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
