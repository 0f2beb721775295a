"""fp32 against the default kernel plan, side by side: autoregressive, HF generate and one SSD probe.

The kernel plan (issue 19; docs/cpu-backend.md) runs bf16 weights: with bf16
activations on oneDNN where a CPU multiplies bf16 natively and that measures faster, else with
float32 activations on skipsearch's kernels (`cpu.bf16_activations`). This experiment runs
`skipsearch decode` of one probe mask per model in each of `--plans` — `--dtype float32` (the
baseline), the default and, with `bf16`, `--dtype bfloat16` — alternating them in fresh processes
for `--rounds` rounds, so drift hits all alike; within each process autoregressive decoding, HF
`generate` (in the same plan) and SSD are interleaved by the decode itself. Writes
`results/kernels/kernel_plan{--suffix}.md` and the decodes' JSON.

    python experiments/kernel_plan.py              # ~10 min on two idle cores (two plans)

Run it alone; the load average is recorded before and after each decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _cli import decode_json

from skipsearch.models.registry import REGISTRY, available_offline

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kernels"
# One probe per model: issue 19's unsearched drafts, at their gamma; n prompts x 48 new tokens.
PROBES = {
    "smollm2-135m": (["--skip", "14", "--gamma", "1"], 8),
    "qwen2.5-coder-0.5b": (["--mask", "a:3,4,5,6,7,10,12,13|m:3,4,5,6,7,10,12,13", "--gamma", "2"], 4),
}
# Every plan a CPU can run; `--plans` picks (bf16: where the default measured float32 activations faster).
PLANS = {"fp32": "float32", "bf16": "bfloat16", "default plan": "auto"}
DECODERS = ("autoregressive", "hf-generate", "ssd")


def decode(model: str, dtype: str, repeats: int) -> dict:
    probe, prompts = PROBES[model]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "decode.json"
        args = ["decode", "--model", model, *probe, "--dtype", dtype, "--n-prompts", str(prompts)]
        return decode_json([*args, "--new-tokens", "48", "--repeats", str(repeats)], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--models", default=",".join(PROBES))
    parser.add_argument("--suffix", default="", help="appended to the reports' names (another CPU)")
    parser.add_argument("--plans", default="fp32,default plan", help=f"comma-separated: {', '.join(PLANS)}")
    args = parser.parse_args()
    plans = {plan: PLANS[plan] for plan in args.plans.split(",")}
    if "fp32" not in plans:
        parser.error("--plans must include fp32, the baseline of every ratio")
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [
        "# fp32 against the default kernel plan (issue 19)",
        "",
        f"`python experiments/kernel_plan.py --rounds {args.rounds} --repeats {args.repeats}"
        f"{f' --suffix={args.suffix}' if args.suffix else ''} --plans '{args.plans}'`: "
        f"`skipsearch decode` per plan in fresh processes, alternating, {args.rounds} rounds; 48 new tokens "
        "per prompt, greedy. tok/s is the mean over rounds (range in brackets), prefill included (as HF "
        "`generate` is timed); the decode-only column takes each prompt's measured prefill out.",
        "",
        "| model | probe | plan | autoregressive tok/s | HF generate tok/s | SSD tok/s | "
        "AR decode-only tok/s, ÷ fp32's | SSD ÷ AR | AR ÷ fp32 AR | lossless | load before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw: dict[str, dict[str, list[dict]]] = {}
    for model in args.models.split(","):
        if not available_offline(REGISTRY[model]):
            print(f"skipping {model}: not installed")
            continue
        runs: dict[str, list[dict]] = {plan: [] for plan in plans}
        for round_index in range(args.rounds):
            order = list(plans) if round_index % 2 == 0 else list(reversed(plans))
            for plan in order:
                runs[plan].append(decode(model, plans[plan], args.repeats))
        raw[model] = runs

        def speeds(plan: str, name: str, runs: dict = runs) -> list[float]:
            return [r["summaries"][name]["tokens_per_second"] for r in runs[plan]]

        def decode_speeds(plan: str, runs: dict = runs) -> list[float]:
            """Autoregressive tok/s of the decode alone: each prompt's measured prefill taken out."""
            return [
                sum(len(d["tokens"]) for d in decodes)
                / sum(d["seconds"] - d["prefill_seconds"] for d in decodes)
                for decodes in (r["runs"]["autoregressive"] for r in runs[plan])
            ]

        fp32_ar = statistics.mean(speeds("fp32", "autoregressive"))
        fp32_decode = statistics.mean(decode_speeds("fp32"))
        for plan in plans:
            cells = []
            for name in DECODERS:
                values = speeds(plan, name)
                cells.append(f"{statistics.mean(values):.1f} ({min(values):.1f}–{max(values):.1f})")
            ratios = [s / a for s, a in zip(speeds(plan, "ssd"), speeds(plan, "autoregressive"), strict=True)]
            ar = statistics.mean(speeds(plan, "autoregressive"))
            decode_only = decode_speeds(plan)
            cells.append(
                f"{statistics.mean(decode_only):.1f} ({min(decode_only):.1f}–{max(decode_only):.1f}), "
                f"{statistics.mean(decode_only) / fp32_decode:.2f}×"
            )
            checks = [r["lossless_check"] for r in runs[plan]]
            lossless = (
                f"{sum(c['passed'] for c in checks)}/{len(checks)} pass, "
                f"{sum(c['near_ties'] for c in checks)} near-ties, "
                f"{sum(c.get('real_divergences', 0) for c in checks)} real"
            )
            before = min(r["load_before"] for r in runs[plan])
            loads = f"{before:.2f} → {max(r['load_after'] for r in runs[plan]):.2f}"
            probe = " ".join(PROBES[model][0])
            lines.append(
                f"| {model} | `{probe}` | {plan} | {' | '.join(cells)} | {statistics.mean(ratios):.3f}× | "
                f"{ar / fp32_ar:.2f}× | {lossless} | {loads} |"
            )
        print("\n".join(lines[-2:]))
    for plan in plans:
        first = next(iter(raw.values()))[plan][0] if raw else {}
        plan_line = first.get("kernel_plan_line", first.get("kernel_plan"))
        if plan_line and plan != "fp32":
            lines += ["", f"{plan.capitalize()}: {plan_line}"]
    (RESULTS / f"kernel_plan{args.suffix}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"kernel_plan{args.suffix}.json").write_text(json.dumps(raw, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
