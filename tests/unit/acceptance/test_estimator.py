"""The estimator in each mode against a direct computation with plain transformers.

The round-aware estimator (`rounds` mode) reproduces the SSD engine's greedy rounds exactly.

The engine's draft reads the full model's K/V before its round and its own K/V within it; the
`rounds` mode simulates that, so at every position the engine judges, the estimator's greedy match
must equal the engine's accept decision — where `shared-kv` (full K/V within the round too) may not.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.profile import AcceptanceProfile, _walk_tree
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import FP32_ATTENTION, KERNEL_ATTENTION
from skipsearch.cpu.decode_attention import load_kernel
from skipsearch.engine import GammaPolicy, speculative_decode
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.kernels import apply_attention
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import TreeShape
from tests.conftest import direct_matches, random_reference, tiny_model, with_plan_attention
from tests.unit.acceptance.conftest import MASKS

LAYERS = 6

NEW_TOKENS = 24

ROUND_MASKS = [
    SkipMask.from_layers(LAYERS, [2]),
    SkipMask.from_layers(LAYERS, [1, 4]),
    SkipMask(LAYERS, attn=[3], mlp=[1, 5]),
    SkipMask(LAYERS, attn=[], mlp=[2, 4]),
    SkipMask.prefix(LAYERS, 4),
]


PRECISION_MASKS = [
    SkipMask.parse("w8:0-5", LAYERS),
    SkipMask.parse("w4:0-5", LAYERS),
    SkipMask.parse("w8m:1|w4:3-5", LAYERS),  # s1 = 2: the engine's verify completes layer 1's MLP
    SkipMask.parse("a:1|m:1|w8:2-5", LAYERS),
    SkipMask.parse("w8a:2|m:2|w4m:4", LAYERS),
]


@pytest.fixture(scope="module")
def rounds_setup():
    model = tiny_model("llama", layers=LAYERS, seed=1)
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [7, 12, 5, 9], new_tokens=NEW_TOKENS, seed=5)
    return runner, reference


def engine_judgements(
    runner, reference, mask, gamma, kv=None, new_tokens=NEW_TOKENS
) -> list[tuple[int, int, bool]]:
    """(reference row, continuation offset, accepted) of every draft token the engine judged."""
    judged = []
    for row in range(reference.input_ids.shape[0]):
        prompt = reference.input_ids[row, : int(reference.prompt_lengths[row])].tolist()
        result = speculative_decode(runner, prompt, mask, new_tokens, gamma=gamma, kv=kv)
        continuation = reference.input_ids[row, len(prompt) : int(reference.lengths[row])].tolist()
        assert list(result.tokens) == continuation  # lossless: the engine judges the same tokens
        offset = 0
        for drafted, accepted in zip(result.gammas, result.accepted, strict=True):
            judged += [(row, offset + j, j < accepted) for j in range(min(accepted + 1, drafted))]
            offset += accepted + 1
    return judged


def disagreements(profile, judged) -> int:
    return sum(profile.greedy_match[row][offset] != accepted for row, offset, accepted in judged)


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


# -- estimation -----------------------------------------------------------------------------------
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


@pytest.mark.parametrize("mask", PRECISION_MASKS[1:3], ids=str)
def test_shared_kv_mode_runs_lower_precision_sub_layers_as_a_cached_pass_does(setup, mask):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    logits = estimator.draft_logits(mask)
    assert torch.allclose(logits, brute_force_shared_kv(runner, reference, mask), atol=1e-4)
    assert not torch.allclose(logits, estimator.target_logits, atol=1e-3)


def test_skipping_changes_acceptance(setup):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    alphas = [estimator.evaluate(mask).alpha for mask in MASKS]
    assert min(alphas) < 1.0


def test_a_greedy_draft_is_judged_against_the_decoded_continuation(setup):
    """The target token is the continuation the full model decoded, not the teacher-forced argmax:
    in bf16 the two part at near-ties, and the engine reproduces the decoded one. Here the first
    continuation token is swapped for another, so the full model itself, as a draft, misses it."""
    _, runner, reference = setup
    ids = reference.input_ids.clone()
    row, col = 0, int(reference.prompt_lengths[0])
    ids[row, col] = (ids[row, col] + 1) % runner.config.vocab_size
    swapped = replace(reference, input_ids=ids)
    profile = Estimator(runner, swapped, "shared-kv").evaluate(SkipMask(6))
    assert profile.greedy_match[0][0] is False
    assert all(profile.greedy_match[0][1:])


def test_a_lone_mlp_skip_is_not_ignored(setup):
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "shared-kv")
    mask = SkipMask(6, mlp=[2])
    assert not torch.allclose(estimator.draft_logits(mask), estimator.target_logits)
    assert torch.allclose(
        estimator.draft_logits(mask), brute_force_shared_kv(runner, reference, mask), atol=1e-4
    )


def test_target_logits_carry_no_autograd_graph(setup):
    _, runner, reference = setup
    with torch.enable_grad():
        estimator = Estimator(runner, reference, "self")
    assert estimator.target_logits.grad_fn is None and not estimator.target_logits.requires_grad


def test_the_full_forward_time_is_the_second_pass_only(setup, monkeypatch):
    """`time_full_forward` runs one untimed pass, then times one: each pass here sleeps 50 ms, so
    the time is at least one pass and the wall time around the call exceeds it by at least the
    untimed one."""
    _, runner, reference = setup
    estimator = Estimator(runner, reference, "self")
    passes = []
    monkeypatch.setattr(estimator, "_full_forward", lambda: (passes.append(1), time.sleep(0.05)))
    began = time.perf_counter()
    seconds = estimator.time_full_forward()
    wall = time.perf_counter() - began
    assert len(passes) == 2 and seconds >= 0.05 and wall - seconds >= 0.05


@pytest.mark.slow
def test_rounds_mode_matches_every_engine_judgement(rounds_setup) -> None:
    runner, reference = rounds_setup
    shared = Estimator(runner, reference, "shared-kv")
    shared_misses = 0
    for gamma in (2, 4):
        rounds = Estimator(runner, reference, "rounds", round_gamma=gamma)
        for mask in ROUND_MASKS:
            judged = engine_judgements(runner, reference, mask, gamma)
            assert disagreements(rounds.evaluate(mask, temperature=0), judged) == 0, (mask, gamma)
            shared_misses += disagreements(shared.evaluate(mask, temperature=0), judged)
        assert len(rounds.passes) == len(ROUND_MASKS) and min(rounds.passes) >= 2
    assert shared_misses > 0  # the engine's own K/V within a round matters on these masks


@pytest.mark.parametrize("mask", PRECISION_MASKS, ids=str)
def test_rounds_mode_matches_every_engine_judgement_of_a_lower_precision_draft(rounds_setup, mask) -> None:
    """int8 / int4 sub-layers run on the same copies in the estimator and in the engine's draft, and
    their own K/V within a round are the engine's: the same judgements at every γ, so the same tokens
    per round."""
    runner, reference = rounds_setup
    for gamma in (2, 4):
        rounds = Estimator(runner, reference, "rounds", round_gamma=gamma)
        judged = engine_judgements(runner, reference, mask, gamma)
        assert disagreements(rounds.evaluate(mask, temperature=0), judged) == 0, gamma


def test_lower_precision_drafts_are_judged_with_rejections(rounds_setup) -> None:
    """The cases above are not all acceptances: int4 everywhere misses some of the target's tokens."""
    runner, reference = rounds_setup
    judged = engine_judgements(runner, reference, PRECISION_MASKS[1], 4)
    assert not all(accepted for *_, accepted in judged)


