import pytest
import torch
from transformers import DynamicCache

from skipsearch.acceptance.estimator import Estimator, sampling_acceptance
from skipsearch.acceptance.reference import ReferenceCache
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import direct_matches, random_reference, tiny_model

MASKS = [
    SkipMask.from_layers(6, [0]),
    SkipMask.from_layers(6, [2]),
    SkipMask.from_layers(6, [1, 4]),
    SkipMask.prefix(6, 4),
    SkipMask(6, attn=[3], mlp=[1, 5]),
]


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", layers=6, seed=1)
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [7, 12, 4, 9], new_tokens=10)
    return model, runner, reference


def brute_force_shared_kv(runner, reference, mask):
    """Each prediction position alone, with a real cache holding the full model's K/V before it."""
    logits = []
    for row in range(reference.input_ids.shape[0]):
        start, end = int(reference.prompt_lengths[row]), int(reference.lengths[row])
        for pos in range(start - 1, end - 1):
            cache = DynamicCache(config=runner.config)
            for layer in range(runner.num_layers):
                cache.update(
                    reference.keys[layer, row : row + 1, :, :pos],
                    reference.values[layer, row : row + 1, :, :pos],
                    layer,
                )
            hidden = reference.hidden[:, row : row + 1, pos : pos + 1]
            start = mask.first_skipped_layer
            out = runner.run_layers(
                hidden[start], start, runner.num_layers, torch.tensor([[pos]]), mask, cache
            )
            logits.append(runner.head(out)[0, 0])
    return torch.stack(logits)


def test_reference_continuations_have_the_requested_length(setup):
    _, _, reference = setup
    assert (reference.lengths - reference.prompt_lengths).tolist() == [10] * 4
    assert reference.hidden.shape[:2] == (7, 4)


@pytest.mark.parametrize("mode", ["self", "shared-kv"])
def test_empty_mask_is_accepted_everywhere(setup, mode):
    _, runner, reference = setup
    profile = Estimator(runner, reference, mode).evaluate(SkipMask(6))
    assert profile.alpha == 1.0
    assert profile.sampling_acceptance == pytest.approx(1.0)
    assert profile.tokens_per_round(3) == 4.0


@pytest.mark.parametrize("mask", [m for m in MASKS if m.is_layer_level], ids=str)
def test_self_mode_equals_direct_transformers_computation(setup, mask):
    model, runner, reference = setup
    profile = Estimator(runner, reference, "self").evaluate(mask)
    flat = [m for row in profile.greedy_match for m in row]
    assert flat == direct_matches(model, reference, mask.skipped_layers)


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_shared_kv_mode_equals_per_position_decoding_on_the_full_cache(setup, mask):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    assert torch.allclose(
        estimator.draft_logits(mask), brute_force_shared_kv(runner, reference, mask), atol=1e-4
    )


def test_skipping_changes_acceptance(setup):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    alphas = [estimator.evaluate(mask).alpha for mask in MASKS]
    assert min(alphas) < 1.0


def test_sampling_acceptance_is_total_variation_overlap():
    target = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    draft = torch.log(torch.tensor([[0.2, 0.3, 0.5]]))
    assert sampling_acceptance(target, draft, 1.0).item() == pytest.approx(0.7)
    assert sampling_acceptance(target, draft, 0.0).item() == 0.0


def test_reference_cache_round_trips_on_disk(setup, tmp_path):
    _, runner, reference = setup
    path = tmp_path / "ref.safetensors"
    reference.save(path, {"model": "tiny"})
    again = ReferenceCache.load(path, runner.device)
    assert torch.equal(again.hidden, reference.hidden) and torch.equal(again.keys, reference.keys)
    assert Estimator(runner, again, "shared-kv").evaluate(MASKS[1]) == Estimator(
        runner, reference, "shared-kv"
    ).evaluate(MASKS[1])


def test_a_lone_mlp_skip_is_not_ignored(setup):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    mask = SkipMask(6, mlp=[2])
    assert not torch.allclose(estimator.draft_logits(mask), estimator.target_logits)
    assert torch.allclose(
        estimator.draft_logits(mask), brute_force_shared_kv(runner, reference, mask), atol=1e-4
    )


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


def test_target_logits_carry_no_autograd_graph(setup):
    _, runner, reference = setup
    with torch.enable_grad():
        estimator = Estimator(runner, reference, "self")
    assert estimator.target_logits.grad_fn is None and not estimator.target_logits.requires_grad
    assert estimator.time_full_forward() > 0


def test_reference_continuations_are_the_engines_autoregressive_output_in_bf16() -> None:
    """Decoded as the baseline decodes, the reference is the sequence the engine produces, bit for
    bit, even in bf16 (a batched generate parts from it at near-ties)."""
    from skipsearch.engine import autoregressive_decode
    from skipsearch.models.kernels import FP32_ATTENTION, AttentionChoice, apply_attention

    model = tiny_model("llama", layers=4).to(torch.bfloat16)
    apply_attention(model, AttentionChoice("bfloat16", FP32_ATTENTION, {}, {}))
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [9, 14, 6], new_tokens=20)
    for row in range(3):
        start, end = int(reference.prompt_lengths[row]), int(reference.lengths[row])
        prompt = tuple(reference.input_ids[row, :start].tolist())
        expected = reference.input_ids[row, start:end].tolist()
        assert list(autoregressive_decode(runner, prompt, 20).tokens) == expected
