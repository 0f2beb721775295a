"""Latency profiles: JSON round trip, validation, interpolation and the draft-head table."""

from __future__ import annotations

import json

import pytest

from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from tests.unit.cost.conftest import _latency, _with_head_table, exact


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


def test_a_profile_of_other_kernels_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    """A profile timed on fp32 SDPA, or on other linear products, prices a model that now runs the
    decode kernel, or the bf16-weight kernel, as the old plan."""
    data = _latency().to_dict()
    meta = {**data["meta"], "attention": "sdpa_fp32kv", "products": "onednn"}
    old = LatencyProfile.from_dict({**data, "meta": meta})
    assert old.warn_other_plan({"attention": "kernel_bf16kv", "products": "onednn"}, "p.json")
    assert "profile --model tiny" in caplog.text and "kernel_bf16kv" in caplog.text
    caplog.clear()
    assert old.warn_other_plan({"attention": "sdpa_fp32kv", "products": "bf16-kernel"}, "p.json")
    assert "products onednn where this plan runs bf16-kernel" in caplog.text
    assert not old.warn_other_plan({"attention": "sdpa_fp32kv", "products": "onednn"}, "p.json")
    older = _latency()  # older than the record
    assert not older.warn_other_plan({"attention": "kernel_bf16kv", "products": "bf16-kernel"}, "p.json")


def test_a_profile_older_than_the_norm_rotary_and_layer_kernels_timed_transformers_operators(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = _latency().to_dict()
    before = LatencyProfile.from_dict({**data, "meta": {**data["meta"], "products": "bf16-kernel"}})
    running = {"products": "bf16-kernel", "norms": "kernel", "rotary": "torch"}
    assert before.warn_other_plan(running, "p.json")
    assert "norms torch where this plan runs kernel" in caplog.text and "rotary" not in caplog.text
    assert not before.warn_other_plan({**running, "norms": "torch"}, "p.json")
    meta = {**data["meta"], "products": "bf16-kernel", "norms": "kernel", "rotary": "kernel"}
    now = LatencyProfile.from_dict({**data, "meta": meta})
    assert not now.warn_other_plan({**running, "rotary": "kernel"}, "p.json")
    assert now.warn_other_plan({**running, "rotary": "kernel", "layers": "fused"}, "p.json")
    assert "layers modules where this plan runs fused" in caplog.text


def test_the_pillar_choice_round_trips_interpolates_and_is_validated(tmp_path) -> None:
    profile = LatencyProfile.from_dict({**_latency().to_dict(), "pillar_choice": [0.5, 1.5]})
    profile.save(tmp_path / "p.json")
    assert LatencyProfile.load(tmp_path / "p.json") == profile
    assert profile.pillar_choice_time(200) == exact(1.0)
    assert profile.pillar_choice_time(50) == exact(0.5)  # clamped, as every table is
    assert profile.for_context(500, extrapolate=True).pillar_choice_time(500) == exact(2.5)
    for bad in ([1.0], [1.0, -1.0], [1.0, float("nan")]):
        with pytest.raises(ConfigError, match="pillar_choice needs one finite time"):
            LatencyProfile.from_dict({**_latency().to_dict(), "pillar_choice": bad})
