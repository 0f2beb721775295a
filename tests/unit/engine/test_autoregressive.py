"""The engine's greedy autoregressive decoding equals `transformers` generate."""

import pytest
import torch

from tests.unit.engine.conftest import NEW_TOKENS, PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")


def test_greedy_autoregressive_equals_transformers_generate(runner, reference):
    expected = runner.model.generate(
        torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
    )
    assert tuple(expected[0, len(PROMPT) :].tolist()) == reference
