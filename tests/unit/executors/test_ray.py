"""RayExecutor: the same profiles as LocalExecutor, a killed worker costs the study nothing, a bad
address fails in seconds, GPU workers are sized from the cluster, and no Ray process outlives it.

Actors unpickle the worker specs below by importing this module, so its top level imports only
what they need; model and search imports live in the tests that use them. Tests that only need a
cluster share one (`TestOnASharedRay`); those about start-up and shutdown let the executor start
and stop its own, as the CLI does. Ray's processes are traced with an environment marker they
inherit from this process, since other Ray instances may run on the same machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Evaluator, Executor, LocalExecutor
from skipsearch.executors.ray import RayExecutor
from skipsearch.executors.ray_cluster import RayOptions, WorkerPlan, plan_workers, worker_device
from skipsearch.executors.ray_worker import MeasureWorker
from skipsearch.masks import SkipMask
from tests.unit.executors.conftest import MARKER, assert_ray_gone, ray

NUM_LAYERS = 12


# -- worker specs: module-level, so an actor unpickles them by importing this file -------------
@dataclass(frozen=True)
class TinyModelWorker:
    """The tiny Llama of test_estimator with the ReferenceCache the test saved at `reference`."""

    reference: str

    def __call__(self) -> Evaluator:
        from skipsearch.acceptance.estimator import Estimator
        from skipsearch.acceptance.reference import ReferenceCache
        from skipsearch.models.runner import LayerwiseRunner
        from tests.conftest import tiny_model

        runner = LayerwiseRunner(tiny_model("llama", layers=6, seed=1))
        reference = ReferenceCache.load(Path(self.reference), runner.device)
        return partial(Estimator(runner, reference, "shared-kv").evaluate, temperature=1.0)


@dataclass(frozen=True)
class Toy:
    """Acceptance 0.9 per skipped sub-layer, after `seconds`: enough for a study to rank masks."""

    seconds: float

    def __call__(self) -> Evaluator:
        return self.evaluate

    def evaluate(self, mask: SkipMask) -> AcceptanceProfile:
        time.sleep(self.seconds)
        accept = 0.9 ** (len(mask.attn) + len(mask.mlp))
        row = tuple(i / 8 < accept for i in range(8))
        return AcceptanceProfile(str(mask), (row,), ((accept,) * 8,), 0.0)


@dataclass(frozen=True)
class Broken:
    """Fails where told: building the evaluator (a bad model) or evaluating (out of memory)."""

    at: str

    def __call__(self) -> Evaluator:
        if self.at == "build":
            raise ConfigError("no such model")
        return self.evaluate

    def evaluate(self, mask: SkipMask) -> AcceptanceProfile:
        raise MemoryError("out of memory")


@dataclass(frozen=True)
class VisibleGpu:
    """Reports, in the profile's mask field, which GPU Ray gave the actor."""

    def __call__(self) -> Evaluator:
        return self.evaluate

    def evaluate(self, mask: SkipMask) -> AcceptanceProfile:
        time.sleep(0.2)  # both masks in flight at once, so each worker gets one
        return AcceptanceProfile(os.environ["CUDA_VISIBLE_DEVICES"], ((True,),), ((1.0,),), 0.0)


# -- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """Tag every process Ray starts from now on (they inherit this process's environment)."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, tag)
    return tag


