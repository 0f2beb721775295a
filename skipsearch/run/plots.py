"""The plots of a run directory and of a compare, from its trials table (`run.report` and
`run.compare_tables` write them): each written atomically, so a reader never sees half a PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from skipsearch.run.pyplot import plt
from skipsearch.search.results import TrialRecord
from skipsearch.store import atomic_path


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
