"""The calibrated cost model and `predict`, with round times worked out by hand."""

from __future__ import annotations

import json

import pytest

from skipsearch.cost.calibrated import Calibrated, predict
from skipsearch.cost.closed_forms import (
    Contiguous,
    SelfSpeculative,
    SeparateDraft,
    best_of,
    speedup,
    speedup_curve,
)
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import InvalidMaskError
from skipsearch.masks import KVPattern, SkipMask
from tests.unit.cost.conftest import _latency, _profile, _tables, _with_head_table, exact

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
    """Times independent of positions, no embed/head/overhead: KV reuse saves nothing
    (docs/theory.md, "Calibrated cost")."""
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


# -- KV patterns ---------------------------------------------------------------------------------


def _context_latency(meta: dict | None = None) -> LatencyProfile:
    """`_latency()` with attention that grows with context: 1 at 100 keys, 3 at 300 (one position),
    2 and 4 at three positions; step at 300 = embed 1 + attn 3 + 3 + mlp 2 + 2 + head 2 = 13."""
    growing = [[1, 2], [3, 4]]
    data = _latency().to_dict()
    data["attn"] = data["spread"]["attn"] = [growing, growing]
    data["meta"] = {**data["meta"], **(meta or {})}
    return LatencyProfile.from_dict(data)


def test_a_kv_pattern_prices_draft_attention_at_the_keys_it_reads_and_verify_reuses_nothing() -> None:
    latency, mask = _context_latency(), SkipMask.from_layers(2, [1])
    plain = Calibrated(latency, mask, context=300)
    patterned = Calibrated(latency, mask, context=300, kv=KVPattern(0, 100))
    # The draft runs layer 0: embed 1 + attn 1 (100 keys, not 3 at 300) + mlp 2 + head 2.
    assert plain.round_time(1).draft == exact(1 + 3 + 2 + 2)
    assert patterned.round_time(1).draft == exact(1 + 1 + 2 + 2)
    # Verify: the mask reuses layer 0 for one position; under the pattern every layer runs at two.
    assert plain.round_time(1).verify == exact(1 + (3 + 2) + (3.5 + 2.5) + 3)
    assert patterned.round_time(1).verify == exact(1 + (3.5 + 2.5) * 2 + 3)
    # Where the window covers the context the draft is priced as the full model's step.
    assert Calibrated(latency, mask, context=100, kv=KVPattern(4, 200)).round_time(1).draft == exact(6)


def test_predict_prices_a_kv_pattern_in_both_forms_from_the_bytes_a_step_reads() -> None:
    latency = _context_latency({"weight_bytes": 600.0, "kv_bytes_per_position": 1.0})
    mask, kv, accepted = SkipMask(2), KVPattern(0, 100), _profile("1111", "1110")
    prediction = predict(accepted, mask, gamma_max=3, latency=latency, context=300, kv=kv)
    # Closed form: K/V share 300 / (600 + 300) = 1/3, the pattern reads 1/3 of the keys in both
    # attention sub-layers, so a draft step costs 1 - 1/3 x 2/3 and verify reuses nothing.
    closed = SelfSpeculative(1.0, 0.0, kv_saving=2 / 9)
    assert prediction.closed_form == exact(speedup_curve(accepted, closed, 3))
    assert prediction.calibrated == exact(speedup_curve(accepted, Calibrated(latency, mask, 300, kv=kv), 3))
    assert prediction.to_dict()["kv"] == "s0w100"
    unknown = predict(accepted, mask, gamma_max=3, latency=_context_latency(), context=300, kv=kv)
    assert unknown.closed_form == exact(speedup_curve(accepted, SelfSpeculative(1.0, 0.0), 3))


def test_a_pillar_pattern_adds_the_profiled_choice_to_its_verify(caplog: pytest.LogCaptureFixture) -> None:
    mask, window, pillars = SkipMask.from_layers(2, [1]), KVPattern(0, 100), KVPattern(0, 100, 8)
    latency = LatencyProfile.from_dict({**_context_latency().to_dict(), "pillar_choice": [0.5, 1.5]})
    without = Calibrated(latency, mask, context=200, kv=window).round_time(1).verify
    # The choice at 200 tokens is halfway between its times at 100 and 300.
    assert Calibrated(latency, mask, context=200, kv=pillars).round_time(1).verify == exact(without + 1.0)
    # A profile from before the table prices the choice as free, and says so once.
    old = _context_latency()
    assert Calibrated(old, mask, context=200, kv=pillars).round_time(1).verify == exact(
        Calibrated(old, mask, context=200, kv=window).round_time(1).verify
    )
    Calibrated(old, mask, context=300, kv=pillars).round_time(2)
    assert caplog.text.count("no pillar-choice timings") == 1
