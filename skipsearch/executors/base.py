"""Executors: where masks are evaluated, behind one small interface (docs/architecture.md, "Data flow").

The search keeps up to `capacity` masks in flight with `submit` and collects whichever finishes
first with `wait_any`, so the same loop drives one in-process evaluator or N Ray actors. An
evaluation that raises comes back as an `Outcome` carrying the exception, so the loop can record
the failed trial before it re-raises.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile, Evaluator
from skipsearch.masks import SkipMask

if TYPE_CHECKING:
    from skipsearch.acceptance.worker import Measurement


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """One finished evaluation: the AcceptanceProfile, or the exception the evaluator raised."""

    mask: SkipMask
    result: AcceptanceProfile | Exception
    seconds: float


class Executor(ABC):
    """Evaluates masks, up to `capacity` at a time; a context manager that closes its workers."""

    @property
    @abstractmethod
    def capacity(self) -> int:
        """How many masks may be in flight at once."""

    @property
    @abstractmethod
    def in_flight(self) -> int:
        """Masks submitted and not yet returned by `wait_any`."""

    @abstractmethod
    def submit(self, mask: SkipMask) -> None:
        """Start evaluating `mask`; a RuntimeError when `capacity` masks are already in flight."""

    @abstractmethod
    def wait_any(self) -> Outcome:
        """Block until one in-flight mask finishes and return it; a RuntimeError when none is."""

    @abstractmethod
    def close(self) -> None:
        """Release workers; in-flight masks are abandoned."""

    def measure_one(self, mask: SkipMask) -> tuple[AcceptanceProfile, float]:
        """Evaluate one mask on an idle executor: its AcceptanceProfile and seconds, or the evaluator's error
        raised here (for `skipsearch measure`, which has no study to record a failure in)."""
        self.submit(mask)
        outcome = self.wait_any()
        if isinstance(outcome.result, Exception):
            raise outcome.result
        return outcome.result, outcome.seconds

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LocalExecutor(Executor):
    """Evaluates in this process, one mask at a time, when the loop waits for it."""

    def __init__(self, evaluate: Evaluator) -> None:
        self._evaluate = evaluate
        self._pending: SkipMask | None = None

    @property
    def capacity(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return 0 if self._pending is None else 1

    def submit(self, mask: SkipMask) -> None:
        if self._pending is not None:
            raise RuntimeError(f"LocalExecutor is busy with {self._pending}: call wait_any() before submit()")
        self._pending = mask

    def wait_any(self) -> Outcome:
        mask = self._pending
        if mask is None:
            raise RuntimeError("LocalExecutor has no mask in flight: submit() one before wait_any()")
        self._pending = None
        start = time.perf_counter()
        try:
            result: AcceptanceProfile | Exception = self._evaluate(mask)
        except Exception as exc:
            result = exc
        return Outcome(mask, result, time.perf_counter() - start)

    def close(self) -> None:
        self._pending = None


ExecutorFactory = Callable[[MeasureConfig, float, "Measurement"], Executor]
"""`factory(measure, temperature, measurement)`: the executor a command evaluates masks on. The
driver has already prepared `measurement` (so its ReferenceCache is on disk) before any worker starts.
A factory whose workers each hold their own copy of the model on a GPU releases the driver's copy
(`Measurement.release_model`, which sets `model_released`), so one GPU never holds it twice: the
caller reads `measurement.model_released` before computing with the model again."""


def local_executor(measure: MeasureConfig, temperature: float, measurement: Measurement) -> Executor:
    """Evaluate in this process with the model the driver already loaded."""
    return LocalExecutor(measurement.evaluator(temperature, measure.draft_vocabs, measure.kv_patterns))
