"""`experiments/search_cost.py`: the budget's wall time is `SearchClock`'s own total fed the measured
readings, and bad options fail in one line before any model loads."""

from __future__ import annotations

import pytest

from experiments.search_cost import check_args, parser, predicted
from skipsearch.run.cost_estimate import FINALIST_TRIALS
from skipsearch.run.finalists import FINALISTS


def test_the_prediction_is_the_search_clocks_total() -> None:
    """Ready after the load, the reference and the first trial's one-off copies (10 + 20 + 3 s); then
    every trial left and the finalists' re-score at the steady 2 s, as `run` prints it."""
    record = {"load_s": 10.0, "reference_s": 20.0, "shared-kv": {"first_s": 5.0, "steady_s": 2.0}}
    found = predicted(record, "shared-kv", 200)
    assert found["seconds"] == pytest.approx(35.0 + (199 + FINALISTS * FINALIST_TRIALS) * 2.0)
    assert "a trial 2.0 s, 199 left" in found["line"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--budget", "0"], "--budget 0"),
        (["--mistral-layers", "2,x"], "--mistral-layers: 'x'"),
        (["--mistral-layers", "64"], "--mistral-layers: '64'"),
        (["--draft", "w8:0-{end}"], "--draft"),
        (["--out", "a/b"], "--out 'a/b'"),
        (["--n-prompts", "0"], "--n-prompts 0"),
    ],
)
def test_bad_options_fail_in_one_line(options: list[str], named: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        check_args(parser().parse_args(options))
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and named in line


def test_the_full_depth_is_a_line_through_the_measured_depths_and_says_so() -> None:
    from experiments.search_cost import MODES, extrapolated

    def record(layers: int) -> dict:
        trial = {"first_s": 3.0 * layers, "steady_s": 1.0 + layers, "passes": [1]}
        measured = {"plan": "p", "layers": layers, "load_s": 2.0 + layers, "reference_s": 4.0 * layers}
        return measured | {mode: dict(trial) for mode in MODES}

    rows = [(f"mistral-7b, random weights, {n} layers", record(n)) for n in (2, 8)]
    [(name, full)] = extrapolated(rows, 200)
    assert "extrapolated from 2, 8" in name
    assert full["reference_s"] == pytest.approx(128.0) and full["shared-kv"]["steady_s"] == pytest.approx(
        33.0
    )
    assert full["predicted"]["shared-kv"]["seconds"] > 200 * 33.0
    assert extrapolated(rows[:1], 200) == []  # one depth draws no line
    assert extrapolated([*rows, ("mistral-7b, random weights, 32 layers", record(32))], 200) == []
