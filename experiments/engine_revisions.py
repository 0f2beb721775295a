"""The engine's decode speed at the working tree against its code at another git revision, paired.

A refactor of the round loop must leave the chain's speed where it was. Two versions of one package
cannot share a process, so each version decodes in processes of its own, alternating: revision,
working tree, working tree, revision, ... (the order flips every pair). Every process loads the
model, decodes one untimed warm-up, then the same prompts with the same draft: autoregressive and
speculative decoding (the chain of `--gamma`, untimed rounds as `skipsearch decode` runs them),
each prompt once per process, and reports decode-only seconds (the prefill's excluded). The report
gives each version's decode-only tokens per second per process, the paired ratios (working tree ÷
revision) with their median, mean, standard error and range, and whether both versions gave the
same tokens. A process's speed is partly a draw (its memory layout: ±15% for both versions alike), so
the steadiest comparison is the third: SSD ÷ AR within each process, working tree over revision,
which divides the draw out. Each process prints its kernel plan, and the report lists them.

    python experiments/engine_revisions.py --against b94f58c --pairs 16    # ~13 min on two cores

The worker calls only names both versions have (`skipsearch.engine.speculative_decode`,
`autoregressive_decode`, `models.loading.load_model`, `acceptance.prompts`). Run it alone; the load
average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import markdown_table, write_report
from _load import load_line

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "engine"

WORKER = r"""
import json, sys, time
import torch
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.loading import eos_ids, load_model
from skipsearch.models.runner import LayerwiseRunner

args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
loaded = load_model(args["model"], announce=False)
runner = LayerwiseRunner(loaded.model)
spec = PromptSpec(args["source"], args["prompts"], args["max_prompt_tokens"], args["new_tokens"], 0)
prompts = [p.ids for p in encode_prompts(spec, loaded.tokenizer)]
mask = SkipMask.parse(args["mask"], runner.num_layers)
stops = eos_ids(loaded.model)
new = args["new_tokens"]

def ssd(prompt):
    return speculative_decode(runner, prompt, mask, new, gamma=args["gamma"], eos_ids=stops, timed=False)

def ar(prompt):
    return autoregressive_decode(runner, prompt, new, eos_ids=stops)

ar(prompts[0]); ssd(prompts[0])  # warm-up: kernels built, caches touched
out = {"ar": [], "ssd": [], "tokens": [], "plan": loaded.plan.line}
for index, prompt in enumerate(prompts):
    pair = (("ar", ar), ("ssd", ssd)) if index % 2 == 0 else (("ssd", ssd), ("ar", ar))
    for name, decode in pair:
        result = decode(prompt)
        out[name].append([len(result.tokens), result.seconds - result.prefill_seconds])
        if name == "ssd":
            out["tokens"].append(list(result.tokens))
