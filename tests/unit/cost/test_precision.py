"""Drafts at lower precision priced by the calibrated model, with round times worked out by hand: a
draft step pays each int8/int4 sub-layer at its measured cost (else its bytes, said once), and
verify runs at full precision, reusing only the layers before the first changed sub-layer."""

from __future__ import annotations

import pytest

from skipsearch.cost.calibrated import Calibrated, predict
from skipsearch.cost.closed_forms import SelfSpeculative
from skipsearch.cost.depth import scale_to_depth
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.latency_schema import PrecisionCosts
from skipsearch.cost.tree_cost import tree_round_time
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.tree_shapes import TreeShape
from tests.unit.cost.conftest import _int8_costs, _latency, _profile, _tables, _with_int8, exact

ALL_INT8 = SkipMask.parse("w8:0-1", 2)


def test_an_int8_draft_is_priced_at_its_measured_costs() -> None:
    form = Calibrated(_with_int8(), ALL_INT8, context=100)
    # draft: embed 1 + 2 x (attn 0.7 + mlp 1.2) + head 2; verify reuses nothing (s1 = 0): embed 1 +
    # both layers at two positions 2 x (1.5 + 2.5) + head 3; overhead 0.5.
    assert form.round_time(1).draft == exact(6.8)
    assert form.round_time(1).verify == exact(1 + 8 + 3)
    assert form.round_cost(1) == exact((6.8 + 12 + 0.5) / 9)


def test_without_measured_costs_a_precision_is_priced_by_its_bytes_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    latency = _latency()
    form = Calibrated(latency, ALL_INT8, context=100)
    # half of every sub-layer's bytes: attn 0.5, mlp 1.0.
    assert form.round_time(1).draft == exact(1 + 2 * 1.5 + 2)
    Calibrated(latency, SkipMask.parse("w4:1", 2), context=300).round_time(2)
    assert latency.check_precisions(ALL_INT8)
    assert caplog.text.count("no int8 timings") == 1
    assert caplog.text.count("no int4 timings") == 1
    # a profile that times int8 says nothing of it.
    caplog.clear()
    assert not _with_int8().check_precisions(ALL_INT8)
    assert "timings" not in caplog.text


def test_a_quantized_layer_ends_the_prefix_verify_reuses() -> None:
    latency = _with_int8()
    # layer 1 at int8: verify reuses layer 0 for the one position the draft did not run.
    late = Calibrated(latency, SkipMask.parse("w8:1", 2), context=100).round_time(1)
    assert late.draft == exact(1 + (1 + 2) + (0.7 + 1.2) + 2)
    assert late.verify == exact(1 + (1 + 2) + (1.5 + 2.5) + 3)
    # layer 0's MLP at int8: its attention's K/V is exact, but verify reruns that MLP for both positions.
    mlp_first = Calibrated(latency, SkipMask.parse("w8m:0", 2), context=100).round_time(1)
    assert mlp_first.draft == exact(1 + (1 + 1.2) + (1 + 2) + 2)
    assert mlp_first.verify == exact(1 + 1 + 2.5 + (1.5 + 2.5) + 3)


def test_a_tree_with_an_int4_draft_prices_each_pass_at_its_rows() -> None:
    int4 = {**_int8_costs(), "attn": [_tables(0.4, 0.8)] * 2, "mlp": [_tables(0.6, 1.2)] * 2}
    latency = LatencyProfile.from_dict({**_latency().to_dict(), "precisions": {"4": int4}})
    mask = SkipMask.parse("w4:0-1", 2)
    form = Calibrated(latency, mask, context=100)
    shape = TreeShape.parse("2x1")  # draft passes over 1 and 2 rows; verify over 1 + 4 rows
    # rows 1: 1 + 2 x (0.4 + 0.6) + 2 = 5; rows 2 (halfway to 3): embed 1 + 2 x (0.6 + 0.9) + head 3 = 7.
    round_time = tree_round_time(form, shape)
    assert round_time.draft == exact(5 + 7)
    # verify reuses nothing: embed at the 2 leaves 1 + both layers at 5 rows 2 x (3 + 4) + head 6.
    assert round_time.verify == exact(1 + 14 + 6)
    # a chain-shaped tree still costs the chain's round.
    assert tree_round_time(form, TreeShape.chain(2)).total == exact(form.round_time(2).total)


