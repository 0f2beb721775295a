"""The importance a run's ranking / knapsack strategies read, kept in its run directory.

`importance.json` holds the proxy (always: one pass over the reference cache) and, once asked for,
the measured form; `importance.png` plots both per layer. A resumed run reads the file back, so
its strategies plan from exactly the numbers the first session used.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from skipsearch.acceptance.importance import IMPORTANCE_SOURCES, SublayerImportance, measured_importance
from skipsearch.acceptance.worker import Measurement
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor
from skipsearch.masks import SkipMask
from skipsearch.run.pyplot import plt
from skipsearch.search.evaluation_cache import EvaluationCache
from skipsearch.search.strategies import unit_masks
from skipsearch.search.subset_spaces import SubsetSpace
from skipsearch.store import IMPORTANCE_FILE, IMPORTANCE_PLOT, atomic_path, write_text_atomic


def run_importance(
    out: Path,
    source: str,
    measurement: Measurement,
    space: SubsetSpace,
    executor: Executor,
    cache: EvaluationCache,
) -> SublayerImportance:
    """The `source` importance for `space`, from `out/importance.json` or computed and stored.

    `measured` evaluates every single-unit mask of the space not yet in `cache` on `executor`.
    """
    from skipsearch.acceptance.stream_proxy import proxy_importance

    stored = read_importance(out)
    known = dict(stored)
    if "proxy" not in known:
        known["proxy"] = proxy_importance(measurement.runner, measurement.estimator.reference)
    if source == "measured" and "measured" not in known:
        masks = unit_masks(space)
        measure_into_cache(executor, masks, cache)
        alphas = {mask: cache_profile_alpha(cache, mask) for mask in masks}
        known["measured"] = measured_importance(space.num_layers, alphas)
    if known != stored:
        write_importance(out, known)
    return known[source]


def cache_profile_alpha(cache: EvaluationCache, mask: SkipMask) -> float:
    cached = cache.get(mask)
    assert cached is not None, f"{mask} was just measured"
    return cached.profile.alpha


def measure_into_cache(executor: Executor, masks: list[SkipMask], cache: EvaluationCache) -> None:
    """Evaluate the masks `cache` lacks, keeping the executor's capacity busy; an error is raised."""
    pending = iter([m for m in masks if m not in cache])
    while True:
        while executor.in_flight < executor.capacity and (mask := next(pending, None)) is not None:
            executor.submit(mask)
        if not executor.in_flight:
            return
        outcome = executor.wait_any()
        if isinstance(outcome.result, Exception):
            raise outcome.result
        cache.put(outcome.mask, outcome.result, outcome.seconds)


def read_importance(out: Path) -> dict[str, SublayerImportance]:
    path = out / IMPORTANCE_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error}): delete it to recompute it") from None
    return {
        source: SublayerImportance.from_dict(data[source])
        for source in IMPORTANCE_SOURCES
        if data.get(source)
    }


def write_importance(out: Path, known: dict[str, SublayerImportance]) -> None:
    data = {source: known[source].to_dict() if source in known else None for source in IMPORTANCE_SOURCES}
    write_text_atomic(out / IMPORTANCE_FILE, json.dumps(data, indent=1) + "\n")
    plot_importance(known, out / IMPORTANCE_PLOT)


def plot_importance(known: dict[str, SublayerImportance], path: Path) -> None:
    """One panel per source: attention, MLP and whole-layer importance by layer."""
    fig, axes = plt.subplots(len(known), 1, figsize=(8, 3.2 * len(known)), squeeze=False)
    for ax, (source, importance) in zip(axes[:, 0], sorted(known.items()), strict=True):
        layers = np.arange(importance.num_layers)
        for offset, (label, table) in zip(
            (-0.27, 0.0, 0.27),
            (("attention", importance.attn), ("MLP", importance.mlp), ("layer", importance.layer)),
            strict=True,
        ):
            heights = [np.nan if v is None else v for v in table]
            ax.bar(layers + offset, heights, width=0.27, label=label)
        ylabel = "1 − cos(stream before, after)" if source == "proxy" else "1 − α of the single skip"
        ax.set(xlabel="layer", ylabel=ylabel, title=f"Importance ({source})")
        ax.legend(loc="upper center")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_path(path) as staging:
        fig.savefig(staging, dpi=120, format="png")
    plt.close(fig)
