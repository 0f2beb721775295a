"""Two `skipsearch run` commands on one `--out`, raced N times: does the run directory keep one owner?

Issue 20: two runs started 0.3-1 s apart on a new `--out` deleted each other. Each race here
starts two real processes on one `--out`, the second after a random 0-0.6 s delay, in one of two
scenarios taken in turn:
- `new`: two new runs (seeds 0 and 1) on a directory that does not exist yet;
- `resume`: two `--resume --budget 4` of one finished two-mask run.

Per scenario it prints how often each pair of exit codes came up, and counts the failures the
issue is about: a traceback on stderr, a run directory deleted, a run corrupted (a journal that is
not whole records, or fewer finished trials than the budget), and more or fewer than one owner (a
process that exits 0 having measured masks itself: a resume that starts after the other finished
measures none). A sound run directory shows every race as exit codes (0, 2) or, for `resume`,
(0, 0) when the second starts after the first finished, and zeros in the failure columns.

Run: `.venv/bin/python experiments/race.py [--races 100] [--model DIR]` (without `--model`, a
tiny random Llama with a tiny tokenizer is built in a temporary directory, as the tests do);
exits 1 when any race failed.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from skipsearch.search.journal import whole_records_length
from skipsearch.store import JOURNAL_FILE, RUN_FILE, kernels_dir

SMALL = ["--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "32", "--strategy", "random"]
SCENARIOS = ("new", "resume")


def command(model: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "skipsearch", "run", "--model", model, *SMALL, "--out", str(out), *extra]


def race(first: list[str], second: list[str], delay: float) -> list[tuple[int, str, str]]:
    """Start `first`, then `second` after `delay` seconds; (exit code, stdout, stderr) of each."""
    one = subprocess.Popen(first, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    two = subprocess.Popen(second, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outcomes = []
    for process in (one, two):
        stdout, stderr = process.communicate()
        outcomes.append((process.returncode, stdout, stderr))
    return outcomes


def owned(code: int, stdout: str) -> bool:
    """Whether a process ran the run: it finished and measured masks itself."""
    return code == 0 and re.search(r"[1-9]\d* measured in this session", stdout) is not None


def finished_trials(out: Path) -> int:
    """Finished trials over every study of `out` (the journal read as a reader would)."""
    from skipsearch.search.study import journal_storage

    storage = journal_storage(out)
    return sum(
        len(optuna.load_study(study_name=name, storage=storage).get_trials(states=(TrialState.COMPLETE,)))
        for name in optuna.study.get_all_study_names(storage)
    )


def damage(out: Path, budget: int) -> str:
    """What is wrong with the run in `out` after a race: '' when it is whole."""
    if not (out / RUN_FILE).is_file():
        return "deleted"
    journal = (out / JOURNAL_FILE).read_bytes() if (out / JOURNAL_FILE).is_file() else b""
    if whole_records_length(journal) != len(journal) or finished_trials(out) < budget:
        return "corrupted"
    return ""


def one_race(scenario: str, model: str, base: Path, out: Path, delay: float) -> dict:
    if scenario == "new":
        first, second, budget = command(model, out, "--budget", "2"), command(model, out, "--seed", "1"), 2
        second += ["--budget", "2"]
    else:
        shutil.copytree(base, out)
        first = second = command(model, out, "--budget", "4", "--resume")
        budget = 4
    outcomes = race(first, second, delay)
    return {
        "scenario": scenario,
        "codes": tuple(code for code, _, _ in outcomes),
        "tracebacks": sum("Traceback" in err for _, _, err in outcomes),
        "damage": damage(out, budget),
        "owners": sum(owned(code, stdout) for code, stdout, _ in outcomes),
    }


def tiny_model_dir(directory: Path) -> str:
    """The test suite's tiny Llama and tokenizer, saved as a local model directory."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `tests`
    from tests.conftest import make_tokenizer, tiny_model

    tokenizer = make_tokenizer()
    tiny_model("llama", layers=6, vocab_size=len(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def table(results: list[dict]) -> str:
    lines = ["scenario  races  exit codes (count)            tracebacks  deleted  corrupted  not one owner"]
    for scenario in SCENARIOS:
        rows = [r for r in results if r["scenario"] == scenario]
        if not rows:
            continue
        codes = collections.Counter(r["codes"] for r in rows)
        shown = ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))
        owners = sum(r["owners"] != 1 for r in rows)
        lines.append(
            f"{scenario:<9} {len(rows):>5}  {shown:<29} {sum(r['tracebacks'] for r in rows):>10}  "
            f"{sum(r['damage'] == 'deleted' for r in rows):>7}  "
            f"{sum(r['damage'] == 'corrupted' for r in rows):>9}  {owners:>13}"
        )
    return "\n".join(lines)


def failed(result: dict) -> bool:
    return bool(result["tracebacks"] or result["damage"] or result["owners"] != 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--races", type=int, default=100, help="races to run (default %(default)s)")
    parser.add_argument("--model", help="local model directory (default: a tiny random one)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the start delays (default %(default)s)")
    args = parser.parse_args(argv)
    delays = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="race-") as work:
        root = Path(work)
        kernels = kernels_dir()  # the kernels this machine built and the plan choices it measured
        kernels.mkdir(parents=True, exist_ok=True)
        os.environ["SKIPSEARCH_CACHE"] = str(root / "cache")  # the tiny model's references, thrown away
        (root / "cache").mkdir()
        (root / "cache" / "kernels").symlink_to(kernels, target_is_directory=True)  # kept: not per race
        model = args.model or tiny_model_dir(root / "model")
        base = root / "base"
        if subprocess.run(command(model, base, "--budget", "2"), capture_output=True).returncode:
            raise SystemExit(f"the base run in {base} failed: try the command by hand")
        results = [
            one_race(SCENARIOS[i % 2], model, base, root / f"r{i}", delays.uniform(0.0, 0.6))
            for i in range(args.races)
        ]
    print(table(results))
    return int(any(failed(r) for r in results))


if __name__ == "__main__":
    sys.exit(main())
