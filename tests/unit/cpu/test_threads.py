"""Thread counts from free cores."""

import os
from pathlib import Path

import pytest

from skipsearch.cpu.threads import busy_cores, busy_shares, choose_threads


# -- threads --------------------------------------------------------------------------------------
def test_one_thread_per_free_core_unless_the_user_chose() -> None:
    assert choose_threads(current=2, cores=2, busy=0.1, user_set=False).threads == 2
    busy = choose_threads(current=2, cores=2, busy=1.0, user_set=False)
    assert busy.threads == 1 and "1.0 cores busy" in busy.reason
    assert choose_threads(current=8, cores=8, busy=7.9, user_set=False).threads == 1  # never zero
    assert choose_threads(current=2, cores=2, busy=1.0, user_set=True).threads == 2  # OMP_NUM_THREADS
    assert choose_threads(current=1, cores=2, busy=0.0, user_set=False).threads == 1  # set before


def test_busy_cores_come_from_the_kernels_cpu_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stat = tmp_path / "stat"
    readings = iter(["cpu  100 0 100 800 0 0 0 0 0 0\n", "cpu  150 0 100 850 0 0 0 0 0 0\n"])

    def read_text(self: Path) -> str:
        return next(readings)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    # 50 busy jiffies of 100 on all cores together: half of two cores, one core's worth
    assert busy_cores(seconds=0, path=stat, windows=1) == pytest.approx(1.0)


def test_a_moment_of_work_is_not_a_busy_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core counts as busy only if it is busy in every window: a command that ran for a moment
    beside a decode's start must not take the decode to one thread."""
    stat = tmp_path / "stat"
    totals = [(100, 1000), (160, 1100), (165, 1200), (170, 1300)]  # busy 60, then 5 and 5 of 100
    readings = iter(f"cpu  {busy} 0 0 {total - busy} 0 0 0 0 0 0\n" for busy, total in totals)
    monkeypatch.setattr(Path, "read_text", lambda self: next(readings))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert busy_cores(seconds=0, path=stat, windows=3) == pytest.approx(0.1)
    readings = iter(f"cpu  {busy} 0 0 {total - busy} 0 0 0 0 0 0\n" for busy, total in
                    [(0, 0), (50, 100), (100, 200)])  # fmt: skip
    assert busy_cores(seconds=0, path=stat, windows=2) == pytest.approx(1.0)  # busy in both


def test_each_cores_share_comes_from_its_own_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the helpers and the decoding thread go (`cpu.shared_core`): core 1 busy, core 0 not."""
    readings = iter(
        [
            "cpu  100 0 0 900 0\ncpu0 50 0 0 450 0\ncpu1 50 0 0 450 0\nintr 1\n",
            "cpu  150 0 0 950 0\ncpu0 52 0 0 498 0\ncpu1 98 0 0 452 0\nintr 2\n",
        ]
    )
    monkeypatch.setattr(Path, "read_text", lambda self: next(readings))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    busy, shares = busy_shares(seconds=0, path=tmp_path / "stat", windows=1)
    assert busy == pytest.approx(1.0) and shares == pytest.approx((0.04, 0.96))


def test_the_load_average_stands_in_without_proc_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert busy_cores(seconds=0, path=tmp_path / "missing") == 1.5
