"""Tier sets on the embedded model: the best tier set's simulated speedup next to the best single mask.

1. Two searches on smollm2-135m over the same prompts as compare_strategies (8 HumanEval prompts,
   48 new tokens): every contiguous exit (exhaustive) and sparse masks (learned, warm start).
   Run directories: `runs/tiers/<model>-contiguous` and `-sparse` (resumed when rerun).
2. The tier search over both runs' evaluated masks, no model work: for K = 2, 3, 4 a TPE study
   over the K masks, the policy's window and thresholds and a draft length per tier, each trial
   one simulation over the calibration trajectories. Closed-form cost, and calibrated with
   `results/profile/epyc-avx512/smollm2-135m.json` when it exists.
3. A held-out check: the same search on prompts 1-4 only, its best set scored on prompts 5-8.
4. `results/tiers/`: `tier_sets.csv`, `summary.md`, `tiers.json` (capture manifest of the best
   set; calibrated cost when profiled), `exports/` (`skipsearch export` of the contiguous run,
   which carries the tiers, `--format all`) and `decode.json` (`skipsearch decode --from
   tiers.json`: the tier set on the real engine, next to autoregressive and the best single mask).

Run: `.venv/bin/python experiments/tiers_smollm2.py [--trials 300] [--skip-decode]`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from _cli import skipsearch

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.cost.latency import LatencyProfile
from skipsearch.masks import SkipMask
from skipsearch.search.space_files import load_space
from skipsearch.search.tier_sets import (
    SIZES,
    TierSetResult,
    candidate_pool,
    load_profiles,
    search_run_tiers,
    search_tier_sets,
)
from skipsearch.store import TIERS_FILE
from skipsearch.tiers.simulation import CostModel, Tier, TierScorer, cost_model

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
PROMPTS = ["--n-prompts", "8", "--new-tokens", "48", "--max-prompt-tokens", "192"]
SEARCHES = {
    "contiguous": ["--space", "contiguous", "--strategy", "exhaustive", "--budget", "29"],
    "sparse": ["--space", "sparse", "--strategy", "learned", "--warm-start", "--budget", "40"],
}
DECODE = ["--n-prompts", "4", "--new-tokens", "32", "--max-prompt-tokens", "192", "--repeats", "1"]
LATENCY = ROOT / "results" / "profile" / "epyc-avx512" / "smollm2-135m.json"
log = logging.getLogger("tiers")


def search_runs(work: Path) -> list[Path]:
    runs = []
    for name, options in SEARCHES.items():
        run = work / f"{MODEL}-{name}"
        args = ["run", "--model", MODEL, *options, *PROMPTS, "--out", str(run)]
        if (run / "run.yaml").is_file():
            args.append("--resume")
        if skipsearch(args) != 0:
            raise SystemExit(f"skipsearch run {name} failed")
        runs.append(run)
    return runs


def subset(profiles: Mapping[str, AcceptanceProfile], rows: slice) -> dict[str, AcceptanceProfile]:
    """The same masks measured on a subset of the prompts."""
    return {
        key: AcceptanceProfile(p.mask, p.greedy_match[rows], p.sampling_accept[rows], p.temperature)
        for key, p in profiles.items()
    }


def held_out_gain(
    profiles: Mapping[str, AcceptanceProfile], num_layers: int, cost: CostModel, trials: int
) -> dict[str, float]:
    """Search on the first half of the prompts, score the winner and the best single mask on the
    second half: how much of the gain survives prompts the thresholds were not tuned on."""
    half = len(next(iter(profiles.values())).greedy_match) // 2
    train, test = subset(profiles, slice(None, half)), subset(profiles, slice(half, None))
    best = search_tier_sets(candidate_pool(train, num_layers, cost), cost, trials=trials)[0]
    tiers = [Tier(c.mask, test[str(c.mask)]) for c in best.tiers]
    score = TierScorer(tiers, cost).score(best.policy, best.score.gammas)
    single = max(candidate_pool(test, num_layers, cost), key=lambda c: c.speedup)
    return {
        "train_gain": best.gain,
        "held_out_speedup": score.speedup,
        "held_out_best_single": single.speedup,
        "held_out_gain": score.speedup / single.speedup - 1.0,
    }


def describe(mask: SkipMask) -> str:
    if mask.exit_layer is not None:
        return f"exit {mask.exit_layer}"
    return f"skip {','.join(map(str, sorted(mask.skipped_layers)))}"


def rows(cost_name: str, results: Sequence[TierSetResult]) -> list[dict]:
    return [
        {"cost": cost_name, **r.row(), "tiers": " / ".join(describe(c.mask) for c in r.tiers)}
        for r in results
    ]


def summary(
    table: pd.DataFrame,
    held_out: Mapping[str, Mapping[str, float]],
    pool_size: int,
    decoded: Mapping[str, Any] | None,
) -> str:
    lines = [
        f"# Tier sets on {MODEL}",
        "",
        f"{pool_size} candidate masks (best single masks and best early exits of two runs over 8 HumanEval "
        "prompts x 48 tokens); per tier count K a TPE study over masks, window, thresholds and a draft "
        "length per tier, each trial one simulation of the policy over the calibration trajectories. "
        "K counts the tiers a study's best set kept (tiers it never drafted with are dropped).",
        "",
        "| cost | K | tiers (richest first) | γ per tier | window | thresholds | simulated speedup | "
        "best single mask | gain | tier share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.cost} | {r.num_tiers} | {r.tiers} | {r.gammas} | {r.window} | "
            f"{[round(t, 2) for t in r.thresholds]} | {r.speedup:.3f} | {r.pool_best_speedup:.3f} | "
            f"{r.gain_over_pool_best:+.1%} | {r.tier_share} |"
        )
    lines += ["", "Held out (search on prompts 1-4, score on prompts 5-8):", ""]
    for cost_name, h in held_out.items():
        lines.append(
            f"- {cost_name}: gain {h['train_gain']:+.1%} in-sample, {h['held_out_gain']:+.1%} held out "
            f"({h['held_out_speedup']:.3f} vs best single {h['held_out_best_single']:.3f})"
        )
    if decoded is not None:
        lines += ["", *engine_lines(decoded)]
    return "\n".join(lines) + "\n"


def engine_lines(decoded: Mapping[str, Any]) -> list[str]:
    """The manifest on the real engine next to what the simulation predicted for it."""
    runs, predicted = decoded["summaries"], decoded["predicted"]
    tiers, single = runs["ssd-tiers"], runs["ssd-best-single"]
    return [
        f"Real engine (`skipsearch decode --from tiers.json`, {decoded['prompts']} prompts x "
        f"{decoded['max_new_tokens']} tokens, steps: {decoded['mode']}):",
        "",
        f"- lossless (greedy tier decoding == autoregressive): {decoded['lossless']}",
        f"- tokens per round: {tiers['tokens_per_round']:.3f} measured, {predicted['tokens_per_round']:.3f} "
        f"simulated; best single mask {single['tokens_per_round']:.3f}",
        f"- tier share: {[round(t, 2) for t in decoded['tier_share']]} measured, "
        f"{[round(t, 2) for t in predicted['tier_share']]} simulated",
        f"- speed vs autoregressive: tiers {tiers['speedup_vs_autoregressive']:.2f}x, best single "
        f"{single['speedup_vs_autoregressive']:.2f}x (wall clock on a CPU shared with other jobs: noisy)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300, help="TPE trials per tier count")
    parser.add_argument("--skip-decode", action="store_true", help="no real-engine decode (slow on CPU)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = ROOT / "results" / "tiers"
    out.mkdir(parents=True, exist_ok=True)
    runs = search_runs(ROOT / "runs" / "tiers")
    profiles, _, provenance = load_profiles(runs)
    num_layers = int(provenance["num_layers"])
    latency = LatencyProfile.load(LATENCY) if LATENCY.is_file() else None
    costs = {name: cost_model(name, latency) for name in ("closed-form", "calibrated")[: 1 + bool(latency)]}
    start = load_space("tiers").policy
    searches, held_out, table = {}, {}, []
    for name, cost in costs.items():
        searches[name] = search_run_tiers(runs, cost, name, SIZES, start, args.trials)
        table += rows(name, searches[name].results)
        held_out[name] = held_out_gain(profiles, num_layers, cost, args.trials)
        log.info("%s: best tier set %.3fx, best single %.3fx", name, *_best(searches[name].results[0]))
    frame = pd.DataFrame(table)
    frame.to_csv(out / "tier_sets.csv", index=False)
    manifest = searches["calibrated" if "calibrated" in searches else "closed-form"].manifest
    manifest.save(out / TIERS_FILE)
    manifest.save(runs[0] / TIERS_FILE)  # the contiguous run now carries the tiers into its export
    if skipsearch(["export", str(runs[0]), "--format", "all", "--out", str(out / "exports")]) != 0:
        raise SystemExit("export failed")
    decoded = None
    if not args.skip_decode:
        decode = ["decode", "--from", str(out / TIERS_FILE), *DECODE, "--json", str(out / "decode.json")]
        if skipsearch(decode) != 0:
            raise SystemExit("tier decoding was not lossless")
        decoded = json.loads((out / "decode.json").read_text())
    pool = len(searches["closed-form"].pool)
    (out / "summary.md").write_text(summary(frame, held_out, pool, decoded))


def _best(result: TierSetResult) -> tuple[float, float]:
    return result.score.speedup, result.pool_best.speedup


if __name__ == "__main__":
    main()
