"""How the best mask changes between a 128- and a 2,048-token context (issue 13; docs/theory.md,
"Scoring context").

Arithmetic only, no model and no timing: every distinct mask the committed SmolLM2 comparison
measured (`results/compare/smollm2-135m/*-s*.csv`, its tokens per round at γ = 1..8) is re-scored
with the committed CPU profile (`results/profile/profile.json`) at each context, exactly as
`skipsearch run --context N --cost calibrated` would score it: `S(γ) = E(γ) × step / round`, best γ.
Attention time grows with context and MLP time does not, so masks whose skips save more attention
time should gain at long context.

Writes `results/context/smollm2-135m/`: context_shift.csv (every mask at both contexts) and
context_shift.md (the top masks at each context, with the share of the full model's attention and
MLP time each skips).

Run: `.venv/bin/python experiments/context_shift.py` (seconds).

`--sublayer` first searches the sub-layer space, where attention and MLP can be skipped apart:
`skipsearch run --space sublayer --strategy knapsack+tpe --cost calibrated --context N` for each
context (the knapsack's item weights are the profile's sub-layer times at that context, so the two
searches propose different masks), then re-scores the union of their masks at both contexts the
same way. Writes `results/context/smollm2-135m-sublayer/`; run directories stay in
`runs/context/` (`--resume` continues them). About 4 minutes on two idle cores at `--budget 40`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from _cli import skipsearch
from _common import fmt, markdown_table
from compare_strategies import PROMPTS

from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.closed_forms import best_of
from skipsearch.cost.latency import LatencyProfile
from skipsearch.masks import SkipMask

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
CONTEXTS = (128, 2048)
GAMMAS = range(1, 9)
TOP = 5


def measured_masks() -> pd.DataFrame:
    """One row per distinct mask with its tokens per round, from every committed study table."""
    return distinct(sorted((ROOT / "results" / "compare" / MODEL).glob("*-s*.csv")))


def sublayer_masks(budget: int) -> pd.DataFrame:
    """One sub-layer search per context (its trials.csv), then their masks, each once."""
    tables = []
    for context in CONTEXTS:
        out = ROOT / "runs" / "context" / f"sublayer-{context}"
        args = ["run", "--model", MODEL, "--space", "sublayer", "--strategy", "knapsack+tpe"]
        args += ["--budget", str(budget), "--cost", "calibrated", "--context", str(context), *PROMPTS]
        args += ["--out", str(out), *(["--resume"] if out.exists() else [])]
        if skipsearch(args) != 0:
            raise SystemExit(f"the sub-layer search at context {context} failed")
        tables.append(out / "trials.csv")
    return distinct(tables)


def distinct(tables: list[Path]) -> pd.DataFrame:
    frame = pd.concat([pd.read_csv(path) for path in tables], ignore_index=True)
    return frame[~frame["repeat"]].drop_duplicates("mask").reset_index(drop=True)


def rescore(frame: pd.DataFrame, latency: LatencyProfile) -> pd.DataFrame:
    rows = []
    for _, trial in frame.iterrows():
        mask = SkipMask.parse(trial["mask"], int(trial["num_layers"]))
        row = {"mask": trial["mask"], "alpha": trial["alpha"], "skipped_layers": len(mask.skipped_layers)}
        for context in CONTEXTS:
            form = Calibrated(latency.for_context(context), mask, context)
            curve = [trial[f"tokens_per_round_{g}"] / form.round_cost(g) for g in GAMMAS]
            best = best_of(curve)
            weights = latency.weights(context)
            row |= {
                f"speedup_{context}": best.speedup,
                f"gamma_{context}": best.gamma,
                f"attn_share_skipped_{context}": sum(weights.attn[i] for i in mask.attn) / weights.total,
                f"mlp_share_skipped_{context}": sum(weights.mlp[i] for i in mask.mlp) / weights.total,
            }
        rows.append(row)
    return pd.DataFrame(rows)


def report(scored: pd.DataFrame, latency: LatencyProfile, source: str) -> str:
    lines = [
        f"# Best mask by context: {MODEL}, calibrated cost ({latency.meta.get('device', '?')} profile)",
        "",
        f"{len(scored)} distinct masks measured by {source}, re-scored "
        f"at contexts {CONTEXTS[0]} and {CONTEXTS[1]} with `results/profile/profile.json`.",
        "",
    ]
    for context in CONTEXTS:
        other = CONTEXTS[1] if context == CONTEXTS[0] else CONTEXTS[0]
        top = scored.sort_values(f"speedup_{context}", ascending=False).head(TOP)
        rows = [
            [
                f"`{r['mask']}`",
                fmt(r["alpha"]),
                fmt(r[f"speedup_{context}"]),
                str(r[f"gamma_{context}"]),
                fmt(r[f"speedup_{other}"]),
                fmt(r[f"attn_share_skipped_{context}"]),
                fmt(r[f"mlp_share_skipped_{context}"]),
            ]
            for _, r in top.iterrows()
        ]
        header = [
            "mask",
            "α",
            f"S @ {context}",
            "γ*",
            f"S @ {other}",
            "attn time skipped",
            "MLP time skipped",
        ]
        lines += [f"## Top {TOP} at context {context}", "", *markdown_table(header, rows), ""]
    best = {c: scored.loc[scored[f"speedup_{c}"].idxmax()] for c in CONTEXTS}
    same = best[CONTEXTS[0]]["mask"] == best[CONTEXTS[1]]["mask"]
    attn = {c: latency.weights(c).attn for c in CONTEXTS}
    growth = sum(attn[CONTEXTS[1]]) / sum(attn[CONTEXTS[0]])
    lines += [
        "## What changes",
        "",
        f"- One decode step's attention time grows {growth:.2f}x from context {CONTEXTS[0]} to "
        f"{CONTEXTS[1]} in this profile; MLP time does not depend on context.",
        f"- The best mask is {'the same' if same else 'different'} at the two contexts: "
        f"`{best[CONTEXTS[0]]['mask']}` at {CONTEXTS[0]}, `{best[CONTEXTS[1]]['mask']}` at {CONTEXTS[1]}.",
        f"- Mean share of the step's time the top {TOP} skip, attention / MLP: "
        + "; ".join(
            f"at {c}: {top_mean(scored, c, 'attn'):.3f} / {top_mean(scored, c, 'mlp'):.3f}" for c in CONTEXTS
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def top_mean(scored: pd.DataFrame, context: int, part: str) -> float:
    top = scored.sort_values(f"speedup_{context}", ascending=False).head(TOP)
    return float(top[f"{part}_share_skipped_{context}"].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sublayer", action="store_true", help="search the sub-layer space at each context")
    parser.add_argument("--budget", type=int, default=40, help="masks per sub-layer search")
    args = parser.parse_args()
    latency = LatencyProfile.load(ROOT / "results" / "profile" / "profile.json")
    if args.sublayer:
        frame, out = sublayer_masks(args.budget), ROOT / "results" / "context" / f"{MODEL}-sublayer"
        source = (
            f"two sub-layer searches (`--space sublayer --strategy knapsack+tpe --budget {args.budget}`, "
            f"one at each `--context`)"
        )
    else:
        frame, out = measured_masks(), ROOT / "results" / "context" / MODEL
        source = "the committed comparison (sparse space: attention and MLP skipped together)"
    scored = rescore(frame, latency)
    out.mkdir(parents=True, exist_ok=True)
    scored.to_csv(out / "context_shift.csv", index=False)
    (out / "context_shift.md").write_text(report(scored, latency, source))
    print((out / "context_shift.md").read_text())


if __name__ == "__main__":
    main()