def test_the_closed_form_prices_precision_by_bytes() -> None:
    prediction = predict(_profile("1111"), ALL_INT8, gamma_max=2, latency=_with_int8(), context=100)
    assert prediction.r_draft == exact(0.5)
    assert prediction.r_reuse == exact(0.0)
    assert prediction.closed_form[0] == exact(_profile("1111").tokens_per_round(1) / (0.5 + 1))
    assert SelfSpeculative.from_mask(SkipMask.parse("w4:1", 2)).r_reuse == exact(0.5)
    assert prediction.calibrated is not None
    assert prediction.calibrated[0] == exact(_profile("1111").tokens_per_round(1) * 9 / (6.8 + 12 + 0.5))


def test_precision_costs_round_trip_and_old_profiles_load() -> None:
    latency = _with_int8()
    assert LatencyProfile.from_dict(latency.to_dict()) == latency
    old = _latency().to_dict()
    del old["precisions"]
    assert LatencyProfile.from_dict(old).precisions == {}
    added = _latency().with_precision(8, PrecisionCosts.from_dict(_int8_costs()))
    assert added == latency
    assert added.weights(100).low_bits[8] == (exact((0.7, 0.7)), exact((1.2, 1.2)))


@pytest.mark.parametrize(
    ("bits", "change", "message"),
    [
        (16, {}, "one of 8, 4"),
        (8, {"mlp": [_tables(1.2, 1.8)]}, "precisions.8.mlp must hold"),
        (8, {"step": [6.8]}, "precisions.8.step needs one"),
        (8, {"weight_bytes": 0.0}, "weight_bytes must be a byte count"),
    ],
)
def test_bad_precision_costs_are_refused(bits: int, change: dict, message: str) -> None:
    data = {**_latency().to_dict(), "precisions": {str(bits): {**_int8_costs(), **change}}}
    with pytest.raises(ConfigError, match=message):
        LatencyProfile.from_dict(data)


def test_the_floor_at_each_precision() -> None:
    meta = {"weight_bytes": 100.0, "kv_bytes_per_position": 0.1, "copy_bandwidth": 20.0}
    latency = LatencyProfile.from_dict({**_with_int8().to_dict(), "meta": {**_latency().meta, **meta}})
    full, int8 = latency.precision_floor(16, 200), latency.precision_floor(8, 200)
    assert (full.seconds, full.read_bytes, full.floor) == (exact(9.0), exact(120.0), exact(6.0))
    # int8: the step measured 6.8 at 100 and 7.0 at 300 tokens; 50 weight bytes + 20 of K/V.
    assert (int8.seconds, int8.read_bytes, int8.floor) == (exact(6.9), exact(70.0), exact(3.5))
    assert int8.bandwidth == exact(70 / 6.9)
    assert int8.over_floor == exact(6.9 / 3.5)
    with pytest.raises(ConfigError, match="no int4 timings"):
        latency.precision_floor(4, 200)


def test_depth_scaling_repeats_the_precision_tables() -> None:
    scaled = scale_to_depth(_with_int8(), 5)
    assert scaled.weights(100).low_bits[8][0] == exact((0.7,) * 5)
    assert scaled.precisions[8].weight_bytes is None


def test_the_profile_summary_shows_each_timed_precision() -> None:
    from skipsearch.cost.profile_summary import summary

    timed = summary(_with_int8())
    # the all-int8 draft: embed 1 + 2 x (0.7 + 1.2) + head 2 = 6.8 of a 9 step, where bytes say 6/9.
    assert timed.precision_cost == {8: (exact(6.8 / 9), exact(6.8 / 9))}
    assert set(timed.precision_floor) == {16, 8}
    assert timed.precision_floor[8][0].seconds == exact(6.8)
    assert summary(_latency()).precision_cost == {}


def test_a_kv_pattern_prices_quantized_attention_at_the_keys_it_reads() -> None:
    from skipsearch.masks import KVPattern

    by_context = {**_int8_costs(), "attn": [[[0.7, 1.2], [1.7, 2.2]]] * 2}
    latency = LatencyProfile.from_dict({**_latency().to_dict(), "precisions": {"8": by_context}})
    # at 300 tokens the int8 attention costs 1.7; a draft reading 100 keys pays its 0.7.
    assert Calibrated(latency, ALL_INT8, context=300).round_time(1).draft == exact(1 + 2 * (1.7 + 1.2) + 2)
    windowed = Calibrated(latency, ALL_INT8, context=300, kv=KVPattern(0, 100)).round_time(1)
    assert windowed.draft == exact(1 + 2 * (0.7 + 1.2) + 2)


