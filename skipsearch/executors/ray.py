"""RayExecutor: masks evaluated on long-lived Ray actors (docs/ray.md).

Each actor builds its model and ReferenceCache once from a picklable `WorkerSpec`. Only masks go
out and AcceptanceProfiles come back; the study, cost model and scoring stay in the driver. A
worker that dies is replaced and its mask retried inside the executor, because the search loop
stops at the first failed outcome: only a mask whose workers keep dying comes back as an exception.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile, Evaluator
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, Outcome
from skipsearch.masks import SkipMask

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from skipsearch.acceptance.vocab import VocabRanking


log = logging.getLogger(__name__)


# -- Ray ----------------------------------------------------------------------------------------
WorkerSpec = Callable[[], Evaluator]
"""A picklable recipe that a Ray actor calls once, in its constructor, to build its evaluator:
`MeasureWorker` for a real model, any module-level callable for tests."""

CONNECT_TIMEOUT_S = 3.0


class WorkerLostError(RuntimeError):
    """A mask whose worker died on every attempt (killed, out of memory, node lost)."""


@dataclass(frozen=True)
class RayOptions:
    """How to reach Ray and how many workers to run.

    `address`: `auto`, `host:port` or `ray://host:port`; None reads RAY_ADDRESS, else a local Ray
    is started. `workers`: None means one per GPU (GPU device) or one (CPU). `max_retries`: how many
    times a mask is re-run after its worker died. `queue_depth`: masks held in the driver beyond one
    per worker, so a worker that finishes starts the next mask before the study asks for one.
    """

    address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    gpus_per_worker: float = 1.0
    max_retries: int = 2
    queue_depth: int = 1
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.cpus_per_worker < 1:
            raise ConfigError(f"--cpus-per-worker must be >= 1, got {self.cpus_per_worker}")
        if not 0 < self.gpus_per_worker <= 1:
            raise ConfigError(
                f"--gpus-per-worker must be in (0, 1], got {self.gpus_per_worker}: a share of one GPU, "
                "e.g. 0.5 runs two workers per GPU"
            )
        if self.max_retries < 0 or self.queue_depth < 0:
            raise ConfigError(
                f"max_retries and queue_depth must be >= 0, got {self.max_retries} and {self.queue_depth}"
            )


def _uses_gpu(device: str) -> bool:
    """CUDA devices are the ones Ray schedules as GPUs."""
    return device.startswith("cuda")


@dataclass(frozen=True)
class WorkerPlan:
    """What the executor asks Ray for: `workers` actors, each with these CPUs and a share of a GPU
    (0 on a CPU; below 1, several actors share one GPU, each holding its own model copy)."""

    workers: int
    cpus_per_worker: int
    gpus_per_worker: float

    def actor_options(self) -> dict[str, Any]:
        """Ray restarts nothing: the executor replaces a dead worker itself and retries its mask."""
        return {"num_cpus": self.cpus_per_worker, "num_gpus": self.gpus_per_worker, "max_restarts": 0}

    def describe(self) -> str:
        if not self.gpus_per_worker:
            return f"{self.workers} CPU worker(s), {self.cpus_per_worker} CPU(s) each"
        share = f"{self.gpus_per_worker:g} GPU and {self.cpus_per_worker} CPU(s)"
        return f"{self.workers} GPU worker(s), {share} each"


def plan_workers(resources: Mapping[str, float], device: str, options: RayOptions) -> WorkerPlan:
    """Size the actors to the cluster: an actor asking for a GPU or CPUs the cluster lacks would
    wait forever, so anything that does not fit is a ConfigError now.

    A CUDA device gets one actor per `gpus_per_worker` share of the GPUs (`--workers` may use
    fewer): the actors must run the driver's device and dtype, since the ReferenceCache they load
    was built with them.
    """
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    share = options.gpus_per_worker
    if _uses_gpu(device):
        if gpus == 0:
            raise ConfigError(
                f"--device {device} but the Ray cluster has no GPU ({cpus} CPUs): use --device cpu"
            )
        fits = math.floor(gpus / share + 1e-9)
        workers = options.workers or fits
        if workers > fits:
            raise ConfigError(
                f"--workers {workers} GPU workers at {share:g} GPU each need {workers * share:g} GPUs but "
                f"the Ray cluster has {gpus}: lower --workers or --gpus-per-worker"
            )
    else:
        workers = options.workers or 1
        if gpus:
            log.info("the Ray cluster has %d GPU(s): pass --device cuda to use one worker per GPU", gpus)
    needed = workers * options.cpus_per_worker
    if needed > cpus:
        raise ConfigError(
            f"{workers} worker(s) x {options.cpus_per_worker} CPU(s) need {needed} CPUs but the Ray "
            f"cluster has {cpus}: lower --workers or --cpus-per-worker"
        )
    return WorkerPlan(workers, options.cpus_per_worker, share if _uses_gpu(device) else 0)


def worker_device(device: str) -> str:
    """Ray shows a GPU actor only its own GPU (CUDA_VISIBLE_DEVICES), as `cuda:0`."""
    return "cuda" if _uses_gpu(device) else device


@dataclass
class RayConnection:
    """This process's link to Ray. `owned`: we called `ray.init`, so `close` calls `ray.shutdown`
    (which stops a Ray we started, or disconnects from a cluster we joined). `client`: a `ray://`
    driver, whose files no worker can read."""

    owned: bool
    client: bool = False
    closed: bool = field(default=False, init=False)

    @classmethod
    def open(cls, address: str | None) -> RayConnection:
        """Join the cluster at `address` (or RAY_ADDRESS), else start a local Ray on this machine's
        resources; a Ray this process already initialised is used as is."""
        import ray

        if ray.is_initialized():
            return cls(owned=False)
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            # "local": never attach to a cluster someone else started on this machine.
            ray.init(
                address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
            )
            return cls(owned=True)
        check_ray_address(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError) as exc:
            raise ConfigError(f"cannot join the Ray cluster at {address}: {exc}") from None
        return cls(owned=True, client=address.startswith("ray://"))

    def ships_files(self) -> bool:
        """Whether a file on the driver may be invisible to a worker: several nodes, or a client."""
        import ray

        return self.client or sum(1 for node in ray.nodes() if node["Alive"]) > 1

    def close(self) -> None:
        import ray

        if self.owned and not self.closed:
            ray.shutdown()
        self.closed = True


def check_ray_address(address: str | None) -> None:
    """Fail in seconds on an address (or RAY_ADDRESS) where nothing listens: `ray.init` would retry
    for minutes. None without RAY_ADDRESS means a local Ray, which needs no check."""
    import importlib.util

    from ray._private.services import canonicalize_bootstrap_address

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return
    if address == "auto":
        try:
            address = canonicalize_bootstrap_address("auto") or ""
        except ConnectionError as exc:
            raise ConfigError(f"--ray-address auto: {exc}") from None
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: use auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(
            f"no Ray cluster answers at {host}:{port} ({exc.strerror or exc}): start one with "
            "`ray start --head` or fix --ray-address / RAY_ADDRESS"
        ) from None
    if client and importlib.util.find_spec("grpc") is None:
        raise ConfigError(f"--ray-address {address} needs Ray Client: pip install 'ray[client]==2.60.0'")


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
        return measurement.evaluator(self.temperature, self.measure.draft_vocabs)

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
def _actor_class() -> Any:
    import ray

    return ray.remote(_Worker)


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
        return _actor_class().options(**self.plan.actor_options()).remote(self._worker)

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
