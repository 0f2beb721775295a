"""Tables and plots of a run directory, rebuilt from its study journal and `run.yaml` alone.

Pure read of the run directory (no model), so a copied run can be reported anywhere:
`trials.csv`, `best.json`, `summary.md` and four plots.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.masks import FULL_KV, FULL_VOCAB
from skipsearch.run.finalists import load_finalists
from skipsearch.search import best_trial, load_study, pareto_front, study_trials_frame
from skipsearch.search.results import TrialRecord, trial_records
from skipsearch.store import (
    ALPHA_PLOT,
    BEST_FILE,
    COMPARISON_SUMMARY,
    COMPARISON_TABLE,
    CONVERGENCE_PLOT,
    DRAFT_VOCAB_FILE,
    RUN_FILE,
    SKIP_FREQUENCY_PLOT,
    SPEEDUP_PLOT,
    STUDIES_DIR,
    SUMMARY_FILE,
    TRIALS_TABLE,
    atomic_path,
    write_text_atomic,
)
from skipsearch.tree_shapes import as_tree

if TYPE_CHECKING:
    import optuna

PAYS_OFF = 1.05  # below this predicted speedup, overheads the model ignores eat the gain


def study_dir(run_dir: Path, study_name: str | None) -> Path:
    """Where the report of one study goes: the run directory itself for a run's own study, or
    `studies/<name>/` for one study of a `compare` directory."""
    return run_dir if study_name is None else run_dir / STUDIES_DIR / study_name


def write_run_outputs(run_dir: Path, study_name: str | None = None) -> dict:
    """Rewrite every report file of `run_dir` (of its study `study_name` in `study_dir`, for a
    `compare` directory); return best.json's content."""
    config, provenance = RunConfig.load(run_dir / RUN_FILE)
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
    finalists = load_finalists(run_dir) if study_name is None else []
    if finalists:  # the verdict's best is the finalist with the best exact score
        best = next((r for r in trial_records(study) if r.number == finalists[0].trial), best)
    run_dir = study_dir(run_dir, study_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    frame.insert(0, "seed", config.seed)
    write_text_atomic(run_dir / TRIALS_TABLE, frame.to_csv(index=False))
    front = pareto_front(study)
    summary = best_summary(best, config, provenance)
    if finalists:
        summary["finalists"] = [asdict(f) for f in finalists]
    write_text_atomic(run_dir / BEST_FILE, json.dumps(summary, indent=2))
    write_text_atomic(run_dir / SUMMARY_FILE, completeness(study, frame) + verdict(summary, frame, front))
    plot_convergence(frame, run_dir / CONVERGENCE_PLOT)
    plot_alpha_vs_r_draft(frame, front, run_dir / ALPHA_PLOT)
    plot_skip_frequency(frame, best.num_layers, run_dir / SKIP_FREQUENCY_PLOT)
    plot_speedup_vs_gamma(best, run_dir / SPEEDUP_PLOT)
    return summary


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


COST_LABELS = {"closed-form": "closed form", "calibrated": "calibrated on this device"}


def predicted_speedups(summary: dict) -> str:
    """Both predictions, each labelled, the one the run ranked by first and marked so."""
    speed = summary["predicted_speedup"]
    ranked = summary["cost"]
    labelled = {cost: speed[cost.replace("-", "_")] for cost in COST_LABELS}
    order = [ranked, *(c for c in labelled if c != ranked)]
    parts = [
        f"{labelled[c]:.3f}x {COST_LABELS[c]}"
        + (" (the cost model this run ranked by)" if c == ranked else "")
        for c in order
        if labelled[c] is not None
    ]
    return ", ".join(parts)


def completeness(study: optuna.Study, frame: pd.DataFrame) -> str:
    """A first line for a study stopped short of its budget (a run killed part-way), so its
    verdict is not read as final; '' for a finished one, or one whose strategy ran out of masks."""
    budget = study.user_attrs.get("budget")
    measured = int((~frame["repeat"].astype(bool)).sum())
    if budget is None or measured >= budget or study.user_attrs.get("exhausted"):
        return ""
    return f"**incomplete: {measured} of {budget} masks measured; `--resume` to finish**\n\n"


def verdict_score(summary: dict) -> tuple[float, str]:
    """The best draft's speedup the verdict judges by, and by what: the cost model the run ranked
    with (the one the progress bar showed), named, or, where the finalists were re-scored exactly
    (`run.finalists`), their exact score."""
    cost = summary["cost"]
    best_speed = summary["predicted_speedup"][cost.replace("-", "_")]
    by = {
        "closed-form": "by the closed-form cost model",
        "calibrated": "by the cost model calibrated on this device",
    }[cost]
    finalists = summary.get("finalists") or []
    if finalists:
        best_speed = finalists[0]["exact_score"]
        by += f", re-scored exactly (rounds estimator at γ = {finalists[0]['gamma']})"
    return best_speed, by


def verdict_sentence(summary: dict) -> str:
    """Whether SSD pays off at all, in one sentence (`verdict_score`)."""
    best_speed, by = verdict_score(summary)
    if best_speed >= PAYS_OFF:
        return (
            f"SSD pays off for this model on these prompts: about {best_speed:.2f}x predicted {by} "
            "with the mask above."
        )
    return (
        f"SSD does not pay off here: the best speedup predicted {by} is {best_speed:.2f}x, below "
        f"{PAYS_OFF}x, so the overheads the cost model leaves out (sampling, cache bookkeeping) would eat "
        'the gain. Why, and what to try: docs/theory.md, section "When SSD does not pay".'
    )


def verdict(summary: dict, frame: pd.DataFrame, front: list[TrialRecord]) -> str:
    """A plain-words verdict: the best configuration, and whether SSD pays off at all
    (`verdict_sentence`)."""
    finalists = summary.get("finalists") or []
    acceptance = summary["acceptance"]
    lines = [
        f"# skipsearch run: {summary['model']}",
        "",
        f"Best mask, {round_words(summary)} ("
        + (
            f"attention skipped at {summary['skipped_attn']}, MLP at {summary['skipped_mlp']}"
            if summary["skipped_attn"] != [] or summary["skipped_mlp"] != []
            else "no layer skipped: the draft differs by its vocabulary or KV pattern only"
        )
        + "):",
        "",
        f"    {summary['mask']}",
        *(
            []
            if summary.get("draft_vocab", FULL_VOCAB) == FULL_VOCAB
            else [f"drafting from the {summary['draft_vocab']} most frequent token ids ({DRAFT_VOCAB_FILE})."]
        ),
        *(
            []
            if summary.get("kv", FULL_KV) == FULL_KV
            else [f'attending through the KV pattern {summary["kv"]} (docs/theory.md, "KV patterns").']
        ),
        "",
        f"- predicted speedup: {predicted_speedups(summary)}",
        *gain_lines(summary),
        *tree_lines(summary),
        f"- acceptance α = {acceptance['alpha']:.3f} (greedy), "
        f"{acceptance['sampling_acceptance']:.3f} sampling at T = {acceptance['temperature']}",
        f"- draft cost r_draft = {summary['r_draft']:.3f}, KV reuse r_reuse = {summary['r_reuse']:.3f}",
        f"- {int((~frame['repeat']).sum())} distinct masks measured ({summary['strategy']} strategy, seed "
        f"{summary['seed']}); Pareto front (speedup vs r_draft): {len(front)} masks",
        f"- {plan_line(summary)}",
        *finalist_lines(finalists, summary.get("estimator_mode", "shared-kv")),
        "",
        "## Verdict",
        "",
    ]
    lines.append(verdict_sentence(summary))
    lines.append("")
    return "\n".join(lines)


def plan_line(summary: dict) -> str:
    """The run's one-line kernel plan (`run.yaml` keeps the whole record: `skipsearch plan` prints
    it for this machine); a run from before the one-line form gives the start of its record."""
    line = summary.get("kernel_plan_line")
    if line:
        return line
    record = summary.get("kernel_plan")
    if not record:
        return "kernel plan: not recorded (a run from before plans were)"
    return f"kernel plan: {record[:100]}… (run.yaml)" if len(record) > 100 else f"kernel plan: {record}"


def round_words(summary: dict) -> str:
    """How the best draft's rounds go: a chain of γ tokens, or a token tree of its shape."""
    tree = as_tree(summary.get("tree"))
    if tree is not None:
        return f'drafting token trees {tree} (docs/theory.md, "Token trees")'
    return f"with draft length γ = {summary['gamma_best']}"


def tree_lines(summary: dict) -> list[str]:
    """Why a chain won where token trees were searched: what the verify of the best tree's rows
    costs on this device, in steps of one row (`tree_verify_steps`)."""
    scores, tree = summary.get("score_by_tree"), summary.get("tree")
    if not scores or tree is None or as_tree(tree) is not None or len(scores) < 2:
        return []
    rows, steps = summary.get("tree_verify_steps") or (None, None)
    cost = f": a verify of {rows} rows costs {steps:.2f} steps on this device" if rows else ""
    return [f"- the chain beats every token tree searched{cost}, more than the tree's extra tokens are worth"]


def gain_lines(summary: dict) -> list[str]:
    """Where the winner's gain comes from: its mask's best score with each draft vocabulary, each
    KV pattern and each token tree the run searched (absent for a dimension with one choice)."""
    dimensions = {"draft_vocab": "draft vocabulary", "kv": "KV pattern", "tree": "round shape"}
    parts = [
        f"{name} " + ", ".join(f"{label} {score:.3f}" for label, score in scores.items())
        for dimension, name in dimensions.items()
        if (scores := summary.get(f"score_by_{dimension}"))
    ]
    return [f"- the best mask's score with each {'; with each '.join(parts)}"] if parts else []


def finalist_lines(finalists: list[dict], mode: str) -> list[str]:
    """The finalists' table: search score against the exact re-score, best exact first."""
    if not finalists:
        return []
    lines = [
        "",
        f"Finalists re-scored exactly (rounds estimator at each one's γ; the search used {mode}):",
        "",
        "| mask | draft vocabulary | KV pattern | γ | search score | exact score "
        "| tokens/round search → exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in finalists:
        searched = f["search_tokens_per_round"]
        rounds = f"{'?' if searched is None else f'{searched:.3f}'} → {f['exact_tokens_per_round']:.3f}"
        lines.append(
            f"| `{f['mask']}` | {f['draft_vocab']} | {f.get('kv', FULL_KV)} | {f['gamma']} | "
            f"{f['search_score']:.3f} | {f['exact_score']:.3f} | {rounds} |"
        )
    return lines


def save_figure(fig: plt.Figure, path: Path) -> None:
    """Lay out, write atomically (a reader never sees half a PNG) and free the figure."""
    fig.tight_layout()
    with atomic_path(path) as staging:
        fig.savefig(staging, format="png", dpi=120)
    plt.close(fig)


def plot_convergence(frame: pd.DataFrame, path: Path) -> None:
    unique = frame[~frame["repeat"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(1, len(unique) + 1), unique["score"].cummax().to_numpy(), drawstyle="steps-post")
    ax.scatter(np.arange(1, len(unique) + 1), unique["score"], s=8, alpha=0.4)
    ax.set(xlabel="distinct masks evaluated", ylabel="score (best so far)", title="Convergence")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_alpha_vs_r_draft(frame: pd.DataFrame, front: list[TrialRecord], path: Path) -> None:
    unique = frame[~frame["repeat"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    points = ax.scatter(unique["r_draft"], unique["alpha"], c=unique["score"], cmap="viridis", s=14)
    fig.colorbar(points, ax=ax, label="score")
    on_front = unique[unique["mask"].isin({r.mask for r in front})]
    ax.scatter(
        on_front["r_draft"],
        on_front["alpha"],
        facecolors="none",
        edgecolors="red",
        s=60,
        label="Pareto front",
    )
    ax.set(xlabel="r_draft", ylabel="α (greedy)", title="Acceptance vs draft cost")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_skip_frequency(frame: pd.DataFrame, num_layers: int, path: Path) -> None:
    """How often each layer's attention / MLP is skipped among the top 10% trials."""
    unique = frame[~frame["repeat"]].sort_values("score", ascending=False)
    top = unique.head(max(1, len(unique) // 10))
    attn, mlp = np.zeros(num_layers), np.zeros(num_layers)
    for skipped_attn, skipped_mlp in zip(top["skipped_attn"], top["skipped_mlp"], strict=True):
        attn[list(skipped_attn)] += 1
        mlp[list(skipped_mlp)] += 1
    layers = np.arange(num_layers)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(layers - 0.2, attn / len(top), width=0.4, label="attention")
    ax.bar(layers + 0.2, mlp / len(top), width=0.4, label="MLP")
    ax.set(
        xlabel="layer",
        ylabel="share of top trials skipping it",
        title=f"Skip frequency, top {len(top)} trials",
    )
    ax.legend()
    save_figure(fig, path)


def plot_speedup_vs_gamma(best: TrialRecord, path: Path) -> None:
    gammas = sorted(best.per_gamma)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(gammas, [best.per_gamma[g] for g in gammas], marker="o")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="γ (draft length)", ylabel="predicted speedup", title=f"Best mask {best.mask}")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def write_compare_outputs(run_dir: Path, studies: list[tuple[str, int, str]]) -> pd.DataFrame:
    """comparison.csv / .md (best score and α per strategy, mean ± std over seeds, trials to
    reach 95% of the final best, model seconds) and convergence.png (best-so-far bands per strategy).

    Model seconds sum each distinct mask's measured evaluation time, including masks another study
    measured first (the shared cache stores their seconds): the time the strategy alone would take.
    """
    rows, curves = [], {}
    for strategy, seed, name in studies:
        frame = study_trials_frame(load_study(run_dir, name))
        unique = frame[~frame["repeat"]].reset_index(drop=True)
        best_so_far = unique["score"].cummax().to_numpy()
        final = best_so_far[-1]
        best_row = unique.loc[unique["score"].idxmax()]
        rows.append(
            {
                "strategy": strategy,
                "seed": seed,
                "best_score": final,
                "best_alpha": best_row["alpha"],
                "best_mask": best_row["mask"],
                "gamma_best": best_row["gamma_best"],
                "trials_to_95pct": int(np.argmax(best_so_far >= 0.95 * final)) + 1,
                "trials": len(unique),
                "model_seconds": float(unique["eval_seconds"].sum()),
            }
        )
        curves.setdefault(strategy, []).append(best_so_far)
    table = pd.DataFrame(rows)
    write_text_atomic(run_dir / COMPARISON_TABLE, table.to_csv(index=False))
    summary = table.groupby("strategy", sort=False).agg(
        best_mean=("best_score", "mean"),
        best_std=("best_score", "std"),
        best_max=("best_score", "max"),
        alpha_mean=("best_alpha", "mean"),
        trials_to_95pct=("trials_to_95pct", "mean"),
        model_seconds=("model_seconds", "mean"),
    )
    lines = [
        "| strategy | best speedup (mean ± std) | best max | α of best (mean) | trials to 95% | model s |",
        "|---|---|---|---|---|---|",
    ]
    for strategy, r in summary.iterrows():
        std = 0.0 if np.isnan(r.best_std) else r.best_std
        lines.append(
            f"| {strategy} | {r.best_mean:.3f} ± {std:.3f} | {r.best_max:.3f} | {r.alpha_mean:.3f} | "
            f"{r.trials_to_95pct:.1f} | {r.model_seconds:.0f} |"
        )
    write_text_atomic(run_dir / COMPARISON_SUMMARY, "\n".join(lines) + "\n")
    plot_strategy_convergence(curves, run_dir / CONVERGENCE_PLOT)
    return table


def plot_strategy_convergence(curves: dict[str, list[np.ndarray]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for strategy, runs in curves.items():
        length = min(len(c) for c in runs)
        stacked = np.stack([c[:length] for c in runs])
        x = np.arange(1, length + 1)
        ax.plot(x, stacked.mean(0), label=f"{strategy} (n={len(runs)})", drawstyle="steps-post")
        ax.fill_between(x, stacked.min(0), stacked.max(0), alpha=0.2, step="post")
    ax.set(xlabel="distinct masks evaluated", ylabel="best score so far", title="Strategies at equal budget")
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, path)
