"""The report files of a run directory, rebuilt from its study journal and `run.yaml` alone.

Pure read of the run directory (no model), so a copied run can be reported anywhere:
`trials.csv`, `best.json`, `summary.md` (`run.summary_text`) and four plots (`run.plots`). The
writer returns what it wrote (`RunReport`), so the run that wrote it reads none of it back;
`read_run_report` reads a finished directory.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from skipsearch.config import RunConfig
from skipsearch.cost.verdict import Verdict
from skipsearch.errors import ConfigError
from skipsearch.masks import FULL_KV, FULL_VOCAB
from skipsearch.run.finalists import Finalist, load_finalists
from skipsearch.run.plots import (
    plot_alpha_vs_r_draft,
    plot_convergence,
    plot_skip_frequency,
    plot_speedup_vs_gamma,
)
from skipsearch.run.summary_text import completeness, verdict, verdict_of, verdict_sentence
from skipsearch.search import best_trial, load_study, pareto_front, study_trials_frame
from skipsearch.search.results import TrialRecord, trial_records
from skipsearch.store import (
    ALPHA_PLOT,
    BEST_FILE,
    CONVERGENCE_PLOT,
    RUN_FILE,
    SKIP_FREQUENCY_PLOT,
    SPEEDUP_PLOT,
    STUDIES_DIR,
    SUMMARY_FILE,
    TRIALS_TABLE,
    write_text_atomic,
)


@dataclass(frozen=True)
class RunReport:
    """What a run directory's report files hold: best.json's content (`summary`), the trials table
    (`trials`) and `summary.md`'s text, with the verdict they state (`cost.verdict`)."""

    run_dir: Path
    summary: dict = field(repr=False)
    trials: pd.DataFrame = field(repr=False)
    text: str = field(repr=False)

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.summary)

    @property
    def verdict_sentence(self) -> str:
        return verdict_sentence(self.verdict)


def read_run_report(run_dir: Path) -> RunReport:
    """The report files of a finished run, as `write_run_outputs` returned them."""
    path = run_dir / BEST_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} holds no {BEST_FILE}: pass a finished run (or `skipsearch report` it)")
    text = (run_dir / SUMMARY_FILE).read_text() if (run_dir / SUMMARY_FILE).is_file() else ""
    return RunReport(run_dir, json.loads(path.read_text()), pd.read_csv(run_dir / TRIALS_TABLE), text)


def study_dir(run_dir: Path, study_name: str | None) -> Path:
    """Where the report of one study goes: the run directory itself for a run's own study, or
    `studies/<name>/` for one study of a `compare` directory."""
    return run_dir if study_name is None else run_dir / STUDIES_DIR / study_name


def write_run_outputs(
    run_dir: Path,
    study_name: str | None = None,
    stored: tuple[RunConfig, dict] | None = None,
    finalists: list[Finalist] | None = None,
    write: bool = True,
) -> RunReport:
    """Rewrite every report file of `run_dir` (of its study `study_name` in `study_dir`, for a
    `compare` directory); return what they hold. The run that just wrote `run.yaml` and
    `finalists.json` hands their content on (`stored`: its config and provenance; `finalists`);
    else they are read from the directory. With `write=False` nothing is written: the report is
    only returned (an export of one study of a compare reads it so)."""
    config, provenance = stored if stored is not None else RunConfig.load(run_dir / RUN_FILE)
    if stored is None:
        _check_study_named(run_dir, study_name)
    study = load_study(run_dir, study_name or config.strategy)
    if study_name is not None:  # a compare study ran with its own strategy and seed
        settings = study.user_attrs.get("settings", {})
        config = replace(
            config, strategy=settings.get("strategy", config.strategy), seed=settings.get("seed", config.seed)
        )
    frame = study_trials_frame(study)
    best = best_trial(study)
    if best is None or frame.empty:
        raise ConfigError(f"{run_dir} has no finished trial yet: run or --resume it first")
    if study_name is not None:
        finalists = []
    elif finalists is None:
        finalists = load_finalists(run_dir)
    if finalists:  # the verdict's best is the finalist with the best exact score
        best = next((r for r in trial_records(study) if r.number == finalists[0].trial), best)
    run_dir = study_dir(run_dir, study_name)
    frame.insert(0, "seed", config.seed)
    table = frame.to_csv(index=False)
    front = pareto_front(study)
    summary = best_summary(best, config, provenance)
    if finalists:
        summary["finalists"] = [asdict(f) for f in finalists]
    text = completeness(study, frame) + verdict(summary, frame, front)
    if not write:
        return RunReport(run_dir, summary, pd.read_csv(io.StringIO(table)), text)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / TRIALS_TABLE, table)
    write_text_atomic(run_dir / BEST_FILE, json.dumps(summary, indent=2))
    write_text_atomic(run_dir / SUMMARY_FILE, text)
    plot_convergence(frame, run_dir / CONVERGENCE_PLOT)
    plot_alpha_vs_r_draft(frame, front, run_dir / ALPHA_PLOT)
    plot_skip_frequency(frame, best.num_layers, run_dir / SKIP_FREQUENCY_PLOT)
    plot_speedup_vs_gamma(best, run_dir / SPEEDUP_PLOT)
    return RunReport(run_dir, summary, pd.read_csv(io.StringIO(table)), text)  # as trials.csv reads


def _check_study_named(run_dir: Path, study_name: str | None) -> None:
    """A compare directory holds one study per strategy and seed, and no report of its own: its
    report names one (`--study`), listed here when it is missing."""
    from skipsearch.config import load_run_file

    if study_name is not None or load_run_file(run_dir / RUN_FILE)[2] is None:
        return
    import optuna

    from skipsearch.search.study import journal_storage

    names = optuna.study.get_all_study_names(journal_storage(run_dir))
    raise ConfigError(
        f"{run_dir} is a `skipsearch compare`, one study per strategy and seed: pick one with --study NAME "
        f"({', '.join(names) or 'none yet'})"
    )


def best_summary(best: TrialRecord, config: RunConfig, provenance: dict) -> dict:
    details = dict(best.details)
    return {
        "model": config.measure.model,
        "mask": best.mask,
        "draft_vocab": details.get("draft_vocab", FULL_VOCAB),
        "score_by_draft_vocab": details.get("score_by_draft_vocab"),
        "kv": details.get("kv", FULL_KV),
        "score_by_kv": details.get("score_by_kv"),
        "tree": details.get("tree"),
        "score_by_tree": details.get("score_by_tree"),
        "tree_verify_steps": details.get("tree_verify_steps"),
        "num_layers": best.num_layers,
        "skipped_attn": details.get("skipped_attn"),
        "skipped_mlp": details.get("skipped_mlp"),
        "gamma_best": best.gamma_best,
        "objective": config.objective,
        "cost": config.cost,
        "score": best.score,
        "speedup_by_gamma": {str(g): v for g, v in best.per_gamma.items()},
        "predicted_speedup": {
            "closed_form": details.get("speedup_closed_form"),
            "calibrated": details.get("speedup_calibrated"),
        },
        "r_draft": best.r_draft,
        "r_reuse": details.get("r_reuse"),
        "acceptance": {
            "alpha": details.get("alpha"),
            "sampling_acceptance": details.get("sampling_acceptance"),
            "temperature": config.temperature,
            "tokens_per_round": {
                str(g): details.get(f"tokens_per_round_{g}") for g in range(1, len(best.per_gamma) + 1)
            },
        },
        "estimator_mode": config.measure.mode,
        "trial": best.number,
        "strategy": config.strategy,
        "seed": config.seed,
        "budget": config.budget,
        **provenance,
    }
