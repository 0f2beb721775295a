"""Fidelity: does the estimator (both modes) and the cost model predict what the SSD engine does?

On the embedded model, for 12 masks (contiguous exits, single- and multi-layer sparse skips, an
attention-only and an MLP-only sub-layer mask) at γ = 3, greedy, on the same prompts for the
estimator and the engine:
- tokens per round and acceptance: the engine (`speculative_decode`) vs the teacher-forced
  estimator in `self` and `shared-kv` mode (docs/theory.md, "Measuring acceptance"), with the
  estimator's match vector also replayed under the engine's own end-of-output rule to separate end
  effects from KV effects, and the per-depth disagreement between engine and estimator on the
  positions a round judged;
- speedup: SSD over our autoregressive decoding, measured with the autoregressive runs
  interleaved between the SSD runs of each prompt, vs `cost.calibrated.predict` in closed form and
  calibrated with `results/profile/xeon-amx/smollm2-135m.json` (`--profile`: another machine's)
  (docs/theory.md, "Calibrated cost"), each fed by either estimator mode and by the engine's own
  tokens per round (which isolates the cost model).

Writes `results/fidelity/xeon-amx/` (`--out`): `fidelity.csv` (one row per mask), `errors.csv`,
`README.md` (error statistics, verdicts), `fidelity.png` (predicted vs measured, with y = x) and
`measurements.json`.
Run: `.venv/bin/python experiments/fidelity.py` (10.5 minutes on two idle cores, 15–22 shared with
other jobs; one torch thread, `--threads N`); `--report-only` redraws everything from
`measurements.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from _common import (
    MODEL,
    RESULTS,
    Setup,
    Stamp,
    configure,
    experiment_parser,
    fmt,
    load,
    markdown_table,
    stamp_line,
    write_csv,
)

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.bench.estimate import estimators
from skipsearch.bench.interleaved import EngineRuns, bracketed_runs
from skipsearch.bench.lossless import Tolerance, check_lossless, measure_tolerance
from skipsearch.cost.calibrated import Calibrated, predict
from skipsearch.cost.closed_forms import SelfSpeculative
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine import (
    Summary,
)
from skipsearch.masks import SkipMask
from skipsearch.validate.phases import decode_seconds, phase_costs, prefill_estimate
from skipsearch.validate.replay import (
    disagreement,
    engine_rounds_within,
    replay,
    round_stats,
    same_text_rounds,
    shared_length,
)
from skipsearch.validate.stats import ErrorStats

OUT = RESULTS / "fidelity" / "xeon-amx"
PROFILE = RESULTS / "profile" / "xeon-amx" / "smollm2-135m.json"
N_PROMPTS, NEW_TOKENS = 6, 64
GAMMA = 3
GAMMA_MAX = 8
AR_EVERY = 4  # an autoregressive run before every block of this many SSD runs of a prompt
TARGET = 3.0  # percent: the tokens-per-round fidelity target
MODES = ("shared-kv", "rounds", "self")
FORMS = ("closed", "calibrated")
MODE_STYLE = {"shared-kv": ("tab:blue", "o"), "rounds": ("tab:purple", "P"), "self": ("tab:orange", "s")}
FORM_STYLE = {"closed": ("tab:red", "^"), "calibrated": ("tab:green", "D")}

log = logging.getLogger("fidelity")


@dataclass(frozen=True)
class Case:
    """One mask of the sweep: a short label, the family it stands for and how to build it."""

    label: str
    kind: str
    build: Callable[[int], SkipMask]


CASES = (
    *(Case(f"exit {e}", "contiguous", lambda n, e=e: SkipMask.prefix(n, e)) for e in (10, 18, 24, 27)),
    *(
        Case(f"skip {layer}", f"single {where}", lambda n, layer=layer: SkipMask.from_layers(n, [layer]))
        for layer, where in ((3, "early"), (14, "middle"), (26, "late"))
    ),
    Case("skip 4,14", "multi sparse", lambda n: SkipMask.from_layers(n, [4, 14])),
    Case("skip 8,12,16,20,24", "multi sparse", lambda n: SkipMask.from_layers(n, [8, 12, 16, 20, 24])),
    Case("skip 20,22,24,26", "multi sparse", lambda n: SkipMask.from_layers(n, [20, 22, 24, 26])),
    Case("attn 10,16,22,28", "attention only", lambda n: SkipMask(n, attn=[10, 16, 22, 28])),
    Case("mlp 10,16,22,28", "MLP only", lambda n: SkipMask(n, mlp=[10, 16, 22, 28])),
)


# -- the engine, interleaved ---------------------------------------------------------------------


# -- estimator vs engine, position by position ---------------------------------------------------


def reference_rows(setup: Setup) -> list[int]:
    """Row of the ReferenceCache (sorted by length) holding each prompt."""
    reference = setup.estimator_data.estimator.reference
    ids, lengths = reference.input_ids.tolist(), reference.prompt_lengths.tolist()
    return [
        next(r for r, (row, n) in enumerate(zip(ids, lengths, strict=True)) if tuple(row[:n]) == prompt)
        for prompt in setup.prompts
    ]


def reference_continuations(setup: Setup, rows: Sequence[int]) -> list[tuple[int, ...]]:
    continuations = setup.estimator_data.estimator.reference.continuations()
    return [continuations[r] for r in rows]


# -- one row per mask ----------------------------------------------------------------------------


def lossless_columns(setup: Setup, runs: EngineRuns, label: str, tolerance: Tolerance) -> dict[str, Any]:
    """Whether every SSD decode of the mask equals autoregressive decoding up to near-ties within
    the measured tolerance (`bench.lossless`), and how many of each kind of divergence."""
    check = check_lossless(
        setup.runner,
        setup.prompts,
        [ar[0].tokens for ar in runs.ar],
        [r.tokens for r in runs.ssd[label]],
        tolerance=tolerance,
    )
    return {
        "lossless": check.passed,
        "near_ties": check.near_ties,
        "real_divergences": check.real_divergences,
    }


def mask_row(
    case: Case,
    mask: SkipMask,
    runs: EngineRuns,
    profiles: dict[str, AcceptanceProfile],
    rows: Sequence[int],
    setup: Setup,
    latency: LatencyProfile,
    context: float,
    continuations: Sequence[Sequence[int]],
) -> dict[str, Any]:
    """Everything measured and predicted for one mask at γ = GAMMA."""
    results = runs.ssd[case.label]
    summary = Summary.of(results)
    limits = [shared_length(r.tokens, c) for r, c in zip(results, continuations, strict=True)]
    within = [engine_rounds_within(r, limit) for r, limit in zip(results, limits, strict=True)]
    same_text_tpr, same_text_acc = round_stats([r for rounds, _ in within for r in rounds])
    prefills = [prefill_estimate([runs.ssd[label][i] for label in runs.ssd]) for i in range(len(rows))]
    ar_seconds = sum(
        statistics.fmean(decode_seconds(r, prefills[i]) for r in ar) for i, ar in enumerate(runs.ar)
    )
    ar_e2e = sum(statistics.fmean(r.seconds for r in ar) for ar in runs.ar)
    ar_tokens = sum(len(ar[0].tokens) for ar in runs.ar)
    ssd_seconds = sum(decode_seconds(r, 0.0) for r in results)
    full_rounds = [t for r in results for t in r.timings if t.gamma == GAMMA]
    closed = SelfSpeculative.from_mask(mask)
    calibrated = Calibrated(latency, mask, context)
    weights = latency.weights(context)
    row: dict[str, Any] = {
        "label": case.label,
        "kind": case.kind,
        "mask": str(mask),
        "s1": mask.first_divergent_layer,
        "r_draft": mask.r_draft(),
        "r_draft_time": mask.r_draft(weights),
        "r_reuse": closed.r_reuse,
        "gamma": GAMMA,
        "engine_rounds": summary.rounds,
        "engine_tokens_per_round": summary.tokens_per_round,
        "engine_acceptance": summary.acceptance,
        "engine_same_text_tokens_per_round": same_text_tpr,
        "engine_same_text_acceptance": same_text_acc,
        "same_text_share": sum(n for _, n in within) / sum(len(r.tokens) for r in results),
        "same_text_prompts": sum(n == len(r.tokens) for r, n in zip(results, limits, strict=True)),
    }
    for mode, profile in profiles.items():
        tpr = profile.tokens_per_round(GAMMA)
        replay_tpr, replay_acc = round_stats(
            [r for matches in profile.greedy_match for r in replay(matches, GAMMA, setup.spec.new_tokens)]
        )
        prediction = predict(profile, mask, GAMMA_MAX, latency, context)
        depth = disagreement(results, rows, limits, profile, GAMMA)
        matches = [profile.greedy_match[i] for i in rows]
        _, replayed, _ = same_text_rounds(matches, results, continuations, GAMMA, setup.spec.new_tokens)
        same_tpr, same_acc = round_stats(replayed)
        row |= {
            f"{mode}_same_text_tokens_per_round": same_tpr,
            f"{mode}_same_text_acceptance": same_acc,
            f"{mode}_tokens_per_round": tpr,
            f"{mode}_replay_tokens_per_round": replay_tpr,
            f"{mode}_acceptance": round_stats([(GAMMA, n) for n in profile.rounds(GAMMA)])[1],
            f"{mode}_replay_acceptance": replay_acc,
            f"{mode}_alpha_all_positions": profile.alpha,
            **{f"{mode}_disagree_depth{d + 1}": v for d, v in enumerate(depth)},
            f"{mode}_speedup_closed": prediction.closed_form[GAMMA - 1],
            f"{mode}_speedup_calibrated": prediction.calibrated[GAMMA - 1],
            f"{mode}_best_gamma_calibrated": prediction.best_calibrated.gamma,
            f"{mode}_best_speedup_calibrated": prediction.best_calibrated.speedup,
        }
    ar_step = ar_seconds / ar_tokens
    row |= {
        "ar_tokens_per_s": ar_tokens / ar_seconds,
        "ssd_tokens_per_s": summary.tokens / ssd_seconds,
        "speedup_end_to_end": ar_e2e / sum(r.seconds for r in results),
        "speedup_decode": ar_seconds / ssd_seconds,
        "round_cost_measured": statistics.fmean(t.total for t in full_rounds) / ar_step,
        "round_cost_closed": closed.round_cost(GAMMA),
        "round_cost_calibrated": calibrated.round_cost(GAMMA),
        **phase_costs(full_rounds, ar_step, closed, calibrated, GAMMA),
        "engineE_speedup_closed": summary.tokens_per_round / closed.round_cost(GAMMA),
        "engineE_speedup_calibrated": summary.tokens_per_round / calibrated.round_cost(GAMMA),
    }
    return row


# -- statistics, plot, report --------------------------------------------------------------------


# (quantity, how the estimate was made, its column after `<mode>_`, the engine's column)
PER_MODE = (
    ("tokens/round", "", "tokens_per_round", "engine_tokens_per_round"),
    ("tokens/round", ", engine end rule", "replay_tokens_per_round", "engine_tokens_per_round"),
    ("tokens/round", ", same text", "same_text_tokens_per_round", "engine_same_text_tokens_per_round"),
    ("acceptance", "", "acceptance", "engine_acceptance"),
    ("acceptance", ", same text", "same_text_acceptance", "engine_same_text_acceptance"),
)


def error_table(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, ErrorStats]]:
    """(quantity, prediction, stats) for every comparison the README reports."""

    def stats(predicted: str, measured: str) -> ErrorStats:
        return ErrorStats.of([r[predicted] for r in rows], [r[measured] for r in rows])

    table = [
        (quantity, f"{mode}{variant}", stats(f"{mode}_{predicted}", measured))
        for quantity, variant, predicted, measured in PER_MODE
        for mode in MODES
    ]
    for mode in MODES:
        for form in FORMS:
            table.append(("speedup", f"{mode} × {form}", stats(f"{mode}_speedup_{form}", "speedup_decode")))
    for form in FORMS:
        table.append(("speedup", f"engine E × {form}", stats(f"engineE_speedup_{form}", "speedup_decode")))
        table.append(("round cost", form, stats(f"round_cost_{form}", "round_cost_measured")))
    return table


def _diagonal(ax: plt.Axes, values: Sequence[float], band: float | None = None) -> None:
    low, high = min(values) * 0.95, max(values) * 1.05
    line = np.array([low, high])
    ax.plot(line, line, "k-", lw=1, label="y = x")
    if band is not None:
        ax.fill_between(line, line * (1 - band), line * (1 + band), color="0.85", label=f"±{band:.0%}")
    ax.set(xlim=(low, high), ylim=(low, high))


def save_plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(19, 6.6), layout="constrained")
    measured = [r["engine_tokens_per_round"] for r in rows]
    ax = axes[0]
    _diagonal(ax, measured + [r[f"{m}_tokens_per_round"] for r in rows for m in MODES], TARGET / 100)
    for mode in MODES:
        color, marker = MODE_STYLE[mode]
        predicted = [r[f"{mode}_tokens_per_round"] for r in rows]
        ax.scatter(measured, predicted, color=color, marker=marker, s=36, label=f"estimator {mode}", zorder=3)
    ordered = sorted(rows, key=lambda r: r["engine_tokens_per_round"])
    for index, r in enumerate(ordered):
        right = index % 2 == 0  # alternate sides so neighbouring labels do not overprint
        label = ax.annotate(
            r["label"],
            (r["engine_tokens_per_round"], r["shared-kv_tokens_per_round"]),
            fontsize=7,
            xytext=(6, -10) if right else (-6, 5),
            ha="left" if right else "right",
            textcoords="offset points",
        )
        label.set_in_layout(False)
    ax.set(
        xlabel="engine tokens / round (measured)",
        ylabel="estimator tokens / round (predicted)",
        title=f"Tokens per round, γ = {GAMMA}",
    )
    ax.legend(fontsize=8, loc="upper left")

    speedups = [r["speedup_decode"] for r in rows]
    ax = axes[1]
    shown = [r[f"{m}_speedup_{f}"] for r in rows for m in MODES for f in FORMS]
    _diagonal(ax, speedups + shown)
    for form in FORMS:
        color, marker = FORM_STYLE[form]
        for mode, fill in (("shared-kv", color), ("self", "none")):
            ax.scatter(
                speedups,
                [r[f"{mode}_speedup_{form}"] for r in rows],
                marker=marker,
                s=36,
                facecolors=fill,
                edgecolors=color,
                label=f"{form}, E from {mode}",
                zorder=3,
            )
    ax.set(
        xlabel="measured speedup (SSD / autoregressive, decode only)",
        ylabel="predicted speedup",
        title=f"Speedup at γ = {GAMMA}",
    )
    ax.legend(fontsize=8, loc="upper left")

    ax = axes[2]
    costs = [r["round_cost_measured"] for r in rows]
    _diagonal(ax, costs + [r[f"round_cost_{f}"] for r in rows for f in FORMS])
    for form in FORMS:
        color, marker = FORM_STYLE[form]
        ax.scatter(
            costs,
            [r[f"round_cost_{form}"] for r in rows],
            color=color,
            marker=marker,
            s=36,
            label=form,
            zorder=3,
        )
    ax.set(
        xlabel="measured round time / autoregressive step",
        ylabel="predicted round cost",
        title=f"Cost of one γ = {GAMMA} round (the cost model alone)",
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    rows: Sequence[dict[str, Any]], errors: list[tuple[str, str, ErrorStats]], meta: dict[str, Any]
) -> str:
    by = {(quantity, label): stats for quantity, label, stats in errors}
    tpr = {mode: by["tokens/round", f"{mode}, same text"] for mode in MODES}
    default = min(MODES, key=lambda mode: (tpr[mode].mean_abs, mode != "shared-kv"))
    met = {mode: tpr[mode].max_abs <= TARGET for mode in MODES}
    share = statistics.fmean(r["same_text_share"] for r in rows)
    contiguous = [r for r in rows if r["kind"] == "contiguous"]
    sparse = [r for r in rows if r["kind"] != "contiguous"]
    depth = {
        mode: [statistics.fmean(r[f"{mode}_disagree_depth{d}"] for r in sparse) for d in range(1, GAMMA + 1)]
        for mode in MODES
    }
    mask_rows = [
        [
            r["label"],
            f"`{r['mask']}`",
            str(r["s1"]),
            fmt(r["engine_tokens_per_round"]),
            *(fmt(r[f"{m}_tokens_per_round"]) for m in MODES),
            fmt(r["engine_same_text_tokens_per_round"]),
            *(fmt(r[f"{m}_same_text_tokens_per_round"]) for m in MODES),
            f"{100 * r['same_text_share']:.0f}%",
            fmt(r["engine_acceptance"]),
            *(fmt(r[f"{m}_acceptance"]) for m in MODES),
            f"{'yes' if r['lossless'] else '**NO**'} ({r['near_ties']} near-ties)",
        ]
        for r in rows
    ]
    speed_rows = [
        [
            r["label"],
            fmt(r["speedup_decode"], ".2f"),
            fmt(r["speedup_end_to_end"], ".2f"),
            fmt(r["shared-kv_speedup_closed"], ".2f"),
            fmt(r["shared-kv_speedup_calibrated"], ".2f"),
            fmt(r["engineE_speedup_calibrated"], ".2f"),
            fmt(r["round_cost_measured"], ".2f"),
            fmt(r["round_cost_closed"], ".2f"),
            fmt(r["round_cost_calibrated"], ".2f"),
            f"{r['shared-kv_best_gamma_calibrated']} ({r['shared-kv_best_speedup_calibrated']:.2f})",
        ]
        for r in rows
    ]
    phase_rows = [
        [r["label"], *(_triple(r, part) for part in ("draft", "verify", "overhead", "round_cost"))]
        for r in rows
    ]
    error_rows = [stats.row(f"{quantity}: {label}") for quantity, label, stats in errors]
    lines = [
        f"# Fidelity: estimator and cost model vs the SSD engine — {MODEL}",
        "",
        f"Generated by `{' '.join(['experiments/fidelity.py', *meta.get('argv', [])])}`. "
        f"{meta['setup']}. Prompts: {len(meta['prompts'])} HumanEval "
        f"prompts ({', '.join(map(str, meta['prompts']))} tokens), {meta['new_tokens']} new tokens, greedy, "
        f"γ = {GAMMA}; the estimator's ReferenceCache is built from the same `PromptSpec`. "
        f"Latency profile: `{meta.get('profile', str(PROFILE.relative_to(RESULTS.parent)))}` "
        f"({meta['profile_threads']} threads), "
        f"priced at context {meta['context']:.0f}. {stamp_line(meta)}",
        "",
        "Engine tokens / round and acceptance come from one greedy decode per prompt and mask (they are "
        "deterministic). Speedup is SSD over our autoregressive decode of the same prompt, decode time "
        "only (the prefill, common to both, is removed; `end-to-end` keeps it); the autoregressive "
        f"decode of each prompt ran before every block of {AR_EVERY} SSD decodes, with the mask order "
        "rotating from prompt to prompt. Acceptance is counted as the engine counts it (accepted / "
        "judged drafts), for the estimator from its simulated rounds.",
        "",
        "## Error statistics (relative error, predicted vs measured, over the masks)",
        "",
        *markdown_table(ErrorStats.HEADER, error_rows),
        "",
        "`engine end rule`: the estimator's own match vector replayed with the engine's handling of the "
        "output's end (shrinking γ, no censoring) — what is left is the draft's K/V. `same text`: both "
        "counted only over the tokens where the SSD output still equals the reference continuation the "
        "estimator teacher-forces (in bf16 a near-tie flip, which the lossless check allows, sends the "
        f"engine onto another text; {100 * share:.0f}% of the output on average). `engine E × form`: "
        "the cost model fed with the engine's measured tokens / round, i.e. the cost model alone.",
        "",
        "## Verdict",
        "",
        f"- **Closest to the engine: `{default}`** — mean absolute tokens/round error "
        + "; ".join(f"`{m}` {tpr[m].mean_abs:.1f}% (bias {tpr[m].bias:+.1f}%)" for m in MODES)
        + ". Evaluation time per mask: "
        + "; ".join(f"`{m}` {meta['estimator_seconds_per_mask'][m]:.2f} s" for m in MODES)
        + f"; `rounds` took {statistics.fmean(meta['rounds_passes']):.1f} passes per mask on average "
        f"(at most {max(meta['rounds_passes'])}).",
        f"- **Within-{TARGET:.0f}% target for tokens/round, on the same text**: "
        + "; ".join(
            f"`{m}` {'met' if met[m] else 'not met'} (max {tpr[m].max_abs:.1f}%, "
            f"{tpr[m].within_3}/{tpr[m].n} masks within)"
            for m in MODES
        )
        + ".",
        f"- Contiguous exits (every mode is the same computation there): max error "
        f"{max(abs(_pct(r, 'shared-kv_tokens_per_round')) for r in contiguous):.1f}%. Sparse / sub-layer "
        f"masks: mean disagreement with the engine on judged drafts by depth 1..{GAMMA}: "
        + "; ".join(f"`{m}` " + " / ".join(f"{100 * v:.1f}%" for v in depth[m]) for m in MODES)
        + ".",
        "",
        *discussion(rows, meta),
        "",
        "## Per mask: tokens per round and acceptance (γ = 3)",
        "",
        *markdown_table(
            [
                "mask",
                "string",
                "s1",
                "engine E",
                *(f"{m} E" for m in MODES),
                "engine E, same text",
                *(f"{m} E, same text" for m in MODES),
                "same text",
                "engine acc",
                *(f"{m} acc" for m in MODES),
                "lossless",
            ],
            mask_rows,
        ),
        "",
        "## Per mask: speedup (SSD / autoregressive) and round cost (in autoregressive steps)",
        "",
        *markdown_table(
            [
                "mask",
                "measured",
                "end-to-end",
                "closed (shared-kv E)",
                "calibrated (shared-kv E)",
                "calibrated (engine E)",
                "round cost measured",
                "closed",
                "calibrated",
                "best γ calibrated",
            ],
            speed_rows,
        ),
        "",
        "## Per mask: one γ = 3 round by phase, in autoregressive steps (measured / calibrated / closed)",
        "",
        *markdown_table(["mask", "draft", "verify", "overhead", "round"], phase_rows),
        "",
        "![predicted vs measured](fidelity.png)",
        "",
    ]
    return "\n".join(lines)


def discussion(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """Why the numbers look the way they do, each claim computed from the measured rows."""
    follows = meta["follows_reference"]
    contiguous = [r for r in rows if r["kind"] == "contiguous"]
    sparse = [r for r in rows if r["kind"] != "contiguous"]
    broken = [r for r in rows if r["shared-kv_disagree_depth1"] > 0]
    over = [r for r in rows if abs(_pct(r, "shared-kv_tokens_per_round")) > TARGET]
    replay_gap = [_pct(r, "shared-kv_replay_tokens_per_round") for r in sparse]
    contiguous_max = max(abs(_pct(r, "shared-kv_tokens_per_round")) for r in contiguous)
    contiguous_replay = max(abs(_pct(r, "shared-kv_replay_tokens_per_round")) for r in contiguous)
    closed = statistics.fmean(r["round_cost_measured"] / r["round_cost_closed"] for r in rows)
    best = max(rows, key=lambda r: r["speedup_decode"])
    cost = ErrorStats.of([r["round_cost_calibrated"] for r in rows], [r["round_cost_measured"] for r in rows])
    engine_e = ErrorStats.of(
        [r["engineE_speedup_calibrated"] for r in rows], [r["speedup_decode"] for r in rows]
    )
    worst = max(rows, key=lambda r: abs(r["round_cost_calibrated"] / r["round_cost_measured"] - 1))
    depth1 = (
        "- `shared-kv` is exact at depth 1 by construction: it starts at the first layer with any skipped "
        "sub-layer (`SkipMask.first_skipped_layer`), so a first skip that is an MLP counts too"
    )
    if broken:
        depth1 += (
            "; yet the engine disagrees on depth-1 drafts for "
            + ", ".join(f"`{r['label']}` ({100 * r['shared-kv_disagree_depth1']:.1f}%)" for r in broken)
            + ": the engine drafts one position at a time and the estimator every position in one "
            "pass, which round differently in bf16 (the fp32 run of this experiment had none)"
        )
    else:
        depth1 += ", and the engine agrees on every depth-1 draft"
    beyond = ", ".join(f"`{r['label']}` {_pct(r, 'shared-kv_tokens_per_round'):+.1f}%" for r in over)
    sparse_bias = statistics.fmean(_pct(r, "shared-kv_tokens_per_round") for r in sparse)
    return [
        "## Why",
        "",
        f"- Trajectories: the engine's autoregressive output equals the reference continuation the "
        f"estimator teacher-forces on {sum(follows)}/{len(follows)} prompts. The SSD output follows it to "
        f"the end on {sum(r['same_text_prompts'] for r in rows)} of {len(rows) * len(follows)} "
        f"(mask, prompt) decodes and on {100 * statistics.fmean(r['same_text_share'] for r in rows):.0f}% "
        "of the tokens; the rest part at a numerical near-tie (allowed, and counted, by the lossless "
        "check), after which engine and estimator score different texts. The `same text` rows compare "
        "them only where they decode the same tokens.",
        f"- Contiguous exits are exact: max error {contiguous_max:.1f}%, {contiguous_replay:.1f}% once the "
        "estimator's rounds follow the engine's end rule (the estimator drops a censored last round, the "
        "engine shrinks γ). Both modes are one computation there: a prefix's K/V is the full model's.",
        depth1 + ".",
        "- What remains is the draft's K/V inside a round: from depth 2 on, the engine's draft attends to "
        "its own scratch K/V for the round's earlier drafts (layers ≥ s1), while `shared-kv` gives it the "
        "full model's K/V there. That is the better context, so `shared-kv` is optimistic "
        f"(bias {sparse_bias:+.1f}% on sparse masks, {min(replay_gap):+.1f}% to {max(replay_gap):+.1f}% with "
        "the engine's end rule)"
        + (f"; beyond {TARGET:.0f}%: {beyond}" if over else "")
        + ". `self` errs the other way and by more: its draft reads its own K/V at *every* earlier "
        "position, which the engine never does (verify rewrites layers ≥ s1 with the full model's K/V).",
        f"- `rounds` closes that gap: its draft sees its own K/V from the start of each simulated round at "
        f"γ = {GAMMA} and the full model's before it, rounds iterated to a fixed point, which is what the "
        f"engine's draft sees. Disagreement with the engine on judged drafts, sparse masks, by depth: "
        + " / ".join(
            f"{100 * statistics.fmean(r[f'rounds_disagree_depth{d}'] for r in sparse):.1f}%"
            for d in range(1, GAMMA + 1)
        )
        + f"; tokens/round max error on the same text "
        f"{max(abs(_same_text_pct(r, 'rounds')) for r in rows):.1f}% "
        f"(`{max(rows, key=lambda r: abs(_same_text_pct(r, 'rounds')))['label']}`), on the whole "
        f"outputs {max(abs(_pct(r, 'rounds_tokens_per_round')) for r in rows):.1f}% "
        f"({max(abs(_pct(r, 'rounds_replay_tokens_per_round')) for r in rows):.1f}% with the engine's "
        "end rule). "
        "It is exact only at its γ: at other draft lengths its rounds are the wrong ones.",
        f"- Speedup: no mask beats autoregressive decoding on this CPU at γ = {GAMMA} (best "
        f"`{best['label']}` {best['speedup_decode']:.2f}×). The closed form prices a round at "
        f"{1 / closed:.2f}× its measured cost on average, so it overestimates every speedup: it counts "
        "layers, but a draft step also pays the LM head and the embedding, and a (γ+1)-position verify "
        "pass costs f(γ) steps (results/profile/epyc-avx512/c_vs_naive.md), not 1. "
        "The calibrated model prices both: "
        f"round cost within {cost.mean_abs:.1f}% on average (max {cost.max_abs:.1f}%, `{worst['label']}`), "
        f"speedup from the engine's tokens/round within {engine_e.mean_abs:.1f}%.",
    ]


def _triple(row: dict[str, Any], part: str) -> str:
    closed = row.get(f"{part}_closed", 0.0)
    return f"{row[f'{part}_measured']:.2f} / {row[f'{part}_calibrated']:.2f} / {closed:.2f}"


def _same_text_pct(row: dict[str, Any], mode: str) -> float:
    engine = row["engine_same_text_tokens_per_round"]
    return 100.0 * (row[f"{mode}_same_text_tokens_per_round"] - engine) / engine


def _pct(row: dict[str, Any], key: str) -> float:
    return 100.0 * (row[key] - row["engine_tokens_per_round"]) / row["engine_tokens_per_round"]


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Estimator profiles of every mask in both modes, then the interleaved engine runs."""
    setup_line = configure(args.threads)
    stamp = Stamp()
    spec = PromptSpec("humaneval", args.n_prompts, max_prompt_tokens=512, new_tokens=args.new_tokens)
    setup = load(spec, "shared-kv")
    latency = LatencyProfile.load(args.profile)
    masks = {case.label: case.build(setup.runner.num_layers) for case in CASES}
    rows_index = reference_rows(setup)
    modes = {e.mode: e for e in estimators(setup.estimator_data)}
    shared = modes["shared-kv"]
    modes["rounds"] = Estimator(shared.runner, shared.reference, "rounds", round_gamma=GAMMA)
    profiles: dict[str, dict[str, AcceptanceProfile]] = {label: {} for label in masks}
    seconds = {mode: 0.0 for mode in MODES}
    for mode in MODES:  # mode by mode, so each one's evaluation time is its own
        for label, mask in masks.items():
            began = time.perf_counter()
            profiles[label][mode] = modes[mode].evaluate(mask, 0.0)
            seconds[mode] += time.perf_counter() - began
    runs = bracketed_runs(
        setup.runner, setup.prompts, masks, GAMMA, setup.spec.new_tokens, setup.eos_ids, AR_EVERY
    )
    # Lossless as the decode judges it: in bf16 a flip at a numerical near-tie is allowed, within
    # the logit gap measured between 1- and γ+1-position passes on these outputs.
    tolerance = measure_tolerance(setup.runner, setup.prompts, [ar[0].tokens for ar in runs.ar], GAMMA + 1)
    continuations = reference_continuations(setup, rows_index)
    follows = [ar[0].tokens == c for ar, c in zip(runs.ar, continuations, strict=True)]
    context = statistics.fmean(len(p) for p in setup.prompts) + spec.new_tokens / 2
    rows = [
        mask_row(
            case,
            masks[case.label],
            runs,
            profiles[case.label],
            rows_index,
            setup,
            latency,
            context,
            continuations,
        )
        | lossless_columns(setup, runs, case.label, tolerance)
        for case in CASES
    ]
    meta = {
        "setup": setup_line,
        "prompts": [len(p) for p in setup.prompts],
        "new_tokens": spec.new_tokens,
        "profile_threads": latency.meta.get("threads"),
        "profile": os.path.relpath(args.profile, RESULTS.parent),
        "argv": sys.argv[1:],
        "context": context,
        "follows_reference": follows,
        "tolerance": tolerance.to_dict(),
        "estimator_seconds_per_mask": {mode: seconds[mode] / len(masks) for mode in MODES},
        "rounds_passes": modes["rounds"].passes,
        **stamp.finish(),
    }
    return rows, meta


def main() -> None:
    parser = experiment_parser(__doc__, OUT)
    parser.add_argument("--n-prompts", type=int, default=N_PROMPTS, help="HumanEval prompts")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens per decode")
    parser.add_argument("--profile", type=Path, default=PROFILE, help="the latency profile to price with")
    args = parser.parse_args()
    saved = args.out / "measurements.json"
    if args.report_only:
        data = json.loads(saved.read_text())
        rows, meta = data["rows"], data["meta"]
    else:
        rows, meta = measure(args)
        args.out.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"rows": rows, "meta": meta}, indent=1))
    errors = error_table(rows)
    write_csv(args.out / "fidelity.csv", rows)
    write_csv(args.out / "errors.csv", [{"quantity": q, "prediction": p, **vars(s)} for q, p, s in errors])
    title = (
        f"{MODEL}: estimator and cost model vs the SSD engine ({len(rows)} masks, "
        f"{len(meta['prompts'])} HumanEval prompts × {meta['new_tokens']} tokens, greedy)"
    )
    save_plot(rows, args.out / "fidelity.png", title)
    (args.out / "README.md").write_text(report(rows, errors, meta))
    logging.getLogger("fidelity").info("wrote %s", args.out)


if __name__ == "__main__":
    main()
