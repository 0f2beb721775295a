"""LocalExecutor: the in-process implementation of the Executor interface the search loop uses."""

from __future__ import annotations

import time

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
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
        assert outcome.mask == MASK and outcome.result == profile(MASK)
        assert executor.in_flight == 0


def test_the_seconds_are_the_evaluation_s_own_within_the_wait() -> None:
    """The outcome's time covers the evaluation (it sleeps 50 ms) and lies within the wall time of
    `wait_any`, which runs it."""

    def slow(mask: SkipMask) -> AcceptanceProfile:
        time.sleep(0.05)
        return profile(mask)

    with LocalExecutor(slow) as executor:
        executor.submit(MASK)
        began = time.perf_counter()
        outcome = executor.wait_any()
        wall = time.perf_counter() - began
    assert 0.05 <= outcome.seconds <= wall


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
