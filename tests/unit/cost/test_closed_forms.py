"""Exact values of every cost form, the memory model and the calibrated model on a hand-made profile."""

from __future__ import annotations

import pytest

from skipsearch.cost.closed_forms import (
    Contiguous,
    Optimum,
    SelfSpeculative,
    SeparateDraft,
    best_of,
    expected_tokens,
    head_share_from_config,
    keys_share,
    kv_read_share,
    optimal_gamma,
    speedup,
    speedup_curve,
    tokens_per_round_by_depth,
    tokens_per_round_iid,
    verify_overhead,
)
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from tests.unit.cost.conftest import _profile, exact

# -- tokens per round ----------------------------------------------------------------------------


def test_tokens_per_round_iid_closed_form() -> None:
    assert tokens_per_round_iid(0.8, 3) == exact(2.952)  # (1 - 0.8^4) / 0.2
    assert tokens_per_round_iid(0.9, 4) == exact(4.0951)
    assert tokens_per_round_iid(0.6, 1) == exact(1.6)  # gamma = 1: 1 + alpha


def test_tokens_per_round_iid_edges() -> None:
    assert tokens_per_round_iid(1.0, 3) == 4.0
    assert tokens_per_round_iid(0.0, 5) == 1.0


def test_tokens_per_round_by_depth() -> None:
    assert tokens_per_round_by_depth([0.9, 0.8, 0.5], 3) == exact(1 + 0.9 + 0.72 + 0.36)
    assert tokens_per_round_by_depth([0.9, 0.8, 0.5], 2) == exact(2.62)
    assert tokens_per_round_by_depth([0.7] * 4, 4) == exact(tokens_per_round_iid(0.7, 4))


def test_tokens_per_round_by_depth_needs_a_rate_per_depth() -> None:
    with pytest.raises(ConfigError, match=r"alpha_1\.\.alpha_4"):
        tokens_per_round_by_depth([0.9, 0.8], 4)


def test_expected_tokens_dispatches_on_the_kind_of_acceptance() -> None:
    profile = _profile("1101001110")  # gamma=2 rounds: 2, 1, 0, 2, 0
    assert expected_tokens(profile, 2) == exact(2.0)
    assert expected_tokens(0.8, 3) == exact(2.952)
    assert expected_tokens([0.9, 0.8, 0.5], 3) == exact(2.98)


@pytest.mark.parametrize(("alpha", "gamma"), [(1.2, 3), (-0.1, 3), (float("nan"), 3), (0.8, 0), (0.8, 2.5)])
def test_invalid_alpha_or_gamma(alpha: float, gamma: int) -> None:
    with pytest.raises(ConfigError):
        tokens_per_round_iid(alpha, gamma)


# -- closed forms --------------------------------------------------------------------------------


def test_separate_draft_speedup() -> None:
    assert speedup(0.8, SeparateDraft(0.3), 3) == exact(2.952 / 1.9)
    assert round(speedup(0.8, SeparateDraft(0.3), 3), 2) == 1.55
    assert speedup(0.8, SeparateDraft(0.3), 1) == exact(1.8 / 1.3)
    assert speedup(1.0, SeparateDraft(0.3), 3) == exact(4 / 1.9)


def test_reference_001_table_cell_alpha_09_k_4() -> None:
    assert speedup(0.9, SeparateDraft(0.3), 4) == exact(4.0951 / 2.2)
    assert round(speedup(0.9, SeparateDraft(0.3), 4), 2) == 1.86


def test_self_speculative_general() -> None:
    assert SelfSpeculative(0.5, 0.25).round_cost(3) == exact(2.25)  # 3 * 0.5 + 1 - 0.25
    assert speedup(0.8, SelfSpeculative(0.5, 0.25), 3) == exact(2.952 / 2.25)


def test_self_speculative_without_reuse_is_separate_draft() -> None:
    for gamma in range(1, 9):
        assert SelfSpeculative(0.4, 0.0, 0.05).round_cost(gamma) == exact(
            SeparateDraft(0.4, 0.05).round_cost(gamma)
        )


