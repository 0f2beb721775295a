"""Exact values of every cost form, the memory model and the calibrated model on a hand-made profile."""

from __future__ import annotations

import json

import pytest

from skipsearch.acceptance.rounds import AcceptanceProfile
from skipsearch.cost.calibrated import Calibrated, predict
from skipsearch.cost.closed_forms import (
    Contiguous,
    Optimum,
    SelfSpeculative,
    SeparateDraft,
    best_of,
    expected_tokens,
    head_share_from_config,
    optimal_gamma,
    speedup,
    speedup_curve,
    tokens_per_round_by_depth,
    tokens_per_round_iid,
    verify_overhead,
)
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.memory import MemoryBudget, throughput_ratio
from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import SkipMask

exact = pytest.approx


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


def _profile(*rows: str) -> AcceptanceProfile:
    matches = tuple(tuple(ch == "1" for ch in row) for row in rows)
    return AcceptanceProfile("a:1|m:1", matches, tuple(tuple(1.0 for _ in r) for r in matches), 0.0)


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


# -- serving memory ------------------------------------------------------------------------------


def test_memory_batch_gain_and_throughput_ratio() -> None:
    memory = MemoryBudget(total=80, big_weights=37.5, draft_weights=3.75, kv_per_sequence=1)
    assert (memory.batch_sd, memory.batch_ssd) == (38, 42)
    assert memory.beta == exact(42 / 38)
    assert throughput_ratio(memory, speedup_ssd=1.5, speedup_sd=1.8) == exact(42 / 38 * 1.5 / 1.8)


def test_memory_without_room_for_kv_is_an_error() -> None:
    with pytest.raises(ConfigError, match="less than one sequence's KV cache"):
        _ = MemoryBudget(total=40, big_weights=37.5, draft_weights=3.75, kv_per_sequence=1).batch_sd
    with pytest.raises(ConfigError, match="kv_per_sequence"):
        MemoryBudget(total=80, big_weights=37.5, draft_weights=0, kv_per_sequence=0)


# -- latency profile -----------------------------------------------------------------------------


def _tables(at_k1: float, at_k3: float) -> list[list[float]]:
    """Same times at both context lengths: rows context, columns positions (1, 3)."""
    return [[at_k1, at_k3], [at_k1, at_k3]]


def _latency() -> LatencyProfile:
    """Two layers; embed 1, head 2 -> 4, attn 1 -> 2, mlp 2 -> 3 (positions 1 -> 3); step = 9."""
    tables = {
        "embed": _tables(1, 1),
        "head": _tables(2, 4),
        "attn": [_tables(1, 2), _tables(1, 2)],
        "mlp": [_tables(2, 3), _tables(2, 3)],
    }
    return LatencyProfile.from_dict(
        {
            "meta": {"device": "test", "model": "tiny", "num_layers": 2},
            "context_lengths": [100, 300],
            "positions": [1, 3],
            **tables,
            "spread": {name: json.loads(json.dumps(table)) for name, table in tables.items()},
            "round_overhead": {"1": 0.5, "3": 1.5},
        }
    )


def test_latency_profile_json_round_trip(tmp_path) -> None:
    profile = _latency()
    path = tmp_path / "sub" / "latency.json"
    profile.save(path)
    assert LatencyProfile.load(path) == profile
    assert json.loads(path.read_text())["round_overhead"] == {"1": 0.5, "3": 1.5}


def test_latency_profile_missing_file_says_how_to_make_one(tmp_path) -> None:
    path = tmp_path / "none.json"
    with pytest.raises(ConfigError, match=r"none\.json.*skipsearch profile --model smollm2-135m"):
        LatencyProfile.load(path, model="smollm2-135m")


def test_latency_profile_rejects_bad_shapes_and_fields(tmp_path) -> None:
    data = _latency().to_dict()
    data["attn"] = data["attn"][:1]
    with pytest.raises(ConfigError, match="same layers"):
        LatencyProfile.from_dict(data)
    data = _latency().to_dict()
    data["spread"]["head"] = [[0.0]]
    with pytest.raises(ConfigError, match=r"spread\.head .*shape \[2, 2\]"):
        LatencyProfile.from_dict(data)
    del data["round_overhead"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"bad\.json: .*round_overhead"):
        LatencyProfile.load(path)


def test_latency_interpolation() -> None:
    data = _latency().to_dict()
    data["embed"] = [[1.0, 3.0], [3.0, 7.0]]  # context 100 and 300, positions 1 and 3
    profile = LatencyProfile.from_dict(data)
    assert profile.embed_time(100, 1) == 1.0  # measured
    assert profile.embed_time(200, 1) == exact(2.0)  # halfway in context
    assert profile.embed_time(50, 3) == exact(3.0)  # clamped below
    assert profile.embed_time(1000, 3) == exact(7.0)  # clamped above
    assert profile.embed_time(100, 2) == exact(2.0)  # between positions
    assert profile.embed_time(300, 5) == exact(11.0)  # extrapolated: 3 + 2 * (5 - 1)
    assert profile.embed_time(200, 4) == exact(2.0 + 3 * 1.5)  # context first, then positions
    assert profile.overhead(2) == exact(1.0)
    assert profile.overhead(5) == exact(2.5)


