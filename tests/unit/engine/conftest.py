"""The tiny Llama, its prompt and its greedy continuation that the engine tests decode (one thread: tiny
models run op by op), the same Llama on the kernel plan's attention (KV patterns), and a count of
what a decode asks of the host."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from skipsearch.engine import (
    autoregressive_decode,
    ssd,
    timing,
)
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model, with_plan_attention

NEW_TOKENS = 40

PROMPT = (5, 17, 3, 42, 8, 11, 29, 60, 1, 33, 7, 21)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run op by op: extra threads only add contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runner():
    return LayerwiseRunner(tiny_model("llama"))


@pytest.fixture(scope="module")
def reference(runner):
    return autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens


@pytest.fixture(scope="module")
def plan_runner():
    return LayerwiseRunner(with_plan_attention(tiny_model("llama")))


# The methods through which Python code brings a tensor's value to the host: on a GPU, each waits
# for every kernel queued before it.
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


@dataclass
class Traffic:
    """What one decode asked of the host: `reads` of tensor values from Python (`HOST_READS`, the
    model's forward included), `copies` of host values to the device (`torch.tensor`, a sync on
    CUDA), `syncs` (functions made by `device_sync`: the round clock's and the one after the
    prefill) and `checks` of the cache invariant (`check_lengths`, a read on a static cache).

    A read inside a C++ operator is invisible to it: `tests/gpu` counts the syncs CUDA sees."""

    reads: int = 0
    copies: int = 0
    syncs: int = 0
    checks: int = 0


@pytest.fixture
def traffic(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], Any]], tuple[Any, Traffic]]:
    """`measure(decode)`: the decode's result and its `Traffic`, counted only while it runs."""
    measured: list[Traffic] = []  # the decode being measured, while one is

    def counting(field: str, original: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for seen in measured:
                setattr(seen, field, getattr(seen, field) + 1)
            return original(*args, **kwargs)

        return wrapper

    for method in HOST_READS:
        monkeypatch.setattr(torch.Tensor, method, counting("reads", getattr(torch.Tensor, method)))
    monkeypatch.setattr(torch, "tensor", counting("copies", torch.tensor))
    for module in (timing, ssd):
        make = module.device_sync
        monkeypatch.setattr(module, "device_sync", lambda device, make=make: counting("syncs", make(device)))
    monkeypatch.setattr(ssd, "check_lengths", counting("checks", ssd.check_lengths))

    def measure(decode: Callable[[], Any]) -> tuple[Any, Traffic]:
        measured.append(Traffic())
        try:
            return decode(), measured[0]
        finally:
            measured.clear()

    return measure