@pytest.mark.parametrize("mask", ROUND_MASKS[:3], ids=str)
def test_rounds_mode_with_a_stop_matches_every_engine_judgement(rounds_setup, mask) -> None:
    """A draft that stops below the median of its own confidence: the rounds the estimator
    simulates with the stop are the engine's, judgement for judgement, and some of them stop."""
    runner, reference = rounds_setup
    confidence = Estimator(runner, reference, "shared-kv").evaluate(mask, temperature=0).greedy_confidence
    stop = float(torch.tensor([c for row in confidence for c in row]).median())
    rounds = Estimator(runner, reference, "rounds", round_gamma=4, round_stop=stop)
    judged = engine_judgements(runner, reference, mask, GammaPolicy.fixed(4, stop))
    profile = rounds.evaluate(mask, temperature=0)
    assert disagreements(profile, judged) == 0
    assert 1 < profile.drafts_per_round(4, stop) < profile.drafts_per_round(4) == 4


@pytest.fixture(scope="module")
def plan_rounds_setup():
    model = with_plan_attention(tiny_model("llama", layers=LAYERS, seed=1))
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    return runner, random_reference(runner, [7, 12, 5, 9], new_tokens=NEW_TOKENS, seed=5)


@pytest.mark.parametrize(
    "mask",
    [SkipMask(LAYERS), SkipMask.from_layers(LAYERS, [2]), SkipMask.parse("w4:0-5", LAYERS)],
    ids=str,
)
@pytest.mark.parametrize(
    "kv", [KVPattern(2, 6), KVPattern(0, 4), KVPattern(1, 4, 3), KVPattern(0, 3, 2)], ids=str
)
def test_rounds_mode_matches_every_engine_judgement_of_a_kv_pattern_draft(
    plan_rounds_setup, kv, mask
) -> None:
    """The pattern's band in the estimator's mask is what the engine's slices read, and its pillars
    the ones the engine's verifies choose: the same judgements, and some of them rejections (the
    pattern bites at these contexts)."""
    runner, reference = plan_rounds_setup
    estimator = Estimator(runner, reference, "rounds", round_gamma=3)
    judged = engine_judgements(runner, reference, mask, 3, kv)
    profile = estimator.evaluate(mask, temperature=0, kv=kv)
    assert disagreements(profile, judged) == 0
    assert not all(accepted for _, _, accepted in judged)


