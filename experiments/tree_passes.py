"""A token tree's verify pass against the chain's: one full pass of r rows, causal (the chain's
path: fused layers, the decode-attention kernel, what `skipsearch profile` times), under the tree's
ancestor mask as the engine runs it (`kv.tree_keys`: on the fused layers the kernel reads each
row's ancestors as bits), and under the same mask as a dense one through transformers' attention
modules and SDPA (the path trees ran before the kernel read them, and still run where the plan does
not fuse its layers).

On one model, after a prompt of `--context` tokens, for the verify of each tree shape (`--shapes`),
the three passes interleaved, `--repeats` times, the cache cropped back after each; median and
spread. Run it alone. Writes `{out}/tree_passes-{model}.md`.

    python experiments/tree_passes.py --model qwen2.5-coder-0.5b --out results/token_trees/epyc-zen2
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import Stamp, configure, markdown_table, stamp_line

from skipsearch.cpu.dtypes import describe_cpu
from skipsearch.engine.shared_kv import crop
from skipsearch.engine.tree_rounds import tree_mask
from skipsearch.models.kernels import busy_cpu_warning
from skipsearch.models.loading import load_model
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import TreeShape

PATHS = ("causal", "tree (kernel)", "tree (modules, dense mask)")


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--model", default="qwen2.5-coder-0.5b")
    options.add_argument("--shapes", nargs="+", default=["2x1", "2x2x1", "3x2x1"])
    options.add_argument("--context", type=int, default=512)
    options.add_argument("--repeats", type=int, default=15)
    options.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    options.add_argument("--out", type=Path, required=True)
    args = options.parse_args()
    configure(args.threads)
    if busy := busy_cpu_warning():
        sys.exit(f"tree_passes: {busy}: timings must run alone")
    stamp = Stamp()
    loaded = load_model(args.model)
    runner = LayerwiseRunner(loaded.model)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, runner.config.vocab_size, (args.context + 1,), generator=generator).tolist()
    cache = runner.prefill(prompt)
    start = cache.get_seq_length()

    def one_pass(shape: TreeShape, path: str) -> float:
        rows = shape.verify_rows
        ids = torch.randint(0, runner.config.vocab_size, (1, rows), generator=generator)
        if path == "causal":
            at, mask = torch.arange(start, start + rows)[None], None
        else:
            at = (start + torch.tensor(shape.depths))[None]
            mask = tree_mask(shape, start, range(rows), start + rows, runner.device)
            if path != "tree (kernel)":
                mask = mask.dense  # a tensor: the caller's own mask, which the modules read
        began = time.perf_counter()
        with torch.no_grad():
            hidden = runner.run_layers(
                runner.embed(ids), 0, runner.num_layers, at, cache=cache, attention_mask=mask
            )
            runner.head(hidden)
        seconds = time.perf_counter() - began
        crop(cache, start)
        return seconds

    shapes = [TreeShape.parse(s) for s in args.shapes]
    samples = {(str(s), p): [] for s in shapes for p in PATHS}
    for shape in shapes:  # warm-up
        for path in PATHS:
            one_pass(shape, path)
    for repeat in range(args.repeats):
        for shape in shapes:
            order = PATHS if repeat % 2 == 0 else PATHS[::-1]
            for path in order:
                samples[str(shape), path].append(one_pass(shape, path))
    meta = stamp.finish()
    rows = []
    for shape in shapes:
        causal = statistics.median(samples[str(shape), "causal"])
        for path in PATHS:
            times = samples[str(shape), path]
            median = statistics.median(times)
            rows.append([
                f"`{shape}`", str(shape.verify_rows), path, f"{median * 1e3:.2f}",
                f"{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f}", f"{median / causal:.2f}",
            ])  # fmt: skip
    command = "python experiments/tree_passes.py " + shlex.join(sys.argv[1:])
    lines = [
        f"# A token tree's verify pass against the chain's: {args.model}, {args.context} tokens",
        "",
        f"CPU: {describe_cpu()}. {loaded.plan.line}.",
        f"Command: `{command}`.",
        "",
        *markdown_table(["tree", "rows", "path", "median (ms)", "spread (ms)", "÷ causal"], rows),
        "",
        f"{args.repeats} interleaved repeats after one warm-up, the order reversed every other repeat. "
        + stamp_line(meta),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"tree_passes-{args.model}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