print("RESULT " + json.dumps(out))
"""


def extract(revision: str, directory: Path) -> Path:
    """The package `skipsearch/` as it was at git `revision`, under `directory`."""
    archive = directory / "rev.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), revision, "skipsearch"], cwd=ROOT, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="data")
    return directory


def run_worker(tree: Path, settings: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(settings)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"worker on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def rate(pairs: list[list[float]]) -> float:
    """Decode-only tokens per second over a process's prompts: new tokens over decode seconds."""
    return sum(n for n, _ in pairs) / sum(s for _, s in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision whose engine is the baseline")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mask", default="a:8,20|m:26", help="the chain's skip mask (SkipMask.parse)")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--source", default="humaneval")
    parser.add_argument("--pairs", type=int, default=4, help="process pairs (revision, working tree)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default=None, help="report file name (default engine_revisions-MODEL)")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "skipsearch"], cwd=ROOT).returncode != 0
    settings = {
        "model": args.model,
        "mask": args.mask,
        "gamma": args.gamma,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "source": args.source,
        "threads": args.threads,
    }
    before = os.getloadavg()
    began = time.time()
    runs: dict[str, list[dict]] = {"revision": [], "tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = extract(args.against, Path(tmp))
        trees = {"revision": base, "tree": ROOT}
        for pair in range(args.pairs):
            order = ("revision", "tree") if pair % 2 == 0 else ("tree", "revision")
            for name in order:
                runs[name].append(run_worker(trees[name], settings))
                print(f"pair {pair + 1}/{args.pairs}: {name} done", file=sys.stderr)
    after = os.getloadavg()
    rows, ratios = [], {"ar": [], "ssd": [], "speedup": []}
    for pair, (old, new) in enumerate(zip(runs["revision"], runs["tree"], strict=True)):
        line = [str(pair + 1)]
        for kind in ("ar", "ssd"):
            a, b = rate(old[kind]), rate(new[kind])
            ratios[kind].append(b / a)
            line += [f"{a:.1f}", f"{b:.1f}", f"{b / a:.3f}"]
        # SSD over AR within each process: the process's own speed (a draw of its memory layout and
        # its neighbours) divides out, so the pair compares the chain's cost alone.
        within_old = rate(old["ssd"]) / rate(old["ar"])
        within_new = rate(new["ssd"]) / rate(new["ar"])
        ratios["speedup"].append(within_new / within_old)
        line += [f"{within_old:.3f}", f"{within_new:.3f}", f"{within_new / within_old:.3f}"]
        rows.append(line)
    plans = sorted({run["plan"] for name in runs for run in runs[name]})
    same = all(o["tokens"] == n["tokens"] for o, n in zip(runs["revision"], runs["tree"], strict=True))
    summary = []
    labels = (
        ("ar", "autoregressive"),
        ("ssd", f"SSD chain, mask {args.mask}, γ = {args.gamma}"),
        ("speedup", "the chain's SSD ÷ AR within a process"),
    )
    for kind, label in labels:
        values = ratios[kind]
        spread = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
        summary.append(
            f"- {label}: working tree ÷ revision, median {statistics.median(values):.3f}, "
            f"mean {statistics.mean(values):.3f} ± {spread:.3f} (standard error; range "
            f"{min(values):.3f}–{max(values):.3f}, {len(values)} process pairs)"
        )
    flags = Path("/proc/cpuinfo").read_text()
    names = (x.split(":", 1)[1].strip() for x in flags.splitlines() if x.startswith("model name"))
    cpu = next(names, "unknown CPU")
    amx = "AMX" if "amx_tile" in flags else "no AMX"
    lines = [
        f"# The engine at {head}{' + changes' if dirty else ''} against {args.against}, paired by process",
        "",
        f"CPU: {cpu} ({amx}), {os.cpu_count()} cores, {args.threads} threads. Model {args.model}, "
        f"{args.prompts} {args.source} prompts (≤ {args.max_prompt_tokens} tokens), {args.new_tokens} new "
        "tokens, greedy. Each version decodes on the kernel plan its own code picks for this CPU; within "
        "a version the autoregressive baseline runs on the same kernels as the draft and the verify.",
        "",
        load_line(before, after) + f". Wall time {time.time() - began:.0f} s.",
        "",
        "Decode-only tokens per second, each process's prompts pooled:",
        "",
        *markdown_table(
            [
                "pair",
                "AR rev",
                "AR tree",
                "AR ratio",
                "SSD rev",
                "SSD tree",
                "SSD ratio",
                "SSD÷AR rev",
                "SSD÷AR tree",
                "ratio",
            ],
            rows,
        ),
        "",
        *summary,
        f"- SSD tokens identical between the versions on every prompt: {'yes' if same else 'NO'}",
        "",
        "Kernel plans the processes printed:",
        "",
        *(f"- {plan}" for plan in plans),
        "",
        "Command: `python experiments/engine_revisions.py " + " ".join(sys.argv[1:]) + "`",
    ]
    path = OUT / f"{args.name or 'engine_revisions-' + args.model}.md"
    write_report(path, [*lines, ""])


if __name__ == "__main__":
    main()