@pytest.mark.parametrize("mode", ["self", "shared-kv"])
def test_a_pattern_that_covers_every_context_changes_no_mode(plan_rounds_setup, mode) -> None:
    runner, reference = plan_rounds_setup
    estimator = Estimator(runner, reference, mode)
    mask = SkipMask.from_layers(LAYERS, [2])
    covering = KVPattern(1, int(reference.lengths.max()))
    torch.testing.assert_close(estimator.draft_logits(mask, covering), estimator.draft_logits(mask))
    assert not torch.allclose(estimator.draft_logits(mask, KVPattern(1, 3)), estimator.draft_logits(mask))


def test_one_evaluation_measures_every_kv_pattern_asked_for_with_each_vocabulary(plan_rounds_setup) -> None:
    """`by_kv` holds what evaluating under each pattern alone gives, labelled with its pattern,
    and the scorer's variants are every (vocabulary, pattern) pair."""
    runner, reference = plan_rounds_setup
    estimator = Estimator(runner, reference, "shared-kv", vocab_ids=lambda k: range(k))
    mask, patterns = SkipMask.from_layers(LAYERS, [2]), (KVPattern(1, 3), KVPattern(0, 4))
    profile = estimator.evaluate(mask, 1.0, (16,), patterns=patterns)
    assert profile.kv is None and [p.kv for p in profile.by_kv] == list(patterns)
    for pattern, measured in zip(patterns, profile.by_kv, strict=True):
        alone = estimator.evaluate(mask, 1.0, (16,), pattern)
        assert measured.greedy_match == alone.greedy_match
        assert measured.for_vocab(16, pattern).sampling_accept == alone.for_vocab(16, pattern).sampling_accept
    pairs = {(v.draft_vocab, v.kv) for v in profile.variants}
    assert pairs == {(vocab, kv) for vocab in (None, 16) for kv in (None, *patterns)}
    assert profile.for_vocab(16, patterns[1]).kv == patterns[1]


def test_rounds_mode_is_shared_kv_for_a_contiguous_exit(rounds_setup) -> None:
    """A prefix's K/V is the full model's, so the round structure cannot change a match."""
    runner, reference = rounds_setup
    mask = SkipMask.prefix(LAYERS, 3)
    rounds = Estimator(runner, reference, "rounds", round_gamma=3).evaluate(mask)
    shared = Estimator(runner, reference, "shared-kv").evaluate(mask)
    assert rounds.greedy_match == shared.greedy_match


