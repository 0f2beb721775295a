"""Profile the embedded model (SmolLM2-135M) on this CPU: what a draft step really costs.

Writes `results/profile/epyc-avx512/` (the CPU it last ran on):
- `smollm2-135m.json`: the LatencyProfile (`skipsearch profile` format);
- `per_layer_cost.png`: per-layer attention and MLP time at each context length, the split of one
  step into embedding / attention / MLP / head, and the draft cost `c` against the naive `E / L`;
- `c_vs_naive.csv` and `.md`: `c` of the contiguous draft `[0, E)` for every exit `E` at each
  context length next to `E / L` (docs/theory.md, "Calibrated cost"), plus `f(γ)` and the round overhead.

Run: `.venv/bin/python experiments/profile_smollm2.py` (about four minutes on two idle cores);
`--replot` redraws the outputs from the saved profile without measuring.
"""

from __future__ import annotations

import argparse
import csv
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import markdown_table

from skipsearch.bench.latency_profiler import DEFAULT_REPEATS, save_profile
from skipsearch.bench.processes import DEFAULT_PROCESSES, profile_processes
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profile_summary import ProfileSummary, summary

MODEL = "smollm2-135m"
OUT = Path(__file__).resolve().parents[1] / "results" / "profile" / "epyc-avx512"
MS = 1e3
PARTS = ("embed", "attn", "mlp", "head")
PART_COLORS = {"embed": "tab:gray", "attn": "tab:blue", "mlp": "tab:orange", "head": "tab:red"}
PART_LABELS = {
    "embed": "embedding (+ rotary, mask)",
    "attn": "all attention",
    "mlp": "all MLP",
    "head": "final norm + LM head",
}

log = logging.getLogger("profile_smollm2")


def measure(repeats: int, processes: int) -> LatencyProfile:
    """Exactly what `skipsearch profile --model smollm2-135m` measures."""
    return profile_processes(MODEL, repeats=repeats, processes=processes)


# -- plot ----------------------------------------------------------------------------------------


def _context_colors(profile: LatencyProfile) -> list:
    return list(plt.cm.viridis(np.linspace(0.0, 0.8, len(profile.context_lengths))))


