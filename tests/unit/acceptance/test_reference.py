"""Reference continuations: their length, their round trip on disk, and that they are the engine's own
output."""

import torch

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.reference import ReferenceCache
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import random_reference, tiny_model
from tests.unit.acceptance.conftest import MASKS


def test_reference_continuations_have_the_requested_length(setup):
    _, _, reference = setup
    assert (reference.lengths - reference.prompt_lengths).tolist() == [10] * 4
    assert reference.hidden.shape[:2] == (7, 4)
    continuations = reference.continuations()
    assert [len(c) for c in continuations] == [10] * 4
    for row, continuation in enumerate(continuations):
        start = int(reference.prompt_lengths[row])
        assert continuation == tuple(reference.input_ids[row, start : start + 10].tolist())


def test_reference_cache_round_trips_on_disk(setup, tmp_path):
    _, runner, reference = setup
    path = tmp_path / "ref.safetensors"
    reference.save(path, {"model": "tiny"})
    again = ReferenceCache.load(path, runner.device)
    assert torch.equal(again.hidden, reference.hidden) and torch.equal(again.keys, reference.keys)
    assert Estimator(runner, again, "shared-kv").evaluate(MASKS[1]) == Estimator(
        runner, reference, "shared-kv"
    ).evaluate(MASKS[1])


def test_self_mode_leaves_the_reference_k_v_on_disk(setup, tmp_path):
    """`self` mode never reads K/V: loading them would hold 0.7 GiB of a 7B model for nothing."""
    _, runner, reference = setup
    path = tmp_path / "ref.safetensors"
    reference.save(path, {"model": "tiny"})
    lean = ReferenceCache.load(path, runner.device, with_kv=False)
    assert lean.keys is None and lean.values is None and torch.equal(lean.hidden, reference.hidden)
    assert Estimator(runner, lean, "self").evaluate(MASKS[1]) == Estimator(
        runner, reference, "self"
    ).evaluate(MASKS[1])


def test_reference_continuations_are_the_engines_autoregressive_output_in_bf16() -> None:
    """Decoded as the baseline decodes, the reference is the sequence the engine produces, bit for
    bit, even in bf16 (a batched generate parts from it at near-ties)."""
    from skipsearch.cpu.attention_choice import AttentionChoice
    from skipsearch.cpu.attention_paths import FP32_ATTENTION
    from skipsearch.engine import autoregressive_decode
    from skipsearch.models.kernels import apply_attention

    model = tiny_model("llama", layers=4).to(torch.bfloat16)
    apply_attention(model, AttentionChoice("bfloat16", FP32_ATTENTION))
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [9, 14, 6], new_tokens=20)
    for row in range(3):
        start, end = int(reference.prompt_lengths[row]), int(reference.lengths[row])
        prompt = tuple(reference.input_ids[row, :start].tolist())
        expected = reference.input_ids[row, start:end].tolist()
        assert list(autoregressive_decode(runner, prompt, 20).tokens) == expected