@pytest.mark.skipif(load_kernel().function is None, reason="the decode kernel is not available here")
def test_on_the_kernel_plan_one_short_prompt_keeps_the_estimators_own_masks() -> None:
    """One prompt and at most 16 new tokens make a block the decode kernel would take; the kernel
    reads causality from positions and would ignore the estimator's round and band masks (the
    draft then saw every key). The estimator's judgements still equal the engine's."""
    model = tiny_model("llama", layers=3, hidden_size=128, num_attention_heads=4, seed=1).to(torch.bfloat16)
    model.generation_config.eos_token_id = None
    apply_attention(model, AttentionChoice("bfloat16", KERNEL_ATTENTION))
    runner, kv = LayerwiseRunner(model), KVPattern(1, 3)
    reference = random_reference(runner, [14], new_tokens=12, seed=3)
    estimator = Estimator(runner, reference, "rounds", round_gamma=3)
    judged = engine_judgements(runner, reference, SkipMask(3), 3, kv, new_tokens=12)
    assert disagreements(estimator.evaluate(SkipMask(3), temperature=0, kv=kv), judged) == 0
    assert not all(accepted for _, _, accepted in judged)


def engine_tree_judgements(
    runner, reference, mask, shape, kv=None
) -> tuple[list[tuple[int, int, int, bool]], list]:
    """(reference row, continuation offset, depth, accepted) of every tree node on the target's
    path the engine judged, and (row, offset, accepted) of every round of full depth that started
    early enough to end inside the output (the engine cuts the rounds near its end short)."""
    judged, rounds = [], []
    for row in range(reference.input_ids.shape[0]):
        prompt = reference.input_ids[row, : int(reference.prompt_lengths[row])].tolist()
        result = tree_decode(runner, prompt, mask, shape, NEW_TOKENS, timed=False, kv=kv)
        continuation = reference.input_ids[row, len(prompt) : int(reference.lengths[row])].tolist()
        assert list(result.tokens) == continuation
        offset = 0
        for depth, accepted in zip(result.gammas, result.accepted, strict=True):
            judged += [(row, offset + j, j, j < accepted) for j in range(min(accepted + 1, depth))]
            if offset <= NEW_TOKENS - shape.depth - 1:
                rounds.append((row, offset, accepted))
            offset += accepted + 1
    return judged, rounds


@pytest.mark.parametrize("shape", ["2x2x1", "3x1x1", "2x2x2x1"])
@pytest.mark.parametrize("mask", [*ROUND_MASKS[:3], *PRECISION_MASKS[1:3]], ids=str)
def test_rounds_mode_predicts_every_engine_judgement_of_a_tree(rounds_setup, mask, shape) -> None:
    """A tree's node on the target's path is kept when the target's token ranks below its depth's
    width under the draft: the ranks the round-aware estimator measures give the engine's every
    judgement, and its tokens per round within 3% (the censored last rounds aside)."""
    runner, reference = rounds_setup
    tree = TreeShape.parse(shape)
    profile = Estimator(runner, reference, "rounds", round_tree=tree).evaluate(mask, temperature=0)
    judged, engine_rounds = engine_tree_judgements(runner, reference, mask, tree)
    ranks = profile.target_rank
    wrong = [
        (row, offset)
        for row, offset, depth, kept in judged
        if (ranks[row][offset] < tree.widths[depth]) != kept
    ]
    assert not wrong
    predicted = [
        (row, start, accepted)
        for row, ranks_of_row in enumerate(ranks)
        for start, _, accepted, _ in _walk_tree(ranks_of_row, tree)
        if start <= NEW_TOKENS - tree.depth - 1
    ]
    mean = lambda rounds: sum(n + 1 for *_, n in rounds) / len(rounds)  # noqa: E731
    assert mean(predicted) == pytest.approx(mean(engine_rounds), rel=0.03)
    assert any(depth > 0 and kept for _, _, depth, kept in judged)  # some rounds go deep


