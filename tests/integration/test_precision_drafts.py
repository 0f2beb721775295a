"""Drafts at lower precision on the real embedded model (SmolLM2-135M, fp32): greedy SSD with every
layer at int8 or int4 equals autoregressive decoding, and the round-aware estimator's tokens per
round are the engine's (over the rounds it drafted in full) within 3%."""

import pytest

from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.unit.engine.conftest import one_thread

pytestmark = pytest.mark.usefixtures("one_thread")

__all__ = ["one_thread"]  # a fixture of another folder's conftest.py, imported

GAMMA = 4


def test_int8_and_int4_drafts_are_lossless_and_estimated_within_3_percent():
    from skipsearch.acceptance.estimator import Estimator
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.acceptance.reference import build_reference
    from skipsearch.engine import speculative_decode
    from skipsearch.models.loading import load_model

    loaded = load_model("smollm2-135m", dtype="float32")
    loaded.model.generation_config.eos_token_id = None  # every continuation runs its full length
    runner = LayerwiseRunner(loaded.model)
    spec = PromptSpec(n_prompts=3, max_prompt_tokens=64, new_tokens=40, seed=0)
    prompts = encode_prompts(spec, loaded.tokenizer)
    reference = build_reference(runner, prompts, spec.new_tokens, with_kv=True)
    estimator = Estimator(runner, reference, "rounds", round_gamma=GAMMA)
    for text in ("w8:0-29", "w4:0-29"):
        mask = SkipMask.parse(text, 30)
        engine_rounds = []
        for row in range(reference.input_ids.shape[0]):
            prompt = reference.input_ids[row, : int(reference.prompt_lengths[row])].tolist()
            expected = reference.input_ids[row, len(prompt) : int(reference.lengths[row])].tolist()
            result = speculative_decode(runner, prompt, mask, len(expected), gamma=GAMMA, timed=False)
            assert list(result.tokens) == expected, text  # lossless in fp32
            # the rounds the engine drafted in full: its last ones draft fewer near the output's end,
            # where the estimator's simulation leaves its censored round out
            engine_rounds += [
                n + 1 for d, n in zip(result.gammas, result.accepted, strict=True) if d == GAMMA
            ]
        if runner.fused[0] is not None:  # the plan fuses its layers: so does the draft at lower precision
            bits = 8 if text.startswith("w8") else 4
            assert (
                runner.fused_at(0, bits, "attn") is not None and runner.fused_at(29, bits, "mlp") is not None
            )
        engine = sum(engine_rounds) / len(engine_rounds)
        estimated = estimator.evaluate(mask, temperature=0).tokens_per_round(GAMMA)
        assert estimated == pytest.approx(engine, rel=0.03), text
