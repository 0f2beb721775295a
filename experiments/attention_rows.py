"""What a verify's extra query rows cost in attention on this CPU, kernel by kernel (issue 19).

A verify of γ + 1 positions costs about the same products as one step on the tile kernel, but its
attention grows with the rows on a kernel that pays for each row. This experiment times the
attention paths the plan can run for float32 activations:

- `sdpa`: SDPA in float32, the query's heads grouped as torch's `enable_gqa` groups them;
- `avx2`: skipsearch's decode kernel (`decode_attention_fp32.c`), one FMA per key, dimension and row;
- `amx`: the AMX kernel (`decode_attention_amx.c`), 16 rows of a K/V head per tile product, over the
  bf16 cache it keeps (the same keys and values it would round from a float32 one, half the bytes),

on a model's head layout (SmolLM2: 9 query heads, 3 K/V heads; Qwen2.5-0.5B: 14 and 2; head dim 64)
for 1 to 5 query rows at several key counts, 30 layers' worth of distinct caches streamed per sample
(as a step reads them). The kernels are interleaved sample by sample, in alternating order. Each time
is set against the bytes it must read: every key and value of the layer, once. A kernel bound by
bytes costs the same for 1 and 5 rows; one bound by arithmetic costs up to 5x.

    python experiments/attention_rows.py    # SDPA on SmolLM2's heads: results/kernels/attention_rows.md
    python experiments/attention_rows.py --kernels sdpa,avx2,amx --layouts smollm2,qwen \
        --out results/kernels/attention_rows-amx.md    # ~3 min

Run it alone; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from _load import load_line

from skipsearch.cpu.decode_attention import decode_attention
from skipsearch.cpu.threads import fit_threads_to_load

OUT = Path(__file__).resolve().parents[1] / "results" / "kernels" / "attention_rows.md"
LAYOUTS = {"smollm2": (9, 3), "qwen": (14, 2)}  # query heads, K/V heads
HEAD_DIM, LAYERS = 64, 30


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> None:
    F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)


def _kernel(amx: bool, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: object) -> None:
    if decode_attention(query, key, value, HEAD_DIM**-0.5, amx=amx) is None:
        raise SystemExit(f"the {'AMX' if amx else 'AVX2'} decode kernel does not load on this CPU")


CACHE_DTYPES = {"sdpa": torch.float32, "avx2": torch.float32, "amx": torch.bfloat16}  # what each reads
KERNELS: dict[str, Callable[..., None]] = {
    "sdpa": _sdpa,
    "avx2": partial(_kernel, False),
    "amx": partial(_kernel, True),
}


def per_layer_seconds(
    kernels: list[str], heads: int, kv_heads: int, keys: int, rows: int, repeats: int
) -> dict[str, list[float]]:
    """Seconds per layer of each kernel over `keys` cached positions for `rows` queries (a causal
    block at the end, as a verify's), each sample streaming `LAYERS` distinct caches; the kernels
    interleaved sample by sample, in alternating order, after two warm-up rounds."""
    generator = torch.Generator().manual_seed(keys * 10 + rows)
    caches = [
        [torch.randn(1, kv_heads, keys + 64, HEAD_DIM, generator=generator)[:, :, :keys] for _ in range(2)]
        for _ in range(LAYERS)
    ]
    query = torch.randn(1, heads, rows, HEAD_DIM, generator=generator)
    mask = None if rows == 1 else torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    samples: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    dtypes = {CACHE_DTYPES[kernel] for kernel in kernels}
    cast = {dtype: [[t.to(dtype) for t in cache] for cache in caches] for dtype in dtypes}
    for index in range(repeats + 2):
        for kernel in kernels if index % 2 else reversed(kernels):
            began = time.perf_counter()
            for key, value in cast[CACHE_DTYPES[kernel]]:
                KERNELS[kernel](query, key, value, mask)
            if index >= 2:
                samples[kernel].append((time.perf_counter() - began) / LAYERS)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="128,512,2048,8192")
    parser.add_argument("--rows", default="1,2,3,4,5")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kernels", default="sdpa", help=f"comma-separated, of {','.join(KERNELS)}")
    parser.add_argument("--layouts", default="smollm2", help=f"comma-separated, of {','.join(LAYOUTS)}")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    kernels, layouts = args.kernels.split(","), args.layouts.split(",")
    unknown = [name for name in kernels if name not in KERNELS] + [
        name for name in layouts if name not in LAYOUTS
    ]
    if unknown:
        raise SystemExit(
            f"unknown kernel or layout {', '.join(unknown)}: choose from {', '.join([*KERNELS, *LAYOUTS])}"
        )
    threads = fit_threads_to_load()
    before = os.getloadavg()
    command = " ".join(["python experiments/attention_rows.py", *sys.argv[1:]])
    lines = [
        "# Attention per query row on this CPU (issue 19)",
        "",
        f"`{command}`: µs per layer (median of {args.repeats}, each over {LAYERS} distinct caches, the "
        f"kernels interleaved), the ratio to one row, and the GB/s of reading the layer's K/V once; "
        f"head dim {HEAD_DIM}, K/V float32 (bf16 for amx); {threads.reason}.",
        "",
        "| layout (query/K/V heads) | keys | rows | "
        + " | ".join(f"{kernel} µs (× one row, GB/s)" for kernel in kernels)
        + " |",
        "|---|---|---|" + "---|" * len(kernels),
    ]
    for layout in layouts:
        heads, kv_heads = LAYOUTS[layout]
        for keys in (int(k) for k in args.keys.split(",")):
            one: dict[str, float] = {}
            for rows in (int(r) for r in args.rows.split(",")):
                medians = {
                    kernel: statistics.median(times)
                    for kernel, times in per_layer_seconds(
                        kernels, heads, kv_heads, keys, rows, args.repeats
                    ).items()
                }
                one = one or medians
                read = 2 * keys * kv_heads * HEAD_DIM  # elements, each of its cache's dtype
                cells = [
                    f"{1e6 * seconds:.1f} ({seconds / one[kernel]:.2f}, "
                    f"{read * CACHE_DTYPES[kernel].itemsize / seconds / 1e9:.1f})"
                    for kernel, seconds in medians.items()
                ]
                lines.append(
                    f"| {layout} ({heads}/{kv_heads}) | {keys} | {rows} | " + " | ".join(cells) + " |"
                )
                print(lines[-1], flush=True)
    lines += ["", load_line(before, os.getloadavg()), ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
