"""The tables and plot of a compare directory: each strategy's best score and α, mean ± std over
seeds, trials to reach 95% of its final best and model seconds (`comparison.csv`, `.md`), and the
best-so-far bands per strategy (`convergence.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from skipsearch.run.plots import plot_strategy_convergence
from skipsearch.search import load_study, study_trials_frame
from skipsearch.store import COMPARISON_SUMMARY, COMPARISON_TABLE, CONVERGENCE_PLOT, write_text_atomic


def write_compare_outputs(run_dir: Path, studies: list[tuple[str, int, str]]) -> str:
    """comparison.csv / .md (best score and α per strategy, mean ± std over seeds, trials to
    reach 95% of the final best, model seconds) and convergence.png (best-so-far bands per strategy);
    returns the markdown table.

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
    text = "\n".join(lines) + "\n"
    write_text_atomic(run_dir / COMPARISON_SUMMARY, text)
    plot_strategy_convergence(curves, run_dir / CONVERGENCE_PLOT)
    return text
