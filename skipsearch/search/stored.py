"""Reading a run directory back: its config, the trials of every study, the AcceptanceProfiles it measured.

A run directory (`skipsearch run`, `compare`) holds one Optuna journal with one or more studies
and one evaluation cache; exporters and the tier search read it without the model.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.search import EvaluationCache, TrialRecord, load_study, trial_records
from skipsearch.search.study import journal_storage
from skipsearch.store import CACHE_DIR, JOURNAL_FILE, RUN_FILE


def load_run(run_dir: Path) -> tuple[RunConfig, dict]:
    """`run.yaml`: the run's config and provenance."""
    return RunConfig.load(Path(run_dir) / RUN_FILE)


def run_trials(run_dir: Path) -> list[TrialRecord]:
    """Every mask scored by any study of the run, once each (repeats dropped), in study order."""
    run_dir = Path(run_dir)
    if not (run_dir / JOURNAL_FILE).is_file():
        raise ConfigError(f"{run_dir} holds no study journal ({JOURNAL_FILE}): pass the directory of a run")
    names = optuna.study.get_all_study_names(journal_storage(run_dir))
    return [r for name in names for r in trial_records(load_study(run_dir, name)) if not r.repeat]


def run_profiles(run_dir: Path) -> dict[str, AcceptanceProfile]:
    """The cached AcceptanceProfile of every mask the run scored, by mask string."""
    cache = EvaluationCache(Path(run_dir) / CACHE_DIR)
    profiles = {}
    for record in run_trials(run_dir):
        entry = cache.get(record.mask)
        if entry is not None:
            profiles[record.mask] = entry.profile
    return profiles
