"""`cost.verdict`: a draft pays off from `PAYS_OFF` up, judged by the cost model the run ranked
with, or by the finalists' exact re-score where there is one."""

import pytest

from skipsearch.cost.verdict import PAYS_OFF, Verdict, judge

PREDICTED = {"closed_form": 1.30, "calibrated": 0.97}


def test_the_verdict_judges_by_the_cost_model_the_run_ranked_with() -> None:
    assert judge("calibrated", PREDICTED) == Verdict(0.97, "calibrated")
    assert judge("closed-form", PREDICTED) == Verdict(1.30, "closed-form")
    assert not judge("calibrated", PREDICTED).pays and judge("closed-form", PREDICTED).pays


def test_an_exact_re_score_replaces_the_prediction() -> None:
    verdict = judge("calibrated", PREDICTED, exact=1.06, exact_gamma=4)
    assert verdict == Verdict(1.06, "calibrated", 4) and verdict.pays


@pytest.mark.parametrize(("speedup", "pays"), [(PAYS_OFF, True), (PAYS_OFF - 1e-9, False), (1.0, False)])
def test_a_draft_pays_off_from_the_margin_up(speedup: float, pays: bool) -> None:
    assert Verdict(speedup, "calibrated").pays is pays


def test_a_cost_model_the_run_did_not_price_is_refused() -> None:
    with pytest.raises(ValueError, match="no calibrated prediction"):
        judge("calibrated", {"closed_form": 1.3, "calibrated": None})
