"""The verdict a run prints: it names the cost model, and the mask has its own line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from skipsearch.masks import SkipMask, readable
from skipsearch.run.summary_text import verdict

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def summary(cost: str) -> dict:
    return {
        "model": "m",
        "mask": "a:" + ",".join(map(str, range(1, 29))) + "|m:" + ",".join(map(str, range(1, 29))),
        "skipped_attn": [1],
        "skipped_mlp": [1],
        "gamma_best": 2,
        "cost": cost,
        "predicted_speedup": {"closed_form": 1.30, "calibrated": 0.72},
        "acceptance": {"alpha": 0.7, "sampling_acceptance": 0.8, "temperature": 1.0},
        "r_draft": 0.5,
        "r_reuse": 0.1,
        "strategy": "learned",
        "seed": 0,
    }


def test_the_verdict_names_the_kv_pattern_and_where_the_gain_comes_from() -> None:
    searched = {
        **summary("calibrated"),
        "kv": "s4w1024",
        "score_by_kv": {"full": 0.95, "s4w1024": 1.31},
        "score_by_draft_vocab": {"full": 1.31, "16384": 1.25},
    }
    text = verdict(searched, pd.DataFrame({"repeat": [False]}), pd.DataFrame())
    assert "attending through the KV pattern s4w1024" in text
    assert (
        "the best mask's score with each draft vocabulary full 1.310, 16384 1.250; with each KV "
        "pattern full 0.950, s4w1024 1.310" in text
    )
    plain = verdict(summary("calibrated"), pd.DataFrame({"repeat": [False]}), pd.DataFrame())
    assert "KV pattern" not in plain and "score with each" not in plain


@pytest.mark.parametrize(
    ("cost", "figure", "named"),
    [("closed-form", "1.300x", "closed-form"), ("calibrated", "0.720x", "calibrated")],
)
def test_the_verdict_names_the_cost_model_and_the_mask_has_its_own_line(cost, figure, named) -> None:
    text = verdict(summary(cost), pd.DataFrame({"repeat": [False]}), [])
    assert (
        f"{figure} {'closed form' if cost == 'closed-form' else 'calibrated on this device'} (the cost model"
        in text
    )
    closing = text.split("## Verdict")[1]
    assert named in closing and figure[:4] in closing
    mask = summary(cost)["mask"]
    assert f"    {readable(mask)}" in text.splitlines()  # with ranges, as a person reads it
    assert SkipMask.parse(readable(mask), 30) == SkipMask.parse(mask, 30)
    assert json.dumps(summary(cost))  # the summary stays plain data


def test_the_verdict_says_whether_the_best_draft_at_lower_precision_pays() -> None:
    frame = pd.DataFrame(
        {
            "repeat": [False, False, False],
            "mask": ["a:1|m:1", "w4:0-29", "a:3|m:3|w8:0-2,4-29"],
            "score": [1.40, 1.20, 1.30],
            "precision": [None, "int4", "int8"],
            "speedup_closed_form": [1.5, 1.1, 1.2],
            "speedup_calibrated": [1.40, 1.20, 1.30],
        }
    )
    closing = verdict(summary("calibrated"), frame, []).split("## Verdict")[1]
    assert (
        "The best draft at lower precision (int8), `a:3|m:3|w8:0-2,4-29`, pays: 1.30x predicted by "
        "the cost model calibrated on this device." in closing
    )
    slow = frame.assign(speedup_calibrated=[1.4, 0.9, 1.0], score=[1.4, 0.9, 1.0])
    closing = verdict(summary("calibrated"), slow, []).split("## Verdict")[1]
    assert "(int8), `a:3|m:3|w8:0-2,4-29`, does not pay (below 1.05x): 1.00x predicted" in closing
    # a run that scored no draft at lower precision says nothing of it
    assert "lower precision" not in verdict(summary("calibrated"), frame.drop(columns="precision"), [])
    assert "lower precision" not in verdict(summary("calibrated"), frame.iloc[:1], [])
