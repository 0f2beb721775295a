"""Skip masks and drafts: strings, JSON, validation and the reuse arithmetic."""

from __future__ import annotations

import json

import pytest

from skipsearch.errors import InvalidMaskError
from skipsearch.masks import (
    Draft,
    KVPattern,
    SkipMask,
    SublayerWeights,
    parse_draft_vocab,
    parse_layer_list,
)


# -- the candidate type ---------------------------------------------------------------------------
def test_draft_string_extends_the_mask_string() -> None:
    draft = Draft.parse("a:4,14|m:4,14,20|v:8192", 30)
    assert draft == Draft(SkipMask(30, [4, 14], [4, 14, 20]), 8192)
    assert str(draft) == "a:4,14|m:4,14,20|v:8192"
    assert Draft.parse("4,14", 30) == Draft(SkipMask.from_layers(30, [4, 14]))
    assert str(Draft(SkipMask.from_layers(30, [4]))) == "a:4|m:4"
    assert Draft.from_dict(draft.to_dict()) == draft
    assert Draft.from_dict(SkipMask(30, [4]).to_dict()).vocab is None


def test_a_kv_pattern_extends_the_draft_string() -> None:
    draft = Draft.parse("a:4|m:4|v:8192|kv:s4w1024", 30)
    assert draft.kv == KVPattern(4, 1024) and draft.vocab == 8192
    assert str(draft) == "a:4|m:4|v:8192|kv:s4w1024"
    assert Draft.parse("kv:s0w64|4", 30) == Draft(SkipMask.from_layers(30, [4]), None, KVPattern(0, 64))
    assert Draft.parse("4|kv:full", 30).kv is None
    assert Draft.from_dict(draft.to_dict()) == draft and draft.to_dict()["kv"] == "s4w1024"
    assert Draft.from_dict(SkipMask(30, [4]).to_dict()).kv is None  # written before KV patterns
    seen = [key for key in range(2000) if KVPattern(4, 1024).sees(key, 1999)]
    assert seen == [0, 1, 2, 3, *range(976, 2000)]  # 4 + 1024 keys: the sink and the window
    assert KVPattern(4, 1024).covers(1028) and not KVPattern(4, 1024).covers(1029)


def test_a_kv_pattern_with_pillars_reads_back_and_prices_its_keys() -> None:
    draft = Draft.parse("a:4|m:4|kv:s4w256k64", 30)
    assert draft.kv == KVPattern(4, 256, 64) and str(draft) == "a:4|m:4|kv:s4w256k64"
    assert Draft.from_dict(draft.to_dict()) == draft
    assert KVPattern(4, 256, 64).keys_read == 324 and str(KVPattern(4, 256)) == "s4w256"
    assert KVPattern(4, 256, 64).pillar_region(1000) == (4, 745)  # before any later draft's window
    assert KVPattern(4, 256, 64).covers(260) and not KVPattern(4, 256, 64).covers(261)
    with pytest.raises(InvalidMaskError, match="pillars must be >= 0"):
        KVPattern(4, 256, -1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("s4w0", "window >= 1"),
        ("w1024", "s<sink>w<window>"),
        ("s-1w8", "s<sink>w<window>"),
        ("s4w8p2", "s<sink>w<window>"),
        ("s4w8k", "s<sink>w<window>"),
        ("a:4|kv:s1w2|kv:s1w4", "kv: once"),
    ],
)
def test_a_bad_kv_pattern_is_rejected_with_the_form_to_use(text: str, message: str) -> None:
    with pytest.raises(InvalidMaskError, match=message):
        Draft.parse(text if "|" in text else f"4|kv:{text}", 30)


@pytest.mark.parametrize("text", ["0", "-3", "many", "1.5", ""])
def test_a_draft_vocabulary_is_a_positive_size_or_full(text: str) -> None:
    with pytest.raises(InvalidMaskError, match=r"pass a positive integer|pass --draft-vocab 1 or more"):
        parse_draft_vocab(text)
    assert parse_draft_vocab("full") is None
    assert parse_draft_vocab("4096") == 4096


def test_layer_skip_sets_both_bits_and_first_divergent_layer():
    mask = SkipMask.from_layers(10, [4, 7])
    assert mask.attn == mask.mlp == {4, 7}
    assert mask.first_divergent_layer == 4
    assert mask.r_reuse == pytest.approx(0.4)
    assert mask.r_draft() == pytest.approx(0.8)


def test_skipped_attention_diverges_at_its_layer_but_skipped_mlp_one_later():
    assert SkipMask(10, attn=[5]).first_divergent_layer == 5
    assert SkipMask(10, mlp=[5]).first_divergent_layer == 6
    assert SkipMask(10, attn=[7], mlp=[5]).first_divergent_layer == 6
    assert SkipMask(10, mlp=[9]).r_reuse == 1.0


