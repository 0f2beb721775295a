"""Joining a Ray cluster (or starting a local one) and sizing the actors to it (docs/ray.md).

Fails fast, in one line, on what would otherwise hang: an address where nothing listens, or an
actor asking for a GPU or CPUs the cluster lacks.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.errors import ConfigError

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)


CONNECT_TIMEOUT_S = 3.0


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
    temp_dir: Path | None = None  # a local Ray's session files (`ray_temp_dir`), removed on close
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
            temp_dir = ray_temp_dir()
            ray.init(
                address="local",
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _temp_dir=str(temp_dir),
            )
            return cls(owned=True, temp_dir=temp_dir)
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
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.closed = True


# Ray binds Unix sockets under its temp dir (`session_<date>_<pid>/sockets/plasma_store`), and a
# socket path may have 107 bytes: a temp dir longer than this leaves too few for the rest.
_RAY_TEMP_MAX = 40


def ray_temp_dir() -> Path:
    """Where a local Ray started by this process keeps its session files: under the cache
    (`ray/<pid>`), not the system temp dir, so a run writes only where it was pointed and into
    its cache; a fresh directory of the system temp dir where the cache's path is too long for
    Ray's sockets. Removed when the connection closes."""
    from skipsearch.store import cache_dir

    under_cache = cache_dir() / "ray" / str(os.getpid())
    if len(str(under_cache)) <= _RAY_TEMP_MAX:
        under_cache.mkdir(parents=True, exist_ok=True)
        return under_cache
    return Path(tempfile.mkdtemp(prefix="skipsearch-ray-"))


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