def test_rounds_mode_predicts_a_kv_pattern_trees_judgements() -> None:
    """Under a sink-and-window draft too, the round-aware ranks give every judgement of the engine's
    tree (whose rows see the prefix's sink and window and their ancestors)."""
    model = tiny_model("llama", layers=3, seed=1)
    model.generation_config.eos_token_id = None
    apply_attention(model, AttentionChoice("float32", FP32_ATTENTION))
    runner, kv, tree, mask = LayerwiseRunner(model), KVPattern(1, 4), TreeShape.parse("2x2x1"), SkipMask(3)
    reference = random_reference(runner, [14, 9], new_tokens=NEW_TOKENS, seed=3)
    ranks = (
        Estimator(runner, reference, "rounds", round_tree=tree)
        .evaluate(mask, temperature=0, kv=kv)
        .target_rank
    )
    judged, _ = engine_tree_judgements(runner, reference, mask, tree, kv)
    assert not [(r, o) for r, o, depth, kept in judged if (ranks[r][o] < tree.widths[depth]) != kept]
    assert not all(kept for *_, kept in judged)


def test_ranks_agree_with_the_greedy_match_and_give_the_top_k_hit_rates(rounds_setup) -> None:
    runner, reference = rounds_setup
    profile = Estimator(runner, reference, "shared-kv").evaluate(ROUND_MASKS[1], temperature=0)
    for matches, ranks in zip(profile.greedy_match, profile.target_rank, strict=True):
        assert [rank == 0 for rank in ranks] == list(matches)
    rates = [profile.top_k_hit_rate(k) for k in (1, 2, 4, 8)]
    assert rates == sorted(rates) and rates[0] == pytest.approx(profile.alpha) and rates[-1] <= 1
    chain = profile.tree_tokens_per_round(TreeShape.chain(3))
    assert chain == profile.tokens_per_round(3)
    assert profile.tree_tokens_per_round(TreeShape.parse("4x2x1")) > chain


@pytest.mark.parametrize("mask", ROUND_MASKS[:3], ids=str)
def test_a_dynamic_tree_that_keeps_every_node_it_drafts_is_predicted_as_its_static_shape(
    rounds_setup, mask
) -> None:
    """n6d2k2 feeds both of the root's children and verifies all four of theirs: the tree 2x2,
    whichever probabilities the draft gives. The engine's rounds are 2x2's, and the estimator's
    prediction from the recorded probabilities is 2x2's too (exactly: the off-path nodes it cannot
    see decide nothing here). The profile keeps the draft's top probabilities, largest first."""
    from skipsearch.tree_shapes import DynamicTree

    runner, reference = rounds_setup
    dynamic, static = DynamicTree.parse("n6d2k2"), TreeShape.parse("2x2")
    profile = Estimator(runner, reference, "rounds", round_tree=dynamic).evaluate(mask, temperature=0)
    assert profile.tree_tokens_per_round(dynamic) == profile.tree_tokens_per_round(static)
    _, dynamic_rounds = engine_tree_judgements(runner, reference, mask, dynamic)
    _, static_rounds = engine_tree_judgements(runner, reference, mask, static)
    assert dynamic_rounds == static_rounds
    tops = [top for row in profile.top_probs for top in row]
    assert len(tops) == profile.n_positions and all(list(top) == sorted(top, reverse=True) for top in tops)
    assert AcceptanceProfile.from_dict(profile.to_dict()).top_probs[0][0] == pytest.approx(tops[0], abs=1e-5)


@pytest.mark.parametrize("tree", ["n8d3k2", "n14d3k3"])
@pytest.mark.parametrize("mask", ROUND_MASKS[:2], ids=str)
def test_rounds_mode_predicts_a_deep_dynamic_tree_roughly(rounds_setup, mask, tree) -> None:
    """The rounds settle, and the prediction stays within 15% of the engine's tokens per round on
    this tiny random model, whose flat distributions are the approximation's worst case (on the
    real models within 3%: results/token_trees)."""
    from skipsearch.tree_shapes import DynamicTree

    runner, reference = rounds_setup
    dynamic = DynamicTree.parse(tree)
    profile = Estimator(runner, reference, "rounds", round_tree=dynamic).evaluate(mask, temperature=0)
    _, engine_rounds = engine_tree_judgements(runner, reference, mask, dynamic)
    predicted = [
        accepted
        for row, ranks in enumerate(profile.target_rank)
        for start, _, accepted, _ in _walk_tree(ranks, dynamic, profile.top_probs[row])
        if start <= NEW_TOKENS - dynamic.depth - 1
    ]
    engine = sum(n + 1 for *_, n in engine_rounds) / len(engine_rounds)
    assert sum(n + 1 for n in predicted) / len(predicted) == pytest.approx(engine, rel=0.15)
