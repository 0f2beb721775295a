"""LocalExecutor: the in-process implementation of the Executor interface the search loop uses."""

from __future__ import annotations

import pytest

from skipsearch.acceptance.rounds import AcceptanceProfile
from skipsearch.executors.base import Executor, LocalExecutor
from skipsearch.masks import SkipMask

MASK = SkipMask.from_layers(8, [3])


def profile(mask: SkipMask) -> AcceptanceProfile:
    return AcceptanceProfile(str(mask), ((True, False),), ((0.9, 0.2),), 0.0)


def test_submit_then_wait_any_returns_the_profile_and_time() -> None:
    with LocalExecutor(profile) as executor:
        assert isinstance(executor, Executor) and executor.capacity == 1
        executor.submit(MASK)
        assert executor.in_flight == 1
        outcome = executor.wait_any()
        assert outcome.mask == MASK and outcome.result == profile(MASK) and outcome.seconds >= 0
        assert executor.in_flight == 0


def test_an_evaluator_error_comes_back_as_the_result() -> None:
    def broken(mask: SkipMask) -> AcceptanceProfile:
        raise MemoryError("out of memory")

    executor = LocalExecutor(broken)
    executor.submit(MASK)
    outcome = executor.wait_any()
    assert isinstance(outcome.result, MemoryError) and executor.in_flight == 0


def test_capacity_and_empty_waits_are_enforced() -> None:
    executor = LocalExecutor(profile)
    with pytest.raises(RuntimeError, match="no mask in flight"):
        executor.wait_any()
    executor.submit(MASK)
    with pytest.raises(RuntimeError, match="busy"):
        executor.submit(MASK)
    executor.close()
    assert executor.in_flight == 0


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
    from skipsearch.executors.ray import WorkerPlan
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
    factory(None, 1.0, measurement)
    assert {p.device.type for p in runner.model.parameters()} == {"meta"}
    assert reference.hidden.device.type == "meta" and measurement.num_layers == 3
