"""Every test in this folder needs a CUDA device: each is marked `gpu` here, by folder, and skipped
without one (`pytest -m gpu` selects them, and the `cuda` cases elsewhere)."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            item.add_marker(no_cuda)