def test_latency_weights_and_step_time() -> None:
    profile = _latency()
    weights = profile.weights(512)
    assert (weights.embed, tuple(weights.attn), tuple(weights.mlp), weights.head) == (1, (1, 1), (2, 2), 2)
    assert profile.step_time(512) == exact(9.0)
    assert profile.head_time(512, 4) == exact(5.0)
    assert SkipMask.from_layers(2, [1]).r_draft(weights) == exact(6 / 9)


# -- calibrated model ----------------------------------------------------------------------------


def test_calibrated_round_time_by_hand() -> None:
    form = Calibrated(_latency(), SkipMask.from_layers(2, [1]), context=100)
    # gamma=1: draft 1 step of embed 1 + attn0 1 + mlp0 2 + head 2; verify: embed 1 + layer 0 for
    # one position (1 + 2) + layer 1 for two (1.5 + 2.5) + head for two (3); overhead 0.5.
    assert form.round_time(1).draft == exact(6.0)
    assert form.round_time(1).verify == exact(1 + 3 + 4 + 3)
    assert form.round_time(1).total == exact(17.5)
    # gamma=3: draft 3 x 6; verify at 4 positions (extrapolated): 1 + 3 + (2.5 + 3.5) + 5; overhead 1.5.
    assert form.round_time(3).total == exact(18 + 15 + 1.5)
    assert form.round_cost(3) == exact(34.5 / 9)
    assert speedup(0.5, form, 1) == exact(1.5 * 9 / 17.5)


def test_calibrated_mlp_first_skip_reruns_that_mlp() -> None:
    form = Calibrated(_latency(), SkipMask(2, mlp={0}), context=100)
    assert form.round_time(1).draft == exact(9 - 2)
    assert form.round_time(1).verify == exact(1 + 1 + (2.5 + 1.5 + 2.5) + 3)


def test_calibrated_memory_bound_verify_costs_a_full_step() -> None:
    """Times independent of positions, no embed/head/overhead: KV reuse saves nothing (DESIGN §5)."""
    flat = {
        "embed": _tables(0, 0),
        "head": _tables(0, 0),
        "attn": [_tables(1, 1)] * 4,
        "mlp": [_tables(1, 1)] * 4,
    }
    data = {**_latency().to_dict(), **flat, "spread": flat, "meta": {}, "round_overhead": {"1": 0.0}}
    form = Calibrated(LatencyProfile.from_dict(data), SkipMask.prefix(4, 2))
    assert form.round_cost(3) == exact(SeparateDraft(0.5).round_cost(3))
    assert Contiguous(0.5).round_cost(3) < form.round_cost(3)


def test_calibrated_rejects_a_mask_for_another_model() -> None:
    with pytest.raises(InvalidMaskError, match="profile the same model"):
        Calibrated(_latency(), SkipMask.from_layers(3, [1])).round_cost(1)


# -- predict -------------------------------------------------------------------------------------


def test_predict_closed_form_and_calibrated() -> None:
    profile = _profile("1101001110", "0111011")
    mask = SkipMask.from_layers(2, [1])
    prediction = predict(profile, mask, gamma_max=3)
    assert prediction.tokens_per_round == tuple(profile.tokens_per_round(g) for g in (1, 2, 3))
    assert prediction.closed_form == exact(speedup_curve(profile, SelfSpeculative(0.5, 0.5), 3))
    assert (prediction.r_draft, prediction.r_reuse, prediction.calibrated) == (0.5, 0.5, None)
    assert prediction.best == prediction.best_closed_form == best_of(prediction.closed_form)

    calibrated = predict(profile, mask, gamma_max=3, latency=_latency(), context=100)
    assert calibrated.calibrated == exact(speedup_curve(profile, Calibrated(_latency(), mask, 100), 3))
    assert calibrated.best == best_of(calibrated.calibrated)
    data = json.loads(json.dumps(calibrated.to_dict()))
    assert data["best_calibrated"] == {
        "gamma": calibrated.best.gamma,
        "speedup": exact(calibrated.best.speedup),
    }


def test_predict_uses_sublayer_reuse_for_mlp_first_masks() -> None:
    prediction = predict(_profile("1101"), SkipMask(4, mlp={3}), gamma_max=2, epsilon=0.1)
    assert (prediction.r_draft, prediction.r_reuse) == (7 / 8, 7 / 8)


# -- the draft's head with k rows ----------------------------------------------------------------


def _with_head_table(rows: list[int], seconds: list[float]) -> LatencyProfile:
    """`_latency()` (full head 2 at one position) plus a draft-head table."""
    return LatencyProfile.from_dict({**_latency().to_dict(), "head_rows": rows, "head_by_rows": seconds})