def plot_per_layer(ax: plt.Axes, profile: LatencyProfile) -> None:
    layers = np.arange(profile.num_layers)
    for i, (context, color) in enumerate(zip(profile.context_lengths, _context_colors(profile), strict=True)):
        attn = np.asarray(profile.attn)[:, i, 0] * MS
        mlp = np.asarray(profile.mlp)[:, i, 0] * MS
        ax.plot(layers, attn, "-o", ms=3, color=color, label=f"attention, context {context}")
        ax.plot(layers, mlp, "--s", ms=3, color=color, label=f"MLP, context {context}")
    ax.set(xlabel="layer", ylabel="median ms", title="Per-layer sub-layer time, 1 position (a draft step)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2, loc="lower left")


def plot_step_split(ax: plt.Axes, profile: LatencyProfile) -> None:
    """Stacked bars: one decode step (1 position) and a γ = 8 verify pass (9), per context length."""
    bars = [
        (context, k)
        for context in profile.context_lengths
        for k in (profile.positions[0], profile.positions[-1])
    ]
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for part in PARTS:
        heights = np.array([_part_time(profile, part, context, k) for context, k in bars]) * MS
        ax.bar(x, heights, bottom=bottom, color=PART_COLORS[part], label=PART_LABELS[part])
        bottom += heights
    ax.set_xticks(x, [f"{context}\n{k} pos" for context, k in bars], fontsize=8)
    ax.set(xlabel="context length / positions in the pass", ylabel="median ms", title="Where one pass goes")
    ax.legend(fontsize=8)


def _part_time(profile: LatencyProfile, part: str, context: int, positions: int) -> float:
    """Seconds of one part of a pass; attention and MLP summed over the layers."""
    return float(np.sum(getattr(profile.weights(context, positions), part)))


def plot_draft_cost(ax: plt.Axes, profile: LatencyProfile, digest: ProfileSummary) -> None:
    exits = np.array(digest.exits)
    ax.plot(exits, exits / digest.num_layers, "k:", label="naive E / L")
    for context, costs, color in zip(
        digest.context_lengths, digest.draft_cost, _context_colors(profile), strict=True
    ):
        ax.plot(exits, costs, "-", color=color, label=f"measured c, context {context}")
    ax.set(
        xlabel="exit layer E (draft = layers [0, E))",
        ylabel="draft step / full step",
        title="Draft cost c vs the closed forms' E / L",
        xlim=(0, digest.num_layers),
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=8)


def save_plot(profile: LatencyProfile, digest: ProfileSummary, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2), layout="constrained")
    plot_per_layer(axes[0], profile)
    plot_step_split(axes[1], profile)
    plot_draft_cost(axes[2], profile, digest)
    meta = profile.meta
    fig.suptitle(
        f"{meta['model']} on {meta['device']} ({meta['dtype']}, {meta['threads']} threads): "
        f"{meta['repeats']} interleaved samples over {meta.get('processes', 1)} processes"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- tables --------------------------------------------------------------------------------------


def write_csv(digest: ProfileSummary, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["exit", "naive_E_over_L", *(f"c_context_{c}" for c in digest.context_lengths)])
        for exit_layer in digest.exits:
            costs = (f"{row[exit_layer - 1]:.4f}" for row in digest.draft_cost)
            writer.writerow([exit_layer, f"{digest.naive(exit_layer):.4f}", *costs])


def write_markdown(profile: LatencyProfile, digest: ProfileSummary, path: Path) -> None:
    meta, contexts = profile.meta, digest.context_lengths
    first = contexts[0]
    step = profile.weights(first)
    c1 = digest.draft_cost[0][0]
    lines = [
        f"# Draft cost c vs E/L — {meta['model']} on {meta['device']} ({meta['dtype']})",
        "",
        f"Measured by `experiments/profile_smollm2.py`: torch {meta['torch']}, transformers "
        f"{meta['transformers']}, {meta['threads']} threads, {meta['repeats']} samples per entry over "
        f"{meta.get('processes', 1)} fresh processes (mean of their medians); "
        f"1-minute load average {meta['load_average']:.1f} at the end (the profiler's own threads "
        "count: more than that means other work shared the CPU).",
        "",
        f"`c` is the one-position step of the contiguous draft `[0, E)` — embedding, layers `< E`, "
        f"final norm + LM head — over a full step. At context {first} a full step takes "
        f"{step.total * MS:.1f} ms, of which the LM head is {step.head * MS:.1f} ms "
        f"({step.head / step.total:.0%}) and the embedding {step.embed * MS:.2f} ms: so a one-layer "
        f"draft costs c = {c1:.3f}, {c1 / digest.naive(1):.1f}× the naive 1/{digest.num_layers}. "
        "docs/theory.md, 'Calibrated cost': c is not L_draft/L.",
        "",
        "## c by exit layer",
        "",
    ]
    rows = [
        [str(e), f"{digest.naive(e):.3f}", *(f"{row[e - 1]:.3f}" for row in digest.draft_cost)]
        for e in digest.exits
    ]
    lines += markdown_table(["E", "E/L", *(f"c @ {c}" for c in contexts)], rows)
    lines += ["", "## Verify cost f(γ) = pass over γ+1 positions / one step", ""]
    rows = [[str(g), *(f"{row[i]:.3f}" for row in digest.verify_cost)] for i, g in enumerate(digest.gammas)]
    lines += markdown_table(["γ", *(f"f @ {c}" for c in contexts)], rows)
    lines += ["", "## Round overhead (sampling, acceptance, cache crop)", ""]
    rows = [
        [str(g), f"{s * MS:.3f}", f"{s / step.total:.4f}"] for g, s in sorted(profile.round_overhead.items())
    ]
    lines += markdown_table(["γ", "ms", f"/ step @ {first}"], rows)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="samples per entry")
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES, help="fresh processes")
    parser.add_argument("--replot", action="store_true", help="redraw from the saved profile")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    profile_path = OUT / "smollm2-135m.json"
    if args.replot:
        profile = LatencyProfile.load(profile_path)
    else:
        profile = measure(args.repeats, args.processes)
        save_profile(profile, profile_path)
    digest = summary(profile)
    save_plot(profile, digest, OUT / "per_layer_cost.png")
    write_csv(digest, OUT / "c_vs_naive.csv")
    write_markdown(profile, digest, OUT / "c_vs_naive.md")
    log.info("wrote %s", OUT)


if __name__ == "__main__":
    main()
