"""The tiny Llama, its prompt and its greedy continuation that the engine tests decode (one thread: tiny
models run op by op)."""

import pytest
import torch

from skipsearch.engine import (
    autoregressive_decode,
)
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

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
