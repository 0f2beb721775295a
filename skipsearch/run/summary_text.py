"""The run's summary in words (`summary.md`): the best draft, where its gain comes from, the
finalists' exact re-scores and the verdict on whether SSD pays off (`cost.verdict` judges; this
module says it). Pure: reads best.json's content and the trials table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from skipsearch.cost.verdict import PAYS_OFF, Verdict, judge
from skipsearch.masks import FULL_KV, FULL_VOCAB, readable
from skipsearch.search.results import TrialRecord
from skipsearch.store import DRAFT_VOCAB_FILE
from skipsearch.tree_shapes import as_tree

if TYPE_CHECKING:
    import optuna


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


def verdict_of(summary: dict) -> Verdict:
    """The verdict on a run's best draft (`cost.verdict.judge`), from its best.json: the cost model
    the run ranked with (the one the progress bar showed), or, where the finalists were re-scored
    exactly (`run.finalists`), the best one's exact score."""
    finalists = summary.get("finalists") or []
    best = finalists[0] if finalists else {}
    return judge(summary["cost"], summary["predicted_speedup"], best.get("exact_score"), best.get("gamma"))


def judged_by(verdict: Verdict) -> str:
    """By what the verdict judged: the cost model, named, and the exact re-score where there was one."""
    by = {
        "closed-form": "by the closed-form cost model",
        "calibrated": "by the cost model calibrated on this device",
    }[verdict.cost]
    if verdict.exact_gamma is not None:
        by += f", re-scored exactly (rounds estimator at γ = {verdict.exact_gamma})"
    return by


def verdict_sentence(verdict: Verdict) -> str:
    """Whether SSD pays off at all, in one sentence (`cost.verdict`)."""
    best_speed, by = verdict.speedup, judged_by(verdict)
    if verdict.pays:
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
            else "no sub-layer skipped: the draft differs by its precision, vocabulary or KV pattern"
        )
        + "):",
        "",
        f"    {readable(summary['mask'])}",
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
    lines.append(verdict_sentence(verdict_of(summary)))
    lines.extend(precision_lines(summary, frame))
    lines.append("")
    return "\n".join(lines)


def precision_verdict(summary: dict, frame: pd.DataFrame) -> tuple[str, str, Verdict] | None:
    """The best-scored draft that reads some weights at int8 or int4 (mask, precision) and the
    verdict on it (`cost.verdict.judge`, by the cost model the run ranked with); None where the
    run scored none."""
    if "precision" not in frame or frame["precision"].isna().all():
        return None
    rows = frame[frame["precision"].notna()]
    best = rows.loc[rows["score"].idxmax()]
    predicted = {
        key: None if pd.isna(best.get(f"speedup_{key}")) else float(best[f"speedup_{key}"])
        for key in ("closed_form", "calibrated")
    }
    return readable(str(best["mask"])), str(best["precision"]), judge(summary["cost"], predicted)


def precision_lines(summary: dict, frame: pd.DataFrame) -> list[str]:
    """Whether a draft at lower precision pays, in one sentence after the verdict (empty where the
    run scored none): the best one's mask and its predicted speedup against `PAYS_OFF`."""
    found = precision_verdict(summary, frame)
    if found is None:
        return []
    mask, precision, judged = found
    pays = "pays" if judged.pays else f"does not pay (below {PAYS_OFF}x)"
    return [
        "",
        f"The best draft at lower precision ({precision}), `{mask}`, {pays}: {judged.speedup:.2f}x "
        f"predicted {judged_by(judged)}.",
    ]


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
            f"| `{readable(f['mask'])}` | {f['draft_vocab']} | {f.get('kv', FULL_KV)} | {f['gamma']} | "
            f"{f['search_score']:.3f} | {f['exact_score']:.3f} | {rounds} |"
        )
    return lines
