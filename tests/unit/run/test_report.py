"""The verdict a run prints: it names the cost model, and the mask has its own line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

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
    assert f"    {summary(cost)['mask']}" in text.splitlines()
    assert json.dumps(summary(cost))  # the summary stays plain data