def test_contiguous_equals_general_with_full_reuse() -> None:
    assert Contiguous(0.5).round_cost(3) == exact(2.0)  # 1 + 2 * 0.5
    assert Contiguous(0.5).round_cost(1) == 1.0  # gamma = 1: the draft's layers are all reused
    for gamma in range(1, 9):
        for epsilon in (0.0, 0.1):
            assert Contiguous(0.3, epsilon).round_cost(gamma) == exact(
                SelfSpeculative(0.3, 0.3, epsilon).round_cost(gamma)
            )


def test_verify_overhead_multiplies_the_verify_term() -> None:
    assert verify_overhead(4, 0.05) == exact(1.2)
    assert SeparateDraft(0.3, 0.05).round_cost(4) == exact(1.2 + 1.2)
    assert SelfSpeculative(0.5, 0.25, 0.1).round_cost(3) == exact(1.5 + 0.75 * 1.3)
    assert Contiguous(0.5, 0.1).round_cost(3) == exact(1.5 + 0.5 * 1.3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SeparateDraft(0.0),
        lambda: SeparateDraft(-1.0),
        lambda: SeparateDraft(0.3, -0.01),
        lambda: SelfSpeculative(0.5, 0.6),
        lambda: SelfSpeculative(0.0, 0.0),
        lambda: SelfSpeculative(1.2, 0.0),
        lambda: Contiguous(0.0),
        lambda: Contiguous(0.5, float("inf")),
    ],
)
def test_invalid_cost_forms(make) -> None:
    with pytest.raises(ConfigError):
        make()


# -- optimal gamma -------------------------------------------------------------------------------


def test_optimal_gamma_reproduces_reference_001_conclusions() -> None:
    form = SeparateDraft(0.3)
    assert optimal_gamma(0.9, form) == Optimum(5, exact(4.68559 / 2.5))
    assert optimal_gamma(0.8, form).gamma == 3
    assert optimal_gamma(0.7, form).gamma == 2
    assert optimal_gamma(0.6, form).gamma == 1


def test_optimal_gamma_is_bounded_by_gamma_max() -> None:
    assert optimal_gamma(0.9, SeparateDraft(0.05), 8) == Optimum(8, exact(6.12579511 / 1.4))
    assert optimal_gamma(0.9, SeparateDraft(0.05), 40).gamma == 13


def test_best_of_breaks_ties_towards_smaller_gamma() -> None:
    assert best_of([1.0, 2.0, 2.0, 1.5]) == Optimum(2, 2.0)
    assert optimal_gamma(0.0, Contiguous(1.0)) == Optimum(1, 1.0)


def test_speedup_curve_indexes_from_gamma_one() -> None:
    curve = speedup_curve(0.8, SeparateDraft(0.3), 3)
    assert curve == exact((1.8 / 1.3, 2.44 / 1.6, 2.952 / 1.9))


def test_closed_form_unchanged_at_full_vocabulary() -> None:
    mask = SkipMask.from_layers(4, [1, 2])
    plain = SelfSpeculative.from_mask(mask, 0.1)
    assert SelfSpeculative.from_mask(mask, 0.1, None, head_share=0.2, vocab_size=8) == plain
    assert SelfSpeculative.from_mask(mask, 0.1, 8, head_share=0.2, vocab_size=8) == plain
    assert plain.draft_step == plain.r_draft == 0.5


