"""The score's dependence on context length, exactly as the latency profile says."""

from __future__ import annotations

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.search.objective import make_scorer
from skipsearch.tree_shapes import DynamicTree, TreeShape
from tests.unit.conftest import rows_latency, synthetic_latency


def test_context_changes_the_score_exactly_as_the_profile_says() -> None:
    """Skipping attention of layer 1 at γ = 1, every draft token accepted: E = 2 tokens per round.

    Step t = embed + head + 2 attn + 2 mlp; draft = t - attn; verify (γ+1 = 2 positions, same
    times, nothing reused past layer 1's attention) = t. S = 2 t / (2 t - attn)."""
    mask = SkipMask(2, attn={1})
    profile = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0)
    latency = synthetic_latency()
    for context in (128, 2048, 1536):
        attn = 1e-3 + 1e-6 * context
        step = 1e-3 + 2 * attn + 4e-3
        expected = 2 * step / (2 * step - attn)
        score = make_scorer(cost="calibrated", latency=latency, gamma_max=1, context=context)(mask, profile)
        assert score.value == pytest.approx(expected, rel=1e-12)
    at_2048 = make_scorer(cost="calibrated", latency=latency, gamma_max=1, context=2048)(mask, profile)
    default = make_scorer(cost="calibrated", latency=latency, gamma_max=1)(mask, profile)
    assert at_2048.value > default.value  # attention weighs more at long context


def test_a_mask_keeps_its_best_kv_pattern_and_says_what_each_scored() -> None:
    """Two variants of one mask: every key with half the drafts accepted, a sink-and-window
    pattern with all of them. At 2,048 tokens the pattern's draft reads 64 keys; it wins, verify
    reuses nothing under it, and the score of each pattern is kept for the report."""
    mask, kv = SkipMask(2, attn={1}), KVPattern(0, 64)
    under = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0, kv=kv)
    profile = AcceptanceProfile(str(mask), ((True, False) * 4,), ((1.0,) * 8,), 0.0, by_kv=(under,))
    latency = synthetic_latency()
    scorer = make_scorer(cost="calibrated", latency=latency, gamma_max=2, context=2048, kv=(None, kv))
    score = scorer(mask, profile)
    alone = make_scorer(cost="calibrated", latency=latency, gamma_max=2, context=2048, kv=(kv,))(
        mask, profile
    )
    full = make_scorer(cost="calibrated", latency=latency, gamma_max=2, context=2048)(mask, profile)
    assert score.details["kv"] == "s0w64" and score.value == alone.value > full.value
    assert score.details["r_reuse"] == 0.0
    assert score.details["score_by_kv"] == pytest.approx({"full": full.value, "s0w64": alone.value})
    assert "score_by_draft_vocab" not in score.details  # one vocabulary: nothing to compare


def test_the_closed_form_prices_a_kv_pattern_at_a_context() -> None:
    mask, kv = SkipMask(2, attn={1}), KVPattern(0, 64)
    under = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0, kv=kv)
    profile = AcceptanceProfile(str(mask), ((True,) * 8,), ((1.0,) * 8,), 0.0, by_kv=(under,))
    short, long = (
        make_scorer(gamma_max=2, context=context, kv=(kv,), kv_share=0.5)(mask, profile)
        for context in (128, 8192)
    )
    assert long.value > short.value  # the pattern leaves more of the cache unread at 8k


def test_a_context_outside_the_profile_needs_extrapolation() -> None:
    latency = synthetic_latency()
    with pytest.raises(ConfigError, match=r"outside the profiled range 128\.\.2048"):
        make_scorer(cost="calibrated", latency=latency, context=4096)
    with pytest.raises(ConfigError, match="only the calibrated cost"):
        make_scorer(cost="closed-form", latency=latency, context=1024)
    far = latency.for_context(4096, extrapolate=True)
    assert far.attn_time(0, 4096) == pytest.approx(1e-3 + 1e-6 * 4096)
    assert latency.attn_time(0, 4096) == pytest.approx(1e-3 + 1e-6 * 2048)  # clamped as before