def test_first_layer_skipped_reuses_nothing_and_empty_mask_reuses_everything():
    assert SkipMask.from_layers(8, [0]).r_reuse == 0.0
    empty = SkipMask(8)
    assert empty.is_empty and empty.r_reuse == 1.0 and empty.r_draft() == 1.0
    assert empty.exit_layer == 8


def test_contiguous_prefix_has_r_reuse_equal_r_draft():
    mask = SkipMask.prefix(12, 9)
    assert mask.exit_layer == 9
    assert mask.r_reuse == mask.r_draft() == pytest.approx(0.75)
    assert SkipMask.from_layers(12, [3]).exit_layer is None


def test_string_and_json_round_trip():
    mask = SkipMask(30, attn=[4, 14], mlp=[4, 14, 20])
    assert str(mask) == "a:4,14|m:4,14,20"
    assert SkipMask.parse(str(mask), 30) == mask
    assert SkipMask.from_json(mask.to_json()) == mask
    assert json.loads(mask.to_json()) == {"num_layers": 30, "attn": [4, 14], "mlp": [4, 14, 20]}
    assert hash(SkipMask.parse("4,14", 30)) == hash(SkipMask.from_layers(30, [14, 4]))
    assert str(SkipMask(5)) == "a:|m:"
    assert SkipMask.parse("a:|m:", 5) == SkipMask(5)


def test_parse_layer_lists_with_ranges():
    assert parse_layer_list("4, 14,20-22") == [4, 14, 20, 21, 22]
    assert parse_layer_list("") == []
    with pytest.raises(InvalidMaskError, match="comma-separated"):
        parse_layer_list("4;5")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SkipMask.from_layers(4, [4]), "out of range"),
        (lambda: SkipMask(4, mlp=[-1]), "out of range"),
        (lambda: SkipMask.from_layers(3, [0, 1, 2]), "skips every layer"),
        (lambda: SkipMask.prefix(4, 0), "exit layer"),
        (lambda: SkipMask.parse("x:1", 4), "cannot read"),
        (lambda: SkipMask.parse("a:1|z:2", 4), "cannot read mask"),
    ],
)
def test_invalid_masks_are_rejected_with_a_reason(build, message):
    with pytest.raises(InvalidMaskError, match=message):
        build()


def test_weighted_r_draft_uses_measured_costs():
    weights = SublayerWeights(embed=1.0, attn=[2.0, 2.0], mlp=[4.0, 4.0], head=3.0)
    assert weights.total == 16.0
    assert SkipMask(2, attn=[1]).r_draft(weights) == pytest.approx(14 / 16)
    assert SkipMask.from_layers(2, [0]).r_draft(weights) == pytest.approx(10 / 16)
    with pytest.raises(InvalidMaskError, match="profile the same model"):
        SkipMask(3).r_draft(weights)


def test_evaluation_starts_at_the_first_skipped_sublayer_not_at_s1():
    mlp_first = SkipMask(10, attn=[7], mlp=[5])
    assert mlp_first.first_divergent_layer == 6
    assert mlp_first.first_skipped_layer == 5
    assert SkipMask(10).first_skipped_layer == 10


def test_reused_sublayers() -> None:
    assert SkipMask.from_layers(4, [1]).reused_sublayers == 2
    assert SkipMask(4, attn={2}, mlp={3}).reused_sublayers == 4
    assert SkipMask(4, mlp={1}).reused_sublayers == 3  # s1 = 2, yet verify reruns MLP 1
    assert SkipMask(4).reused_sublayers == 8
    assert SkipMask.from_layers(4, [0]).reused_sublayers == 0


# -- lower precision ------------------------------------------------------------------------------
def test_precision_strings_round_trip_and_old_strings_read_the_same() -> None:
    mask = SkipMask.parse("a:10|m:10|w8:0-3|w4a:5|w8m:6", 12)
    assert mask.attn_int8 == {0, 1, 2, 3} and mask.mlp_int8 == {0, 1, 2, 3, 6}
    assert mask.attn_int4 == {5} and not mask.mlp_int4
    assert str(mask) == "a:10|m:10|w8:0,1,2,3|w8m:6|w4a:5"
    assert SkipMask.parse(str(mask), 12) == mask
    assert SkipMask.from_dict(json.loads(json.dumps(mask.to_dict()))) == mask
    assert SkipMask.from_json(mask.to_json()) == mask
    plain = SkipMask.parse("a:4|m:4", 12)
    assert str(plain) == "a:4|m:4" and "attn_int8" not in plain.to_dict()
    draft = Draft.parse("a:|m:|w4:0-11|v:8192|kv:s4w64", 12)
    assert draft.mask.quantized and draft.vocab == 8192 and str(draft.kv) == "s4w64"
    assert Draft.parse(str(draft), 12) == draft