def evaluate_all(executor: Executor, masks: list[SkipMask]) -> dict[str, AcceptanceProfile | Exception]:
    """Keep the executor full, as the search loop does, until every mask came back."""
    pending, results = list(masks), {}
    while pending or executor.in_flight:
        while pending and executor.in_flight < executor.capacity:
            executor.submit(pending.pop())
        outcome = executor.wait_any()
        results[str(outcome.mask)] = outcome.result
    return results


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- (1), (2) and failures, on one Ray the tests share ------------------------------------------
@pytest.fixture(scope="class")
def shared_ray() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_gpu_workers_free_the_drivers_model(monkeypatch) -> None:
    """The driver's weights and reference leave the device once GPU workers hold their own."""
    import argparse
    from types import SimpleNamespace

    import torch

    from skipsearch.acceptance.estimator import Estimator
    from skipsearch.acceptance.prompts import PromptSpec
    from skipsearch.acceptance.reference import ReferenceCache
    from skipsearch.acceptance.worker import Measurement
    from skipsearch.cli import executor_options
    from skipsearch.executors.ray_cluster import WorkerPlan
    from skipsearch.models.loading import LoadedModel
    from skipsearch.models.runner import LayerwiseRunner
    from tests.conftest import tiny_model

    runner = LayerwiseRunner(tiny_model("llama", layers=3))
    ids = torch.tensor([[1, 2, 3, 4]])
    states: list = []
    runner.run_layers(runner.embed(ids), 0, 3, torch.arange(4)[None], collect=states)
    reference = ReferenceCache(ids, torch.tensor([2]), torch.tensor([4]), torch.stack(states))
    measurement = Measurement(
        LoadedModel(runner.model, None, "tiny", "memory"),
        runner,
        Estimator(runner, reference),
        "ref",
        PromptSpec(),
    )
    plan = WorkerPlan(workers=2, cpus_per_worker=1, gpus_per_worker=0.5)
    monkeypatch.setattr(executor_options, "measurement_executor", lambda *a: SimpleNamespace(plan=plan))
    parser = argparse.ArgumentParser()
    executor_options.add_executor_options(parser)
    factory = executor_options.executor_factory(
        parser.parse_args(["--executor", "ray", "--gpus-per-worker", "0.5"])
    )
    factory(MeasureConfig(), 1.0, measurement)
    assert measurement.model_released
    assert {p.device.type for p in runner.model.parameters()} == {"meta"}
    assert reference.hidden.device.type == "meta" and measurement.num_layers == 3


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
class TestOnASharedRay:
    def test_two_workers_return_exactly_the_local_profiles(self, tmp_path: Path) -> None:
        from skipsearch.models.runner import LayerwiseRunner
        from tests.conftest import random_reference, tiny_model
        from tests.unit.acceptance.conftest import MASKS

        model = tiny_model("llama", layers=6, seed=1)
        model.generation_config.eos_token_id = None
        reference = random_reference(LayerwiseRunner(model), [7, 12, 4, 9], new_tokens=10)
        reference.save(tmp_path / "reference.safetensors", {"model": "tiny"})
        worker = TinyModelWorker(str(tmp_path / "reference.safetensors"))

        with LocalExecutor(worker()) as local:
            expected = evaluate_all(local, MASKS)
        with RayExecutor(worker, RayOptions(workers=2)) as executor:
            assert executor.plan == WorkerPlan(workers=2, cpus_per_worker=1, gpus_per_worker=0)
            assert executor.capacity == 3
            got = evaluate_all(executor, MASKS)
        assert got == expected
        assert all(isinstance(profile, AcceptanceProfile) for profile in got.values())

    def test_a_killed_worker_is_replaced_and_the_study_finishes_its_budget(self, tmp_path: Path) -> None:
        from optuna.trial import TrialState

        from skipsearch.search import SearchConfig, load_study, make_strategy, run_study
        from skipsearch.search.space_files import load_space
        from tests.unit.search.conftest import synthetic_score

        space = load_space("sparse").resolve(NUM_LAYERS)
        with RayExecutor(Toy(0.3), RayOptions(workers=2)) as executor:

            def kill_a_worker(scored: int, budget: int, best: float | None) -> None:
                if scored == 3 and executor.replacements == 0:
                    ray.kill(executor.actors[0])

            result = run_study(
                space,
                make_strategy("random"),
                executor,
                synthetic_score,
                tmp_path,
                SearchConfig(budget=12, seed=0),
                on_trial=kill_a_worker,
            )
            assert executor.replacements == 1
        assert result.budget_used == 12 and result.model_evaluations == 12
        study = load_study(tmp_path, "random")
        assert study.get_trials(states=(TrialState.FAIL,)) == []
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 12

    def test_an_evaluator_error_comes_back_as_itself_without_retries(self) -> None:
        with RayExecutor(Broken("evaluate"), RayOptions(workers=1)) as executor:
            outcome = evaluate_all(executor, [SkipMask.from_layers(NUM_LAYERS, [3])])
            assert executor.replacements == 0
        assert [type(error) for error in outcome.values()] == [MemoryError]

    def test_a_worker_finds_the_drivers_reference_or_writes_the_shipped_copy(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The step before `prepare` in every MeasureWorker (loading a real model is for the CLI test)."""
        node_cache, driver_cache = tmp_path / "node", tmp_path / "driver"
        monkeypatch.setenv("SKIPSEARCH_CACHE", str(node_cache))
        driver_copy = driver_cache / "reference" / "key.safetensors"
        shipped = MeasureWorker(MeasureConfig(), 1.0, str(driver_copy), ray.put(b"tensors"))
        shipped._place_reference()  # another node: the driver's file is not there
        assert (node_cache / "reference" / "key.safetensors").read_bytes() == b"tensors"

        driver_copy.parent.mkdir(parents=True)
        driver_copy.write_bytes(b"tensors")
        MeasureWorker(MeasureConfig(), 1.0, str(driver_copy))._place_reference()  # same machine
        assert os.environ["SKIPSEARCH_CACHE"] == str(driver_cache)

        elsewhere = MeasureWorker(
            MeasureConfig(), 1.0, str(tmp_path / "gone" / "reference" / "x.safetensors")
        )
        with pytest.raises(ConfigError, match="not visible on worker node"):
            elsewhere._place_reference()

    def test_a_worker_that_cannot_build_its_evaluator_fails_the_start_with_its_own_error(self) -> None:
        with pytest.raises(ConfigError, match="no such model"):
            RayExecutor(Broken("build"), RayOptions(workers=2))
        assert ray.is_initialized()  # a Ray the caller started is the caller's to stop


# -- (3) an address where nothing listens ------------------------------------------------------
@pytest.mark.parametrize("scheme", ["ray://", "", "RAY_ADDRESS="])
def test_an_address_where_nothing_listens_fails_within_seconds(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{unused_port()}"
    if scheme == "RAY_ADDRESS=":
        monkeypatch.setenv("RAY_ADDRESS", address)
        options = RayOptions()
    else:
        options = RayOptions(address=scheme + address)
    began = time.perf_counter()
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at {address}"):
        RayExecutor(Toy(0.0), options)
    assert time.perf_counter() - began < 5
    assert not ray.is_initialized()


def test_the_cli_reports_a_dead_address_in_one_line_before_loading_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from skipsearch.cli import main

    began = time.perf_counter()
    code = main(["run", "--executor", "ray", "--ray-address", f"ray://127.0.0.1:{unused_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("skipsearch: error: no Ray cluster answers") and err.count("\n") == 1
    assert time.perf_counter() - began < 5


def test_ray_only_options_without_ray_are_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    from skipsearch.cli import main

    assert main(["measure", "--skip", "4", "--workers", "2"]) == 2
    assert "--workers only apply to --executor ray" in capsys.readouterr().err


# -- (4) GPU placement -------------------------------------------------------------------------
def test_gpu_workers_are_sized_from_the_cluster_resources() -> None:
    gpu_box = {"CPU": 16.0, "GPU": 4.0, "memory": 1e11}
    plan = plan_workers(gpu_box, "cuda:1", RayOptions())
    assert plan == WorkerPlan(workers=4, cpus_per_worker=1, gpus_per_worker=1)
    assert plan.actor_options() == {"num_cpus": 1, "num_gpus": 1, "max_restarts": 0}
    assert worker_device("cuda:1") == "cuda" and worker_device("cpu") == "cpu"
    assert plan_workers(gpu_box, "cuda", RayOptions(workers=2, cpus_per_worker=4)).workers == 2
    assert plan_workers(gpu_box, "cpu", RayOptions(workers=3)).gpus_per_worker == 0
    with pytest.raises(ConfigError, match="--workers 5 GPU workers at 1 GPU each need 5 GPUs but the Ray"):
        plan_workers(gpu_box, "cuda", RayOptions(workers=5))
    with pytest.raises(ConfigError, match="has no GPU"):
        plan_workers({"CPU": 8.0}, "cuda", RayOptions())
    with pytest.raises(ConfigError, match="need 6 CPUs but the Ray cluster has 2"):
        plan_workers({"CPU": 2.0}, "cpu", RayOptions(workers=3, cpus_per_worker=2))


def test_a_fraction_of_a_gpu_per_worker_packs_several_workers_on_each() -> None:
    plan = plan_workers({"CPU": 16.0, "GPU": 1.0}, "cuda", RayOptions(gpus_per_worker=0.25))
    assert plan == WorkerPlan(workers=4, cpus_per_worker=1, gpus_per_worker=0.25)
    assert plan.actor_options()["num_gpus"] == 0.25 and "0.25 GPU" in plan.describe()
    with pytest.raises(ConfigError, match=r"need 1\.5 GPUs but the Ray cluster has 1"):
        plan_workers({"CPU": 16.0, "GPU": 1.0}, "cuda", RayOptions(workers=3, gpus_per_worker=0.5))
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="--gpus-per-worker must be in"):
            RayOptions(gpus_per_worker=bad)


@pytest.mark.slow
def test_each_gpu_worker_gets_its_own_gpu(marker: str) -> None:
    """Two GPUs declared to a CPU-only Ray: the scheduling and CUDA_VISIBLE_DEVICES are real."""
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with RayExecutor(VisibleGpu(), device="cuda") as executor:
            assert executor.plan == WorkerPlan(workers=2, cpus_per_worker=1, gpus_per_worker=1)
            profiles = evaluate_all(executor, [SkipMask.from_layers(NUM_LAYERS, [i]) for i in range(2)])
        assert sorted(profile.mask for profile in profiles.values()) == ["0", "1"]
    finally:
        ray.shutdown()
    assert_ray_gone(marker)


# -- (5) a Ray the executor started is gone after close, also after Ctrl-C ----------------------
@pytest.mark.slow
def test_ctrl_c_while_waiting_leaves_no_ray_process(marker: str) -> None:
    # Ctrl-C raises KeyboardInterrupt only under Python's default handler, and a suite launched in
    # the background (`nohup ... &`) starts with SIGINT ignored: install it for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ctrl_c_while_waiting(marker)
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c_while_waiting(marker: str) -> None:
    with RayExecutor(Toy(30.0), RayOptions(workers=1)) as executor:
        executor.submit(SkipMask.from_layers(NUM_LAYERS, [3]))
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        began = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            executor.wait_any()
        assert time.perf_counter() - began < 10
    assert_ray_gone(marker)


def test_a_local_ray_keeps_its_session_files_under_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from skipsearch.executors.ray_cluster import ray_temp_dir

    near = Path(tempfile.mkdtemp(prefix="c", dir="/tmp"))  # a short cache path, as most are
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(near))
    short = ray_temp_dir()
    assert short == near / "ray" / str(os.getpid()) and short.is_dir()
    shutil.rmtree(near)
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / ("x" * 80)))  # too long for Ray's sockets
    long = ray_temp_dir()
    assert long.parent == Path(tempfile.gettempdir()) and long.name.startswith("skipsearch-ray-")
    long.rmdir()
