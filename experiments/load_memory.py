"""Peak resident memory of a load under the plan this CPU picks, and one decode step after it.

Each case runs in a fresh process (`--child`), which loads the model with `--dtype auto`, decodes
two tokens after an 8-token prompt and reports its peak resident set (`ru_maxrss`), its parameters
and its plan line. The bound is the issue's: 2.3 bytes a parameter + 2 GB (a 7B's bf16 weights,
with float32 embeddings and headroom). Memory is not a timing, so a shared machine will do; the
32-layer case needs ~17 GB and is skipped, with a line, where less is available.

    .venv/bin/python experiments/load_memory.py [--out results/memory/load-<cpu>.md]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

BOUND_PER_PARAMETER, BOUND_EXTRA = 2.3, 2e9
RANDOM_DEPTHS = (2, 8, 32)
REAL_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")
HEADROOM = 1.07  # free memory a case needs beyond its bound's bytes before it is run (32 layers: 20 GB)


def child(model: str, layers: int | None) -> None:
    """Load `model` (random weights with `layers`), decode two tokens, print a JSON line."""
    from skipsearch.engine.autoregressive import autoregressive_decode
    from skipsearch.models.loading import load_model
    from skipsearch.models.memory_fit import empty_model
    from skipsearch.models.random_weights import RandomWeights
    from skipsearch.models.runner import LayerwiseRunner
    from skipsearch.models.weight_layout import unique_parameters

    weights = RandomWeights(num_layers=layers) if layers else None
    loaded = load_model(model, "cpu", "auto", weights, announce=False)
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    parameters = sum(p.numel() for p in unique_parameters(empty_model(loaded.model.config)))
    runner = LayerwiseRunner(loaded.model)
    autoregressive_decode(runner, list(range(1, 9)), 2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = {"parameters": parameters, "loaded_rss": loaded_rss, "peak_rss": peak, "plan": loaded.plan.line}
    print(json.dumps(record))


def case(model: str, layers: int | None) -> dict:
    """One case in a fresh process."""
    command = [sys.executable, __file__, "--child", model] + (["--num-layers", str(layers)] if layers else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def mistral_parameters(layers: int) -> int:
    """Mistral-7B's parameters at `layers` layers: embedding and head 2 x 32768 x 4096, a layer's
    four attention and three MLP matrices and two norms, the final norm."""
    hidden, vocab, inner, kv = 4096, 32768, 14336, 1024
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner + 2 * hidden
    return 2 * vocab * hidden + layers * layer + hidden


def table(rows: list[tuple[str, dict]]) -> str:
    lines = [
        "| model | parameters | peak RSS (GB) | after load (GB) | bytes/parameter | bound (GB) | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, record in rows:
        if "error" in record or "skipped" in record:
            lines.append(f"| {name} | | | | | | {record.get('error') or record['skipped']} |")
            continue
        parameters, peak = record["parameters"], record["peak_rss"]
        bound = BOUND_PER_PARAMETER * parameters + BOUND_EXTRA
        lines.append(
            f"| {name} | {parameters / 1e9:.3f} B | {peak / 1e9:.2f} | {record['loaded_rss'] / 1e9:.2f} | "
            f"{peak / parameters:.2f} | {bound / 1e9:.2f} | {'pass' if peak <= bound else 'FAIL'} |"
        )
    plans = sorted({record["plan"] for _, record in rows if "plan" in record})
    return "\n".join([*lines, "", *(f"Plan: `{plan}`" for plan in plans)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--num-layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write the table here as Markdown")
    parser.add_argument("--skip-real", action="store_true", help="only the Mistral-7B shape")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.num_layers)
        return
    rows: list[tuple[str, dict]] = []
    for layers in RANDOM_DEPTHS:
        name = f"mistral-7b, random weights, {layers} layers"
        need = HEADROOM * (BOUND_PER_PARAMETER * mistral_parameters(layers) + BOUND_EXTRA)
        if available() < need:
            skipped = f"skipped: {available() / 1e9:.1f} GB available, {need / 1e9:.1f} needed"
            rows.append((name, {"skipped": skipped}))
        else:
            rows.append((name, case("mistral-7b", layers)))
        print(table(rows[-1:]).splitlines()[2], flush=True)
    if not args.skip_real:
        for model in REAL_MODELS:
            rows.append((f"{model}, real weights", case(model, None)))
    text = table(rows)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# Peak memory of a load and a decode step\n\n{text}\n")


if __name__ == "__main__":
    main()
