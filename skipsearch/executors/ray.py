"""RayExecutor: masks evaluated on long-lived Ray actors (docs/ray.md).

Each actor builds its model and ReferenceCache once from a picklable `WorkerSpec`. Only masks go
out and AcceptanceProfiles come back; the study, cost model and scoring stay in the driver. A
worker that dies is replaced and its mask retried inside the executor, because the search loop
stops at the first failed outcome: only a mask whose workers keep dying comes back as an exception.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, Outcome
from skipsearch.executors.ray_cluster import RayConnection, RayOptions, plan_workers, worker_device
from skipsearch.executors.ray_worker import MeasureWorker, WorkerSpec, actor_class
from skipsearch.masks import SkipMask

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from skipsearch.acceptance.vocab import VocabRanking


log = logging.getLogger(__name__)


class WorkerLostError(RuntimeError):
    """A mask whose worker died on every attempt (killed, out of memory, node lost)."""


@dataclass
class _Task:
    mask: SkipMask
    failures: int = 0
    submitted: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.submitted


class RayExecutor(Executor):
    """Evaluates masks on long-lived Ray actors, `plan.workers` at a time plus a short queue.

    Construction connects (or uses `connection`, taking ownership), sizes the actors to the
    cluster, and waits until every actor has built its evaluator, so a bad model or prompt set
    fails here with its own error. A worker that dies is killed and replaced; its slot takes masks
    again once the replacement has loaded, and the dead worker's mask goes first to whichever
    worker is free. `close` kills the actors and disconnects what it connected.
    """

    def __init__(
        self,
        worker: WorkerSpec,
        options: RayOptions | None = None,
        *,
        device: str = "cpu",
        connection: RayConnection | None = None,
    ) -> None:
        import ray

        self._options = options or RayOptions()
        self._worker = worker
        self._actors: list[ActorHandle] = []
        self._idle: deque[int] = deque()
        self._queue: deque[_Task] = deque()
        self._running: dict[ObjectRef, tuple[int, _Task]] = {}
        self._starting: dict[ObjectRef, int] = {}  # ready() of replacement actors
        self.replacements = 0
        self._connection = connection or RayConnection.open(self._options.address)
        try:
            self.plan = plan_workers(ray.cluster_resources(), device, self._options)
            log.info("Ray: %s", self.plan.describe())
            self._actors = [self._spawn() for _ in range(self.plan.workers)]
            self._await_ready()
            self._idle.extend(range(self.plan.workers))
        except BaseException:
            self.close()
            raise

    @property
    def capacity(self) -> int:
        return self.plan.workers + self._options.queue_depth

    @property
    def in_flight(self) -> int:
        return len(self._queue) + len(self._running)

    @property
    def actors(self) -> tuple[ActorHandle, ...]:
        """The actor handles, one per worker slot (a replaced worker's slot holds the new one)."""
        return tuple(self._actors)

    def _spawn(self) -> ActorHandle:
        return actor_class().options(**self.plan.actor_options()).remote(self._worker)

    def _await_ready(self) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        timeout = self._options.startup_timeout_s
        try:
            ray.get([actor.ready.remote() for actor in self._actors], timeout=timeout)
        except GetTimeoutError:
            raise ConfigError(
                f"Ray workers ({self.plan.describe()}) did not start within {timeout:.0f} s: "
                "the cluster's resources may be taken by other jobs"
            ) from None
        except RayTaskError as exc:
            raise _cause(exc) from None

    def submit(self, mask: SkipMask) -> None:
        if self.in_flight >= self.capacity:
            raise RuntimeError(f"RayExecutor has {self.in_flight} masks in flight: call wait_any() first")
        self._queue.append(_Task(mask))
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            slot, task = self._idle.popleft(), self._queue.popleft()
            self._running[self._actors[slot].evaluate.remote(task.mask)] = (slot, task)

    def wait_any(self) -> Outcome:
        import ray

        if not self.in_flight:
            raise RuntimeError("RayExecutor has no mask in flight: submit() one before wait_any()")
        while True:
            self._dispatch()
            if not self._running and not self._starting:
                task = self._queue.popleft()
                lost = WorkerLostError(f"{task.mask}: no Ray worker is left (replacements failed to start)")
                return Outcome(task.mask, lost, task.elapsed())
            (ref,), _ = ray.wait([*self._running, *self._starting], num_returns=1)
            if ref in self._starting:
                self._started(ref)
            elif (outcome := self._finish(ref)) is not None:
                return outcome

    def _finish(self, ref: ObjectRef) -> Outcome | None:
        """The outcome of one evaluation; None when its worker died and the mask is queued again."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        slot, task = self._running.pop(ref)
        try:
            profile, seconds = ray.get(ref)
        except RayTaskError as exc:
            self._idle.append(slot)
            return Outcome(task.mask, _cause(exc), task.elapsed())
        except RayActorError as exc:
            self._replace(slot, exc)
            task.failures += 1
            if task.failures > self._options.max_retries:
                lost = WorkerLostError(f"{task.mask}: its worker died {task.failures} times; last: {exc}")
                return Outcome(task.mask, lost, task.elapsed())
            log.warning("retrying %s (attempt %d)", task.mask, task.failures + 1)
            self._queue.appendleft(task)
            return None
        self._idle.append(slot)
        return Outcome(task.mask, profile, seconds)

    def _replace(self, slot: int, exc: Exception) -> None:
        """Kill what is left of the dead actor (freeing its GPU) and start a fresh one in its slot."""
        import ray

        log.warning("Ray worker %d died (%s): starting a replacement", slot, str(exc).splitlines()[0])
        ray.kill(self._actors[slot])
        self._actors[slot] = self._spawn()
        self._starting[self._actors[slot].ready.remote()] = slot
        self.replacements += 1

    def _started(self, ref: ObjectRef) -> None:
        """A replacement finished loading: its slot takes masks again, or stays empty if it failed."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        slot = self._starting.pop(ref)
        try:
            ray.get(ref)
        except (RayTaskError, RayActorError) as exc:
            log.error("replacement Ray worker %d failed to start, continuing without it: %s", slot, exc)
            return
        self._idle.append(slot)

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            for actor in self._actors:
                ray.kill(actor)
        if self.replacements:
            log.info("Ray: %d worker(s) were replaced during the run", self.replacements)
        self._actors = []
        self._idle.clear()
        self._queue.clear()
        self._running.clear()
        self._starting.clear()
        self._connection.close()


def _cause(exc: Exception) -> Exception:
    """The exception the worker's code raised, without Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def measurement_executor(
    measure: MeasureConfig,
    temperature: float,
    reference_path: str,
    options: RayOptions,
    ranking: VocabRanking | None = None,
) -> RayExecutor:
    """Ray workers that each load `measure`'s model and the driver's ReferenceCache once.

    `ranking`, the driver's draft-vocabulary ranking, travels with the spec, so a worker on another
    node (another Python, another stdlib to count) drafts from exactly the driver's ids."""
    import ray

    connection = RayConnection.open(options.address)
    try:
        path = Path(reference_path).resolve()
        blob = ray.put(path.read_bytes()) if connection.ships_files() else None
        worker = replace(measure, device=worker_device(measure.device))
        spec = MeasureWorker(worker, temperature, str(path), blob, ranking)
        return RayExecutor(spec, options, device=measure.device, connection=connection)
    except BaseException:
        connection.close()
        raise
