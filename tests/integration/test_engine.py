"""Greedy SSD on the real embedded model equals autoregressive decoding."""

import pytest

from skipsearch.engine import (
    autoregressive_decode,
    speculative_decode,
)
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.unit.engine.conftest import one_thread

pytestmark = pytest.mark.usefixtures("one_thread")


# Fixtures of another folder's conftest.py, imported: listed so that they count as used.
__all__ = ["one_thread"]


# -- the real embedded model ----------------------------------------------------------------------
def test_greedy_ssd_is_lossless_on_smollm2():
    """Token for token in fp32 (bf16 may part at near-ties: `bench.lossless` judges those)."""
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.models.loading import load_model

    loaded = load_model("smollm2-135m", dtype="float32")
    runner = LayerwiseRunner(loaded.model)
    spec = PromptSpec(n_prompts=2, max_prompt_tokens=96, new_tokens=32, seed=0)
    masks = [SkipMask.from_layers(30, [4, 14]), SkipMask.prefix(30, 24)]
    for prompt in encode_prompts(spec, loaded.tokenizer):
        expected = autoregressive_decode(runner, prompt.ids, spec.new_tokens).tokens
        assert len(expected) == spec.new_tokens
        for mask in masks:
            assert speculative_decode(runner, prompt.ids, mask, spec.new_tokens, gamma=3).tokens == expected
