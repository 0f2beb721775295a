"""The static-cache path of CUDA graphs, run without capture: sliding windows, host syncs, lengths."""

import pytest
import torch

from skipsearch.engine.shared_kv import StaticKV, check_lengths, crop
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model


def test_static_lengths_are_cropped_and_checked_as_one_vector() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=4))
    cache = StaticKV(runner.config, 16, 1, torch.float32, runner.device)
    cache.lengths.copy_(torch.tensor([9, 7, 9, 9]))
    assert int(cache.layers[2].get_seq_length()) == 9  # each layer reads its entry of the vector
    crop(cache, 8, range(1, 4))
    assert cache.lengths.tolist() == [9, 7, 8, 8]
    crop(cache, 7)
    check_lengths(cache, 7)
    with pytest.raises(AssertionError, match="expected 8"):
        check_lengths(cache, 8)
