"""The report of experiments/sparse_kv.py: the table, the kernel plans and the crossover plot, from
`results/sparse_kv/results.json` alone."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _common import markdown_table

from skipsearch.masks import KVPattern, SkipMask, kv_label

DRAFTS = ("layer-only", "KV-only", "joint")


def write_report(results: dict, out: Path) -> None:
    rows, contexts = [], sorted(int(c) for c in results["contexts"])
    layers = int(results["profile"]["num_layers"])
    for context in contexts:
        found = results["contexts"][str(context)]
        for name in (n for n in DRAFTS if n in found):
            draft, measured = found[name], found["measured"][name]
            lossless = measured["lossless"]
            rows.append(
                [
                    str(context),
                    name,
                    _mask_and_vocab(draft, layers),
                    kv_label(KVPattern.parse(draft["kv"])),
                    str(draft["gamma"]),
                    f"{draft['predicted']:.3f}",
                    f"{measured['decode_only']:.3f}× ({measured['pairs'][0]:.2f}–{measured['pairs'][1]:.2f})",
                    f"{measured['tokens_per_round']:.2f}",
                    _breakdown(
                        measured, draft["gamma"], found["measured"].get("autoregressive_ms_per_token")
                    ),
                    _fidelity(found["fidelity"][name]),
                    f"{lossless.get('near_ties', 0)} near-ties, {lossless.get('real_divergences', 0)} real",
                ]
            )
    header = [
        "context",
        "draft",
        "mask (+ draft vocabulary)",
        "KV pattern",
        "γ",
        "predicted",
        "decode-only (pairs)",
        "tokens/round",
        "draft step · verify · AR step (ms)",
        "estimator / engine tokens/round on the measured prompts: text both decode (whole outputs)",
    ]
    lines = [
        f"# KV-pattern drafts against layer skipping by context: {results['model']}",
        "",
        f"`python experiments/sparse_kv.py` (see its docstring){_space(results)}. {results['load']}.",
        "",
        *markdown_table([*header, "lossless"], rows),
        "",
        *_plans(results, contexts),
        "",
        "![predicted and measured speedup by context](crossover.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    plot(results, contexts, out)


def _mask_and_vocab(draft: dict, layers: int) -> str:
    mask = "every layer" if draft["mask"] == str(SkipMask(layers)) else f"`{draft['mask']}`"
    vocab = draft.get("vocab", "full")
    return mask if vocab == "full" else f"{mask} + {int(vocab):,} ids"


def _space(results: dict) -> str:
    """The searched space, where the run recorded it (runs before KV pillars and vocabularies did
    not: they searched s4w{128,256,512,1024} with the full vocabulary)."""
    space = results.get("space")
    if space is None:
        return ", patterns s4w128,s4w256,s4w512,s4w1024, full vocabulary"
    searched = f"patterns {space['patterns']}, draft vocabularies {space['vocabs']}"
    return f", {searched}, {space['budget']} masks a search"


def _fidelity(found: dict) -> str:
    """`est / engine (±e%)` on the text both decode (share of the output), then whole outputs."""
    whole = f"{found['estimator']:.2f} / {found['engine']:.2f} ({100 * found['error']:+.1f}%)"
    same = found.get("same_text", {})
    if "error" not in same:
        return f"– ({whole})"
    return (
        f"{same['estimator']:.2f} / {same['engine']:.2f} ({100 * same['error']:+.1f}%, "
        f"{100 * same['share']:.0f}% of the text) ({whole})"
    )


def _plans(results: dict, contexts: list[int]) -> list[str]:
    """Which kernel plan predicted and which decoded: `--decode-only` decodes on today's plan
    without searching (or predicting) again, so the two may differ."""
    lines = [
        "- Predicted with the search's latency profile: "
        f"{results['profile'].get('kernel_plan_line', results['profile'].get('kernel_plan', 'n/a'))}."
    ]
    for context in contexts:
        measured = results["contexts"][str(context)]["measured"]
        plan = measured.get("plan_line", measured.get("plan", "not recorded by this run"))
        lines.append(f"- Decoded at {context} tokens on: {plan}.")
    return lines


def _breakdown(measured: dict, gamma: int, ar_ms: float | None) -> str:
    """A round's draft step and verify against the autoregressive step, in ms."""
    if "round_ms" not in measured or ar_ms is None:
        return "–"
    phases = measured["round_ms"]
    return f"{phases['draft'] / gamma:.1f} · {phases['verify']:.1f} · {ar_ms:.1f}"


def plot(results: dict, contexts: list[int], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, colour in zip(DRAFTS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
        have = [c for c in contexts if name in results["contexts"][str(c)]]
        found = [results["contexts"][str(c)] for c in have]
        ax.plot(have, [f[name]["predicted"] for f in found], "--", color=colour, label=f"{name} predicted")
        ax.plot(
            have,
            [f["measured"][name]["decode_only"] for f in found],
            "o-",
            color=colour,
            label=f"{name} measured",
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="speedup over autoregressive (decode only)")
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # the log scale's own ticks overlap
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "crossover.png", dpi=120)
    plt.close(fig)
