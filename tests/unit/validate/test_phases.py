"""Decode-only time: the prefill each decoder measured, taken out exactly."""

from __future__ import annotations

import pytest

from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine.result import DecodeTrace
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.validate.phases import decode_seconds
from tests.conftest import tiny_model

PROMPT = (5, 17, 3, 42, 8, 11, 29, 60, 1, 33, 7, 21)


def test_both_decoders_time_their_prefill_and_decode_seconds_takes_it_out() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=4))
    ar = autoregressive_decode(runner, PROMPT, 6)
    ssd = speculative_decode(runner, PROMPT, SkipMask.from_layers(4, [2]), 6, gamma=2)
    for result in (ar, ssd):
        assert result.prefill_seconds is not None and 0 < result.prefill_seconds < result.seconds
        # The measured prefill wins over an estimate, however wrong the estimate is.
        assert decode_seconds(result, prefill=1e6) == pytest.approx(result.seconds - result.prefill_seconds)
    assert ssd.to_dict()["prefill_seconds"] == ssd.prefill_seconds


def test_a_result_without_a_measured_prefill_falls_back_to_rounds_or_the_estimate() -> None:
    untimed = DecodeTrace(prompt_length=3, tokens=(1, 2), seconds=2.0)
    assert decode_seconds(untimed, prefill=0.5) == pytest.approx(1.5)