def test_closed_form_subtracts_the_head_saving_from_each_draft_step() -> None:
    mask = SkipMask.from_layers(4, [1, 2])  # r_draft 0.5, r_reuse 0.25
    form = SelfSpeculative.from_mask(mask, draft_vocab=2, head_share=0.2, vocab_size=8)
    assert form.head_saving == exact(0.2 * (1 - 2 / 8))
    assert form.draft_step == exact(0.5 - 0.15)
    assert form.round_cost(3) == exact(3 * 0.35 + 0.75)
    # A draft smaller than the head cannot save the whole head: r_draft x (1 - k/V) at most.
    tiny = SelfSpeculative.from_mask(SkipMask.prefix(10, 1), draft_vocab=2, head_share=0.2, vocab_size=8)
    assert tiny.draft_step == exact(0.1 * 2 / 8)
    contiguous = Contiguous(0.5, 0.1, head_saving=0.15)
    assert contiguous.round_cost(3) == exact(Contiguous(0.5, 0.1).round_cost(3) - 3 * 0.15)
    assert contiguous.round_cost(3) == exact(SelfSpeculative(0.5, 0.5, 0.1, 0.15).round_cost(3))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"draft_vocab": 2, "head_share": 0.2}, "needs the model's vocabulary size"),
        ({"draft_vocab": 9, "head_share": 0.2, "vocab_size": 8}, "between 1 and 8, or full"),
        ({"draft_vocab": 0, "head_share": 0.2, "vocab_size": 8}, "between 1 and 8, or full"),
        ({"draft_vocab": 2, "head_share": 1.0, "vocab_size": 8}, "head share must be in"),
    ],
)
def test_closed_form_draft_vocabulary_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SelfSpeculative.from_mask(SkipMask.from_layers(4, [1]), **options)


def test_head_saving_cannot_reach_the_draft_step() -> None:
    with pytest.raises(ConfigError, match=r"head saving must be in \[0, r_draft=0.3\)"):
        SelfSpeculative(0.3, 0.3, head_saving=0.3)
    with pytest.raises(ConfigError, match="head saving"):
        Contiguous(0.3, head_saving=-0.1)


def test_a_kv_pattern_saves_the_reads_of_the_keys_it_leaves_out_and_forfeits_reuse() -> None:
    mask = SkipMask.from_layers(4, [1])  # r_draft 0.75, r_reuse 0.25; 3 of 4 attention sub-layers run
    assert kv_read_share(300.0, 100.0) == exact(0.25)
    assert keys_share(KVPattern(4, 96), 400) == exact(0.25)
    assert keys_share(KVPattern(4, 96), 50) == 1.0  # the window covers the context
    form = SelfSpeculative.from_mask(mask, kv=KVPattern(4, 96), kv_share=0.4, context=400)
    assert form.r_reuse == 0.0
    assert form.kv_saving == exact(0.4 * 0.75 * (1 - 0.25))
    assert form.draft_step == exact(0.75 - 0.225)
    assert form.round_cost(2) == exact(2 * 0.525 + 1.0)
    covering = SelfSpeculative.from_mask(mask, kv=KVPattern(4, 96), kv_share=0.4, context=100)
    assert covering.kv_saving == 0.0 and covering.r_reuse == 0.0  # as the engine: no reuse under a pattern


def test_kv_saving_needs_no_reuse_and_cannot_reach_the_draft_step() -> None:
    with pytest.raises(ConfigError, match="verify reuses nothing"):
        SelfSpeculative(0.5, 0.25, kv_saving=0.1)
    with pytest.raises(ConfigError, match="KV-pattern saving must be in"):
        SelfSpeculative(0.5, 0.0, head_saving=0.2, kv_saving=0.3)
    with pytest.raises(ConfigError, match="K/V share must be in"):
        SelfSpeculative.from_mask(SkipMask.from_layers(4, [1]), kv=KVPattern(0, 8), kv_share=1.5)


def test_head_share_from_config_smollm2_and_qwen() -> None:
    smollm2 = {
        "vocab_size": 49152,
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
    }
    # Head 49152 x 576; a layer: q, o 576 x 576, k, v 576 x 192, MLP 3 x 576 x 1536.
    head, layer = 49152 * 576, 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert head_share_from_config(smollm2) == exact(head / (head + 30 * layer))
    assert head_share_from_config(smollm2) == exact(0.2105, abs=5e-4)
    qwen = {
        "vocab_size": 151936,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
    }
    assert head_share_from_config(qwen) == exact(0.2756, abs=5e-4)
    with pytest.raises(ConfigError, match="lacks 'intermediate_size'"):
        head_share_from_config({k: v for k, v in qwen.items() if k != "intermediate_size"})
