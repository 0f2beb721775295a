"""What a verify's extra query rows cost in attention on this CPU, against the bytes and FLOPs (issue 19).

A verify of γ + 1 positions costs the same linear layers as one step (bf16 products are flat in
the number of rows), but its attention grows with the rows. This experiment times the plan's
attention kernel — SDPA in float32 over a float32 K/V cache, the query's heads grouped as torch's
`enable_gqa` groups them — on SmolLM2's head layout (9 query heads, 3 K/V heads, head dim 64), for
1 to 5 query rows at several key counts, 30 layers' worth of distinct caches streamed per sample
(as a step reads them), and sets each time against what it must do:

- bytes: every key and value of the layer, read once (`2 × keys × 3 × 64 × 4`);
- FLOPs: `4 × rows × 9 × keys × 64` (scores and the weighted sum).

A kernel bound by bytes costs the same for 1 and 5 rows; one bound by arithmetic costs 5×. The
report gives µs per layer, the ratio to one row, and the achieved GB/s and GFLOP/s.

    python experiments/attention_rows.py     # ~1 min; writes results/kernels/attention_rows.md

Run it alone; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _load import load_line

from skipsearch.models.threads import fit_threads_to_load

OUT = Path(__file__).resolve().parents[1] / "results" / "kernels" / "attention_rows.md"
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30


def per_layer_seconds(keys: int, rows: int, repeats: int) -> list[float]:
    """Seconds per layer of SDPA over `keys` cached positions for `rows` queries (a causal block
    at the end, as a verify's), each sample streaming `LAYERS` distinct caches."""
    generator = torch.Generator().manual_seed(keys * 10 + rows)
    caches = [
        [torch.randn(1, KV_HEADS, keys + 64, HEAD_DIM, generator=generator)[:, :, :keys] for _ in range(2)]
        for _ in range(LAYERS)
    ]
    query = torch.randn(1, HEADS, rows, HEAD_DIM, generator=generator)
    mask = None if rows == 1 else torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    samples = []
    for index in range(repeats + 2):
        began = time.perf_counter()
        for key, value in caches:
            F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
        if index >= 2:
            samples.append((time.perf_counter() - began) / LAYERS)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="128,512,2048,8192")
    parser.add_argument("--rows", default="1,2,3,4,5")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    threads = fit_threads_to_load()
    before = os.getloadavg()
    lines = [
        "# Attention per query row on this CPU (issue 19)",
        "",
        f"`python experiments/attention_rows.py --repeats {args.repeats}`: SDPA in float32, SmolLM2's "
        f"heads ({HEADS} query, {KV_HEADS} K/V, dim {HEAD_DIM}), µs per layer (median of "
        f"{args.repeats}, each over {LAYERS} distinct caches); {threads.reason}.",
        "",
        "| keys | rows | µs per layer | × one row | GB/s (K/V read once) | GFLOP/s |",
        "|---|---|---|---|---|---|",
    ]
    for keys in (int(k) for k in args.keys.split(",")):
        one = None
        for rows in (int(r) for r in args.rows.split(",")):
            seconds = statistics.median(per_layer_seconds(keys, rows, args.repeats))
            one = seconds if one is None else one
            read = 2 * keys * KV_HEADS * HEAD_DIM * 4
            flops = 4 * rows * HEADS * keys * HEAD_DIM
            lines.append(
                f"| {keys} | {rows} | {1e6 * seconds:.1f} | {seconds / one:.2f} | "
                f"{read / seconds / 1e9:.1f} | {flops / seconds / 1e9:.1f} |"
            )
            print(lines[-1], flush=True)
    lines += ["", load_line(before, os.getloadavg()), ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