def test_draft_head_time_interpolates_the_measured_ratio() -> None:
    profile = _with_head_table([2, 4, 8], [1.0, 1.5, 4.0])  # V = 8; full head 2 at context 100
    assert profile.vocab_size == 8
    assert profile.draft_head_time(None, 100) == profile.head_time(100) == 2.0
    assert profile.draft_head_time(8, 100) == 2.0
    assert profile.draft_head_time(9, 100) == 2.0  # k >= V: the full head
    assert profile.draft_head_time(4, 100) == exact(2.0 * 1.5 / 4.0)  # measured
    assert profile.draft_head_time(3, 100) == exact(2.0 * 1.25 / 4.0)  # between 2 and 4 rows
    assert profile.draft_head_time(6, 100) == exact(2.0 * 2.75 / 4.0)  # between 4 and 8 rows
    assert profile.draft_head_time(1, 100) == exact(2.0 * 1.0 / 4.0)  # held at the fewest measured
    with pytest.raises(ConfigError, match="integer >= 1 or full, got 0"):
        profile.draft_head_time(0, 100)
    with pytest.raises(ConfigError, match="vocabulary of 8 ids, the model has 9"):
        profile.draft_head_time(4, 100, vocab_size=9)


def test_head_table_round_trips_and_is_validated(tmp_path) -> None:
    profile = _with_head_table([2, 4, 8], [1.0, 1.5, 4.0])
    profile.save(tmp_path / "p.json")
    assert LatencyProfile.load(tmp_path / "p.json") == profile
    for rows, seconds, message in [
        ([4, 2], [1.0, 1.0], "increasing row counts"),
        ([2, 4], [1.0], "one per head_by_rows entry"),
        ([2, 4], [1.0, 0.0], "finite and > 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _with_head_table(rows, seconds)
    data = {**_with_head_table([2, 4], [1.0, 2.0]).to_dict(), "meta": {"num_layers": 2, "vocab_size": 8}}
    with pytest.raises(ConfigError, match="end at the vocabulary size 8, got 4"):
        LatencyProfile.from_dict(data)


def test_an_old_profile_scales_the_full_head_by_rows_and_says_so_once(caplog) -> None:
    old = _latency().to_dict()
    del old["head_rows"], old["head_by_rows"]
    profile = LatencyProfile.from_dict(old)
    assert profile.head_rows == () and profile.vocab_size is None
    with pytest.raises(ConfigError, match="predates draft-head timing"):
        profile.draft_head_time(4, 100)
    assert profile.draft_head_time(4, 100, vocab_size=8) == exact(2.0 * 4 / 8)
    assert profile.draft_head_time(2, 300, vocab_size=8) == exact(2.0 * 2 / 8)
    assert caplog.text.count("priced as k/V") == 1
    recorded = LatencyProfile.from_dict({**old, "meta": {"num_layers": 2, "vocab_size": 8}})
    assert recorded.draft_head_time(4, 100) == exact(1.0)


def test_calibrated_draft_step_pays_its_own_head_and_verify_the_full_one() -> None:
    latency = _with_head_table([2, 4, 8], [1.0, 1.5, 4.0])
    mask = SkipMask.from_layers(2, [1])
    full = Calibrated(latency, mask, context=100)
    subset = Calibrated(latency, mask, context=100, draft_vocab=4)
    # Draft step: embed 1 + attn0 1 + mlp0 2 + a head of 4 rows (2 x 1.5 / 4 = 0.75) instead of 2.
    assert subset.round_time(1).draft == exact(4.75)
    assert subset.round_time(3).draft == exact(3 * 4.75)
    assert subset.round_time(3).verify == full.round_time(3).verify == exact(15)
    assert full.round_time(1) == Calibrated(_latency(), mask, context=100).round_time(1)
    assert Calibrated(latency, mask, 100, draft_vocab=8).round_time(2) == full.round_time(2)
    old = Calibrated(_latency(), mask, context=100, draft_vocab=4, vocab_size=8)
    assert old.round_time(1).draft == exact(4 + 2 * 4 / 8)  # no table: k/V of the full head


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


def test_predict_with_a_draft_vocabulary() -> None:
    profile = _profile("1101001110", "0111011")
    mask = SkipMask.from_layers(2, [1])
    latency = _with_head_table([2, 4, 8], [1.0, 1.5, 4.0])
    full = predict(profile, mask, gamma_max=3, latency=latency, context=100)
    assert full == predict(profile, mask, gamma_max=3, latency=_latency(), context=100)
    assert full.to_dict()["draft_vocab"] == "full"
    subset = predict(profile, mask, gamma_max=3, latency=latency, context=100, draft_vocab=4)
    assert subset.draft_vocab == 4 and subset.to_dict()["draft_vocab"] == 4
    calibrated = Calibrated(latency, mask, 100, draft_vocab=4)
    assert subset.calibrated == exact(speedup_curve(profile, calibrated, 3))
    # Closed form: the profile's head share 2 / 9 of a step, half the rows kept.
    assert subset.r_draft == exact(0.5 - 2 / 9 * (1 - 4 / 8))
    assert subset.closed_form > full.closed_form
    without_profile = predict(profile, mask, gamma_max=3, draft_vocab=4, vocab_size=8, head_share=0.2)
    assert without_profile.r_draft == exact(0.5 - 0.2 * 0.5) and without_profile.calibrated is None


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