def _ranked(ranks: list[int], mask: SkipMask) -> AcceptanceProfile:
    return AcceptanceProfile(
        str(mask),
        (tuple(rank == 0 for rank in ranks),),
        ((1.0,) * len(ranks),),
        0.0,
        target_rank=(tuple(ranks),),
    )


def test_a_draft_keeps_the_best_of_its_chains_and_trees_by_what_rows_cost() -> None:
    """The target is often the draft's second choice. Where the profile prices extra rows at
    nothing, a tree wins and says so; where each row costs a step, the chain wins, and the score
    keeps what each shape scored and what the best tree's verify would cost."""
    mask = SkipMask(2, attn={1})
    profile = _ranked([1, 0, 1, 0, 0, 1, 2, 0, 1, 0] * 8, mask)
    trees = (TreeShape.parse("2x1"), TreeShape.parse("2x2x1"))
    free = make_scorer(cost="calibrated", latency=rows_latency(0.0), trees=trees)(mask, profile)
    costly = make_scorer(cost="calibrated", latency=rows_latency(1.0), trees=trees)(mask, profile)
    assert free.details["tree"] in ("2x1", "2x2x1") and free.value > max(free.per_gamma.values())
    assert costly.details["tree"] == "chain" and costly.value == max(costly.per_gamma.values())
    assert set(costly.details["score_by_tree"]) == {"chain", "2x1", "2x2x1"}
    rows, steps = costly.details["tree_verify_steps"]
    assert rows in (5, 11) and steps > 2
    closed = make_scorer(cost="closed-form", trees=trees)(mask, profile)  # prices no rows: chains only
    assert "tree" not in closed.details


def test_a_kv_pattern_draft_scores_trees_its_window_holds_and_no_tree_with_pillars() -> None:
    """A sink-and-window draft's trees are scored (those shallower than its window); a pattern
    with pillars keeps its chain, as the engine runs no tree with pillars."""
    from dataclasses import replace

    mask = SkipMask(2, attn={1})
    ranks = _ranked([1, 0, 1, 0, 0, 1, 2, 0, 1, 0] * 8, mask)
    trees = (TreeShape.parse("2x1"), TreeShape.parse("2x2x1"))
    scorer = make_scorer(cost="calibrated", latency=rows_latency(0.0), trees=trees, kv=(KVPattern(2, 3),))
    windowed = scorer(mask, replace(ranks, kv=KVPattern(2, 3)))
    assert set(windowed.details["score_by_tree"]) == {"chain", "2x1"}  # 2x2x1 is as deep as the window
    assert windowed.details["score_by_tree"]["2x1"] > 0 and windowed.details["tree"] in ("chain", "2x1")
    pillars = make_scorer(cost="calibrated", latency=rows_latency(0.0), trees=trees, kv=(KVPattern(2, 3, 4),))
    assert "score_by_tree" not in pillars(mask, replace(ranks, kv=KVPattern(2, 3, 4))).details


def test_a_dynamic_tree_is_scored_beside_the_static_ones() -> None:
    """With the draft's top probabilities measured, a dynamic tree is one more point of the space:
    scored by what its rounds accept and what its fixed rows cost; without them, an error says so."""
    from dataclasses import replace

    mask = SkipMask(2, attn={1})
    ranks = [1, 0, 1, 0, 0, 1, 2, 0, 1, 0] * 8
    probs = tuple((0.5, 0.4, 0.05, 0.01) if rank else (0.6, 0.3, 0.05, 0.01) for rank in ranks)
    profile = replace(_ranked(ranks, mask), top_probs=(probs,))
    trees = (TreeShape.parse("2x1"), DynamicTree.parse("n6d2k2"))
    free = make_scorer(cost="calibrated", latency=rows_latency(0.0), trees=trees)(mask, profile)
    assert set(free.details["score_by_tree"]) == {"chain", "2x1", "n6d2k2"}
    assert free.details["score_by_tree"]["n6d2k2"] >= free.details["score_by_tree"]["2x1"]  # more nodes, free
    with pytest.raises(ValueError, match="no draft probabilities"):
        make_scorer(cost="calibrated", latency=rows_latency(0.0), trees=trees)(mask, _ranked(ranks, mask))