def test_a_sub_layer_is_run_one_way() -> None:
    with pytest.raises(InvalidMaskError, match="layer 3 is given two ways"):
        SkipMask.parse("a:3|m:|w8:3", 12)
    with pytest.raises(InvalidMaskError, match="two ways"):
        SkipMask.parse("w8m:2|w4m:2", 12)
    with pytest.raises(InvalidMaskError, match="out of range"):
        SkipMask.parse("w4:12", 12)
    with pytest.raises(InvalidMaskError, match="cannot read mask"):
        SkipMask.parse("w16:1", 12)


def test_lower_precision_ends_the_reused_prefix_as_a_skip_does() -> None:
    mask = SkipMask.parse("w8:5-11", 12)
    assert mask.first_divergent_layer == 5 and mask.reused_sublayers == 10
    assert not mask.is_empty and mask.exit_layer is None and mask.first_skipped_layer == 5
    assert mask.attn_bits(4) == 16 and mask.attn_bits(5) == 8 and mask.exact_mlp(4)
    mlp = SkipMask.parse("w4m:3", 12)  # layer 3's K/V stays exact; its output does not
    assert mlp.first_divergent_layer == 4 and mlp.reused_sublayers == 7 and not mlp.exact_mlp(3)
    assert mlp.runs_mlp(3) and mlp.mlp_bits(3) == 4
    assert SkipMask.parse("w8:0-11", 12).r_reuse == 0.0


def test_r_draft_prices_lower_precision_by_measured_cost_or_by_bytes() -> None:
    mask = SkipMask.parse("a:0|m:|w8:1|w4m:0", 2)
    assert mask.r_draft() == pytest.approx((0 + 0.5 + 5 / 16 + 0.5) / 4)  # int4: a bf16 scale, zero / 32
    weights = SublayerWeights(embed=1.0, attn=[2.0, 2.0], mlp=[3.0, 3.0], head=2.0)
    assert weights.priced_by_bytes(mask)
    by_bytes = 1.0 + 0.0 + 3.0 * 5 / 16 + 2.0 * 8 / 16 + 3.0 * 8 / 16 + 2.0
    assert mask.r_draft(weights) == pytest.approx(by_bytes / weights.total)
    measured = SublayerWeights(
        1.0, [2.0, 2.0], [3.0, 3.0], 2.0, {8: ([1.5, 1.5], [2.0, 2.0]), 4: ([1, 1], [1, 1])}
    )
    assert not measured.priced_by_bytes(mask)
    assert mask.r_draft(measured) == pytest.approx((1.0 + 1.0 + 1.5 + 2.0 + 2.0) / measured.total)


def test_parse_names_the_misused_argument_and_a_layer_named_twice() -> None:
    from skipsearch.errors import SettingTypeError

    with pytest.raises(SettingTypeError, match="text must be a draft string"):
        Draft.parse(None, 30)  # type: ignore[arg-type]
    with pytest.raises(SettingTypeError, match="num_layers must be an integer"):
        Draft.parse("a:1", "thirty")  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # a project error that is a TypeError too
        SkipMask.parse(4, 30)  # type: ignore[arg-type]
    with pytest.raises(InvalidMaskError, match="names layer 1 twice"):
        SkipMask.parse("1,1", 30)
    with pytest.raises(InvalidMaskError, match="names layer 5 twice"):
        parse_layer_list("4-6,5")


def test_a_readable_draft_string_shows_ranges_and_parses_to_the_same_draft() -> None:
    from skipsearch.masks import readable

    every_layer_int4 = SkipMask.parse("w4:" + ",".join(map(str, range(30))), 30)
    assert readable(f"{every_layer_int4}|v:16384") == "w4:0-29|v:16384"
    mixed = SkipMask.parse("a:5,6,7,9|m:5|w4:0-4,10-11,12-29", 30)
    assert readable(str(mixed)) == "a:5-7,9|m:5|w4:0-4,10-29"
    assert readable("a:|m:") == "a:|m:"  # the full model keeps a string that says so
    for mask in (every_layer_int4, mixed, SkipMask.parse("a:1,2|m:", 30)):
        assert SkipMask.parse(readable(str(mask)), 30) == mask
    assert readable("a:x|m:") == "a:x|m:"  # not a draft string: as it was
