"""A decode step when another process keeps one core busy, against the idle step (issue 19, item 5).

A CPU user shares the machine. With OpenMP's default wait policy, torch's worker threads spin
after each parallel region; when another process holds one of the cores, the thread that shares
its core is descheduled mid-kernel and the other waits for it. This experiment times the
autoregressive step of the embedded model on the default kernel plan (bf16 weights, fp32 K/V and
attention) at a 512-token context, in a fresh child process per configuration (OpenMP reads its
wait policy once, at start-up):

- wait policy: OpenMP's default, or `OMP_WAIT_POLICY=PASSIVE` (sleep instead of spin);
- torch threads: 1 or 2 (`OMP_NUM_THREADS`), or `auto`: what `load_model` fits to the load at
  start-up (`cpu.threads`: one thread per core that other processes leave free, and where
  that leaves one, helpers on the busy cores that take pieces of the products without the step
  ever waiting for them, `cpu.shared_core`; the steps engage them as a decode's loop does);
- load: idle, or one core kept at 100% by a spinning Python process.

Each process also times a large copy on its threads after its steps, and sets the step against
the floor that copy bandwidth gives (the bytes a step must read: the weights and the K/V at the
context). One core reads less than two: a memory-bound step on one thread is slower by about the
ratio of the two bandwidths, which says how far the one-thread plan can be from the idle step.

Configurations are interleaved, each repeated `--rounds` times in new processes; the table gives
the median of the per-process medians and their range. Run it alone on an idle machine:

    python experiments/busy_core.py            # ~4 min, writes results/threads/busy_core{--suffix}.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _load import load_line

RESULTS = Path(__file__).resolve().parents[1] / "results" / "threads"
CONTEXT = 512  # tokens cached before the timed steps (--context)
STEPS = 60
POLICIES = ("default", "PASSIVE")
THREADS = ("1", "2", "auto")
LOADS = ("idle", "one core busy")


def child(context: int) -> None:
    """Median ms of `STEPS` one-position steps after a `context`-token cache, then the copy
    bandwidth on the same threads and the step's floor at it, printed as JSON."""
    import torch

    from skipsearch.bench.clock import WallClock
    from skipsearch.bench.latency_profiler import copy_bandwidth
    from skipsearch.cpu import shared_core
    from skipsearch.cpu.inventory import step_bytes
    from skipsearch.models.loading import load_model
    from skipsearch.models.runner import LayerwiseRunner

    loaded = load_model("smollm2-135m", announce=False)
    runner = LayerwiseRunner(loaded.model)
    cache = runner.new_cache()
    ids = torch.randint(
        0, runner.config.vocab_size, (1, context + STEPS + 5), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        runner.forward(ids[:, :context], cache=cache)
        times = []
        with shared_core.engaged() as helpers:  # as a decode's loop engages them
            pieces_before = shared_core.piece_counts(helpers.kernel) if helpers else (0, 0)
            for step in range(STEPS + 5):
                began = time.perf_counter()
                runner.forward(ids[:, step : step + 1], cache=cache)
                if step >= 5:
                    times.append(time.perf_counter() - began)
                for layer in cache.layers:
                    layer.crop(-1)
            pieces = shared_core.piece_counts(helpers.kernel) if helpers else (0, 0)
    weights, per_position = step_bytes(loaded.model)
    bandwidth = copy_bandwidth(runner.device, WallClock())
    result = {
        "median_ms": 1e3 * statistics.median(times),
        "copy_gbs": bandwidth / 1e9,
        "floor_ms": 1e3 * (weights + context * per_position) / bandwidth,
        "plan": loaded.plan.details,
        "plan_line": loaded.plan.line,
        "threads": torch.get_num_threads(),
        "helpers": helpers is not None,
        # pieces of products the helpers computed, and the caller took back, a step
        "helper_pieces": (pieces[0] - pieces_before[0]) / (STEPS + 5),
        "taken_pieces": (pieces[1] - pieces_before[1]) / (STEPS + 5),
    }
    print(json.dumps(result))


def run_child(policy: str, threads: str, context: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    if threads != "auto":
        env["OMP_NUM_THREADS"] = threads
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--context", str(context)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suffix", default="", help="appended to the reports' names (another CPU)")
    parser.add_argument("--context", type=int, default=CONTEXT, help="tokens cached before the steps")
    parser.add_argument(
        "--policies", nargs="+", choices=POLICIES, default=list(POLICIES), help="OpenMP wait policies to run"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.context)
        return
    load_before = os.getloadavg()
    # The plan's measured choices (products, attention) are taken once per machine by the first
    # process that loads the model, and cached: here an idle one with the default threads, as a
    # user's first run, not whichever configuration comes first.
    run_child("default", "auto", args.context)
    results: dict[tuple[str, str, str], list[dict]] = {}  # each process's `child` result, by cell
    plans: dict[str, str] = {}  # the default configuration's kernel plan, by load
    for round_index in range(args.rounds):
        for load in LOADS:
            spinner = None
            if load != "idle":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(1)
            configs = list(itertools.product(args.policies, THREADS))
            shift = round_index % len(configs)
            for policy, threads in configs[shift:] + configs[:shift]:
                result = run_child(policy, threads, args.context)
                if (policy, threads) == ("default", "auto"):
                    plans[load] = result.get("plan_line", result["plan"])
                results.setdefault((policy, threads, load), []).append(result)
                ms = result["median_ms"]
                print(f"round {round_index + 1} {load:14} {policy:8} {threads} thread(s): {ms:.1f} ms")
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    load_after = os.getloadavg()
    samples = {cell: [r["median_ms"] for r in rs] for cell, rs in results.items()}
    cells = list(itertools.product(args.policies, THREADS))
    idle = {(p, t): statistics.median(samples[(p, t, "idle")]) for p, t in cells}
    lines = [
        "# A decode step with one core busy (issue 19, item 5)",
        "",
        f"`python experiments/busy_core.py {' '.join(sys.argv[1:])}`: SmolLM2-135M, "
        f"{args.context}-token context, "
        f"median of {STEPS} one-position steps per process, {args.rounds} fresh processes per cell, "
        "interleaved.",
        *(f"Kernel plan ({load}): {plans[load]}." for load in LOADS),
        load_line(load_before, load_after) + " (the busy phases add one).",
        "",
        "| wait policy | threads | load | threads used | step ms (median of processes) | range "
        "| ÷ its idle step | ÷ best idle step | copy GB/s on its threads | step ÷ its floor "
        "| helper pieces / taken back a step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = min(idle.values())
    for (policy, threads, load), values in sorted(samples.items()):
        median = statistics.median(values)
        cell = results[policy, threads, load]
        used = sorted({r["threads"] for r in cell})
        shared = [r for r in cell if r.get("helpers")]
        pieces = (
            f"{statistics.median(r['helper_pieces'] for r in shared):.0f} / "
            f"{statistics.median(r['taken_pieces'] for r in shared):.1f}"
            if shared
            else "no helpers"
        )
        lines.append(
            f"| {policy} | {threads} | {load} | {used} | {median:.1f} | "
            f"{min(values):.1f}–{max(values):.1f} | "
            f"{median / idle[(policy, threads)]:.2f} | {median / best:.2f} | "
            f"{statistics.median(r['copy_gbs'] for r in cell):.1f} | "
            f"{median / statistics.median(r['floor_ms'] for r in cell):.2f} | {pieces} |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"busy_core{args.suffix}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"busy_core{args.suffix}.json").write_text(
        json.dumps({" / ".join(map(str, k)): v for k, v in samples.items()}, indent=1)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
