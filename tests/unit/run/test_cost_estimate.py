"""The search's cost as it runs (`run.cost_estimate`): a line once the model is ready, an estimate once
a trial is timed, a new one only when the total moves, nothing after the budget."""

from skipsearch.run.cost_estimate import FINALIST_TRIALS, SearchClock
from skipsearch.run.finalists import FINALISTS


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_estimate_is_what_passed_plus_the_trials_left_and_the_finalists_at_the_timed_rate() -> None:
    clock = Clock()
    search = SearchClock(10, clock=clock)
    clock.now += 30  # loading the model and building the reference states
    assert "ready in 30 s" in search.loaded()
    assert search.total_seconds(0) is None  # no trial timed yet
    clock.now += 4
    line = search.trial(1, 10)
    assert line is not None and "a trial 4.0 s, 9 left" in line
    assert search.total_seconds(1) == 34 + (9 + FINALISTS * FINALIST_TRIALS) * 4.0
    clock.now += 4.2
    assert search.trial(2, 10) is None  # within 20% of the estimate printed: nothing new to say
    said = []
    for scored in range(3, 6):
        clock.now += 12.0  # trials got three times dearer: the median follows, the estimate is said again
        said.append(search.trial(scored, 10))
    assert search.trial_seconds() == 12.0
    assert any(line is not None and "a trial" in line for line in said)
    assert search.printed_total is not None and search.printed_total > 34 + 18 * 4.2


def test_nothing_is_said_once_the_budget_is_spent_and_a_resume_counts_only_what_is_left() -> None:
    clock = Clock()
    search = SearchClock(20, clock=clock)
    search.loaded()
    clock.now += 2
    line = search.trial(15, 20)  # a resumed run: 14 trials were scored before
    assert line is not None and "5 left" in line
    clock.now += 20
    assert search.trial(20, 20) is None


def test_an_untimed_first_trial_is_counted_against_the_budget_but_not_timed() -> None:
    clock = Clock()
    search = SearchClock(10, clock=clock, untimed=1)  # the draft that keeps every layer, scored first
    search.loaded()
    clock.now += 1.0
    assert search.trial(1, 10) is None and search.trial_seconds() is None
    clock.now += 3.0
    line = search.trial(2, 10)
    assert line is not None and "after 1 timed trial: a trial 3.0 s, 8 left" in line
