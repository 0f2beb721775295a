"""Random vs uniform vs learned at equal budget on the embedded model (issue 4, DESIGN §3).

Runs `skipsearch compare` (sparse space, budget 100, 3 seeds, one shared evaluation cache) and,
when `make qwen` has installed it, the same on qwen2.5-coder-0.5b with a smaller budget. Writes
`results/compare/<model>/`: comparison.csv, comparison.md, convergence.png, trials of every
study (`<strategy>-s<seed>.csv`) and run.yaml. The Optuna journal and the evaluation cache stay in
`runs/compare/<model>/` (large, not committed); rerunning with `--resume` continues them.

Prompt options are smaller than the CLI defaults (8 HumanEval prompts, 48 new tokens) so that
900 evaluations fit in well under an hour on two CPU cores; the settings are in run.yaml.

Run: `.venv/bin/python experiments/compare_strategies.py [--budget 100 --seeds 3] [--resume]`.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from _cli import skipsearch

from skipsearch.models.registry import REGISTRY, available_offline
from skipsearch.search import load_study, study_trials_frame

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["--n-prompts", "8", "--new-tokens", "48", "--max-prompt-tokens", "192"]
COST = ["--cost", "closed-form"]  # not auto: the results must not depend on a profile being cached
COPIED = ("comparison.csv", "comparison.md", "convergence.png", "run.yaml")


def compare(model: str, budget: int, seeds: int, resume: bool) -> None:
    work = ROOT / "runs" / "compare" / model
    args = ["compare", "--model", model, "--space", "sparse", "--budget", str(budget), "--seeds", str(seeds)]
    args += [*PROMPTS, *COST, "--out", str(work)]
    if resume and work.exists():
        args.append("--resume")
    if skipsearch(args) != 0:
        raise SystemExit(f"compare on {model} failed")
    out = ROOT / "results" / "compare" / model
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copy(work / name, out / name)
    for strategy in ("random", "uniform", "learned"):
        for seed in range(seeds):
            name = f"{strategy}-s{seed}"
            study_trials_frame(load_study(work, name)).to_csv(out / f"{name}.csv", index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--qwen-budget", type=int, default=40, help="budget on qwen2.5-coder-0.5b")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--skip-smollm2", action="store_true", help="only the qwen comparison")
    args = parser.parse_args()
    if not args.skip_smollm2:
        compare("smollm2-135m", args.budget, args.seeds, args.resume)
    if available_offline(REGISTRY["qwen2.5-coder-0.5b"]):
        compare("qwen2.5-coder-0.5b", args.qwen_budget, args.seeds, args.resume)


if __name__ == "__main__":
    main()
