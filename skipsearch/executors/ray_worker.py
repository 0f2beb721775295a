"""What runs inside a Ray actor: the worker spec that builds its evaluator, and the actor class.

Only masks go in and AcceptanceProfiles come out (`executors.ray` drives the actors).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile, Evaluator
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask

if TYPE_CHECKING:
    from ray import ObjectRef

    from skipsearch.acceptance.vocab import VocabRanking


log = logging.getLogger(__name__)


WorkerSpec = Callable[[], Evaluator]
"""A picklable recipe that a Ray actor calls once, in its constructor, to build its evaluator:
`MeasureWorker` for a real model, any module-level callable for tests."""


@dataclass(frozen=True)
class MeasureWorker:
    """Worker spec for a real model: `prepare(measure)` in the actor, then evaluate at `temperature`.

    The driver built the ReferenceCache at `reference_path` first. A worker that can read that path
    (same machine, shared filesystem) adopts the driver's cache directory, so `prepare` finds it (and
    any converted GGUF) there; otherwise `reference_blob`, the file's bytes in Ray's object store,
    is written to the worker's own cache once. Either way no worker rebuilds it.
    """

    measure: MeasureConfig
    temperature: float
    reference_path: str
    reference_blob: ObjectRef | None = None
    ranking: VocabRanking | None = None

    def __call__(self) -> Evaluator:
        from skipsearch.acceptance.worker import prepare

        self._place_reference()
        measurement = prepare(self.measure)
        if Path(measurement.reference_path).name != Path(self.reference_path).name:
            log.warning(
                "worker built its own reference %s instead of the driver's %s: check that the model "
                "resolves to the same source on every node",
                measurement.reference_path,
                self.reference_path,
            )
        if self.ranking is not None:
            measurement.ranking = self.ranking
        return measurement.evaluator(self.temperature, self.measure.draft_vocabs, self.measure.kv_patterns)

    def _place_reference(self) -> None:
        import ray

        from skipsearch.store import (
            REFERENCE_SUFFIX,
            adopt_cache_dir,
            cache_dir_holding,
            reference_cache_path,
            write_bytes_atomic,
        )

        shared = Path(self.reference_path)
        if shared.is_file():
            adopt_cache_dir(cache_dir_holding(shared))
            return
        local = reference_cache_path(shared.name.removesuffix(REFERENCE_SUFFIX))
        if local.is_file():
            return
        if self.reference_blob is None:
            raise ConfigError(
                f"the reference cache {shared} is not visible on worker node "
                f"{ray.util.get_node_ip_address()}: set SKIPSEARCH_CACHE to a shared directory"
            )
        write_bytes_atomic(local, ray.get(self.reference_blob))


class _Worker:
    """The actor: builds its evaluator once, then measures masks for the lifetime of the executor.

    A spec that raises is kept and re-raised by every call, so the driver sees the original
    exception (e.g. a ConfigError from loading the model) rather than Ray's "actor died" text.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self._evaluate: Evaluator | None = None
        self._error: Exception | None = None
        try:
            self._evaluate = spec()
        except Exception as exc:
            self._error = exc

    def ready(self) -> None:
        if self._error is not None:
            raise self._error

    def evaluate(self, mask: SkipMask) -> tuple[AcceptanceProfile, float]:
        self.ready()
        assert self._evaluate is not None
        start = time.perf_counter()
        profile = self._evaluate(mask)
        return profile, time.perf_counter() - start


@cache
def actor_class() -> Any:
    import ray

    return ray.remote(_Worker)
