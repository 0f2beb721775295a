"""Six strategies at equal budget, plus random at 5x the budget (issues 4 and 13;
docs/architecture.md, "Strategies").

Runs `skipsearch compare` (`compare_space.yaml`: the sparse space up to 70% skipped; 3 seeds, one
shared evaluation cache) with random, uniform, ranking, knapsack, learned (TPE) and knapsack+tpe at
budget 100 on the embedded model and, when `make qwen` has installed it, at budget 40 on
qwen2.5-coder-0.5b; each also gets random search at 5x the budget (`random@5x`), the reference the
learned strategies should beat. Writes `results/compare/xeon-amx/<model>/` (`--out-name`):
comparison.csv, comparison.md (best score, masks to reach 95% of the final, model seconds),
convergence.png (mean ± range over seeds), importance.json / .png, trials of every study
(`<study>.csv`) and run.yaml. The Optuna
journal and the evaluation cache stay in `runs/compare/<model>/` (large, not committed); rerunning
with `--resume` continues them.

Cost model: the calibrated one when a latency profile of the model is cached on this device
(`skipsearch profile`), else the closed form; run.yaml records which (`cost`). Prompt options are
smaller than the CLI defaults (8 HumanEval prompts, 48 new tokens); the settings are in run.yaml.
The full benchmark is about 6 x 100 + 500 distinct masks per seed before cache sharing: 25 minutes
for SmolLM2 and 31 for Qwen on two idle cores (2026-11-30), so run it on an idle machine:

    .venv/bin/python experiments/compare_strategies.py --budget 100 --seeds 3 --qwen-budget 40

A smoke run (minutes): `--budget 6 --seeds 1 --skip-qwen --out-name smoke` (writes
`results/smoke/<model>/` and `runs/smoke/`; about 12 minutes on two shared cores; delete them after).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import optuna
import yaml
from _cli import skipsearch

from skipsearch.models.registry import REGISTRY, available_offline
from skipsearch.search import load_study, study_trials_frame
from skipsearch.search.study import journal_storage

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["--n-prompts", "8", "--new-tokens", "48", "--max-prompt-tokens", "192"]
STRATEGIES = "random,uniform,ranking,knapsack,learned,knapsack+tpe"
RANDOM_MULTIPLE = 5
COPIED = (
    "comparison.csv",
    "comparison.md",
    "convergence.png",
    "run.yaml",
    "importance.json",
    "importance.png",
)


def compare(
    model: str, budget: int, seeds: int, resume: bool, out_name: str, strategies: str, extra: list
) -> None:
    """One model's comparison; `extra` carries the space, draft head and random multiple."""
    work = ROOT / "runs" / out_name / model
    args = ["compare", "--model", model, "--budget", str(budget), "--seeds", str(seeds)]
    args += [*PROMPTS, "--cost", "auto", "--strategies", strategies, *extra, "--out", str(work)]
    if resume and work.exists():
        args.append("--resume")
    if skipsearch(args) != 0:
        raise SystemExit(f"compare on {model} failed")
    out = ROOT / "results" / out_name / model
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copy(work / name, out / name)
    for name in optuna.study.get_all_study_names(journal_storage(work)):
        study_trials_frame(load_study(work, name)).to_csv(out / f"{name}.csv", index=False)
    cost = yaml.safe_load((work / "run.yaml").read_text())["config"]["cost"]
    print(f"{model}: scored with the {cost} cost model; results in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--qwen-budget", type=int, default=40, help="budget on qwen2.5-coder-0.5b")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--skip-smollm2", action="store_true", help="only the qwen comparison")
    parser.add_argument("--skip-qwen", action="store_true", help="only the smollm2 comparison")
    parser.add_argument(
        "--out-name", default="compare/xeon-amx", help="results/<name>/<model> (default compare/xeon-amx)"
    )
    parser.add_argument("--strategies", default=STRATEGIES, help=f"comma-separated (default {STRATEGIES})")
    parser.add_argument(
        "--space",
        default=str(ROOT / "experiments" / "compare_space.yaml"),
        help="search space name or YAML (default experiments/compare_space.yaml; `precision`: the "
        "precision axis)",
    )
    parser.add_argument(
        "--draft-vocab",
        default=None,
        help="draft head of every mask, per model: SMOLLM2_K,QWEN_K (e.g. 16384,32768; default the "
        "full head)",
    )
    parser.add_argument(
        "--random-multiple",
        type=int,
        default=RANDOM_MULTIPLE,
        help=f"random search also at this multiple of the budget, 0 for none (default {RANDOM_MULTIPLE})",
    )
    args = parser.parse_args()
    vocabs = args.draft_vocab.split(",") if args.draft_vocab else [None, None]
    if len(vocabs) != 2:
        parser.error(
            f"--draft-vocab wants two sizes, SmolLM2's and Qwen's, e.g. 16384,32768; got {args.draft_vocab!r}"
        )

    def extra(vocab: str | None) -> list:
        head = ["--draft-vocab", vocab] if vocab else []
        multiple = ["--random-multiple", str(args.random_multiple)] if args.random_multiple else []
        return ["--space", args.space, *head, *multiple]

    if not args.skip_smollm2:
        compare(
            "smollm2-135m",
            args.budget,
            args.seeds,
            args.resume,
            args.out_name,
            args.strategies,
            extra(vocabs[0]),
        )
    if not args.skip_qwen and available_offline(REGISTRY["qwen2.5-coder-0.5b"]):
        compare(
            "qwen2.5-coder-0.5b",
            args.qwen_budget,
            args.seeds,
            args.resume,
            args.out_name,
            args.strategies,
            extra(vocabs[1]),
        )


if __name__ == "__main__":
    main()
