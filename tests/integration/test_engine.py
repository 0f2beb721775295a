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
@pytest.fixture(scope="module")
def fp32(one_thread):
    """The embedded model in fp32, loaded once for this module's tests (neither changes it)."""
    from skipsearch.models.loading import load_model

    return load_model("smollm2-135m", dtype="float32")


def test_greedy_ssd_is_lossless_on_smollm2(fp32):
    """Token for token in fp32 (bf16 may part at near-ties: `bench.lossless` judges those)."""
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts

    loaded = fp32
    runner = LayerwiseRunner(loaded.model)
    spec = PromptSpec(n_prompts=2, max_prompt_tokens=96, new_tokens=32, seed=0)
    masks = [SkipMask.from_layers(30, [4, 14]), SkipMask.prefix(30, 24)]
    for prompt in encode_prompts(spec, loaded.tokenizer):
        expected = autoregressive_decode(runner, prompt.ids, spec.new_tokens).tokens
        assert len(expected) == spec.new_tokens
        for mask in masks:
            assert speculative_decode(runner, prompt.ids, mask, spec.new_tokens, gamma=3).tokens == expected


def test_greedy_ssd_with_a_kv_pattern_is_lossless_at_long_context(fp32):
    """A KV-pattern draft (every layer, sink 4 + window 256, plus two layers skipped) over a
    1,024-token stdlib-long prompt (4x the window) held out from a 4-prompt search: token for
    token in fp32."""
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.masks import KVPattern

    loaded = fp32
    runner = LayerwiseRunner(loaded.model)
    spec = PromptSpec("stdlib-long", n_prompts=5, max_prompt_tokens=1024, new_tokens=24, seed=0)
    prompt = encode_prompts(spec, loaded.tokenizer)[-1]  # the fifth: after the search's four
    assert len(prompt.ids) == spec.max_prompt_tokens
    expected = autoregressive_decode(runner, prompt.ids, spec.new_tokens).tokens
    kv = KVPattern(4, 256)
    for mask in (SkipMask(30), SkipMask.from_layers(30, [20, 26])):
        result = speculative_decode(runner, prompt.ids, mask, spec.new_tokens, gamma=3, kv=kv)
        assert result.tokens == expected