def _thirty_layers(int4: bool) -> LatencyProfile:
    """30 layers of attn 1 -> 2, mlp 2 -> 3 (positions 1 -> 3), embed 1, head 2 -> 4: a step of 93;
    with `int4`, each layer measured at int4 at attn 0.2, mlp 0.3 (bytes would say 0.3125, 0.625)."""
    data = _latency().to_dict()
    data["attn"], data["mlp"] = [_tables(1, 2)] * 30, [_tables(2, 3)] * 30
    data["spread"] = {**data["spread"], "attn": data["attn"], "mlp": data["mlp"]}
    data["meta"] = {**data["meta"], "num_layers": 30}
    if int4:
        measured = {"attn": [[[0.2], [0.2]]] * 30, "mlp": [[[0.3], [0.3]]] * 30, "positions": [1]}
        data["precisions"] = {"4": measured}
    return LatencyProfile.from_dict(data)


def test_the_scorer_prices_an_int4_draft_by_its_measured_costs(caplog: pytest.LogCaptureFixture) -> None:
    from skipsearch.search.objective import make_scorer

    mask = SkipMask.parse("w4:0-29", 30)
    accepted = _profile("1111")  # every drafted token accepted: 2 tokens a round at γ = 1
    # verify reuses nothing: embed 1 + 30 layers at 2 positions (1.5 + 2.5) + head 3 = 124; overhead 0.5.
    measured = make_scorer("speedup", "calibrated", _thirty_layers(int4=True), gamma_max=1, context=100)
    # draft: embed 1 + 30 x (0.2 + 0.3) + head 2 = 18, measured.
    assert measured(mask, accepted).value == exact(2 * 93 / (18 + 124 + 0.5))
    assert "timings" not in caplog.text
    by_bytes = make_scorer("speedup", "calibrated", _thirty_layers(int4=False), gamma_max=1, context=100)
    # draft: embed 1 + 30 x (0.3125 + 0.625) + head 2 = 31.125, by bytes, and said.
    assert by_bytes(mask, accepted).value == exact(2 * 93 / (31.125 + 124 + 0.5))
    assert caplog.text.count("no int4 timings") == 1


def test_a_precision_ceiling_is_its_speedup_were_every_token_accepted() -> None:
    from skipsearch.cost.profile_summary import precision_ceilings

    # int8 at 300 tokens (512 clamped): γ = 1 round 6.8 + 12 + 0.5 for 2 tokens of 9 each; γ = 2
    # round 13.6 + 15 + 1 for 3.
    (ceiling,) = precision_ceilings(_with_int8(), 512, gammas=(1, 2)).values()
    assert ceiling.speedup == exact(max(18 / 19.3, 27 / 29.6)) and not ceiling.pays
    cheap = {**_int8_costs(), "attn": [_tables(0.1, 0.2)] * 2, "mlp": [_tables(0.1, 0.2)] * 2}
    latency = LatencyProfile.from_dict({**_latency().to_dict(), "precisions": {"4": cheap}})
    # int4 draft step 1 + 2 x 0.2 + 2 = 3.4: γ = 1 gives 18 / (3.4 + 12 + 0.5), which pays.
    assert precision_ceilings(latency, 100, gammas=(1,))[4].speedup == exact(18 / 15.9)
    assert precision_ceilings(latency, 100, gammas=(1,))[4].pays
    assert precision_ceilings(_latency(), 100) == {}


def test_precision_costs_on_their_own_position_counts() -> None:
    """A table timed at 1 and 3 positions of its own prices 2 positions between them; one timed at
    positions that do not increase is refused."""
    own = {**_int8_costs(), "attn": [[[0.5, 1.5]] * 2] * 2, "positions": [1, 3]}
    latency = LatencyProfile.from_dict({**_latency().to_dict(), "precisions": {"8": own}})
    assert latency.weights(100, 2).low_bits[8][0] == exact((1.0, 1.0))
    assert LatencyProfile.from_dict(latency.to_dict()) == latency
    with pytest.raises(ConfigError, match=r"precisions\.8\.positions must be an increasing"):
        LatencyProfile.from_dict({**latency.to_dict(), "precisions": {"8": {**own, "positions": [3, 1]}}})
    with pytest.raises(ConfigError, match=r"precisions\.8\.attn must hold"):
        LatencyProfile.from_dict({**latency.to_dict(), "precisions": {"8": {**own, "positions": [1]}}})
