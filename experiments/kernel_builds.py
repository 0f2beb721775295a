"""One of skipsearch's C kernels against its build at another git revision, paired in one process (issue 19).

The kernels promise a fixed order of operations (a row's output does not depend on the rows that
share its call), so a rewrite of their loops for speed must leave every output bit for bit as it
was. This experiment checks that and times the two builds at the shapes a decode uses:

- `--kernel products` (`cpu/linear_rows.c`): every distinct projection shape of the model (read
  from its shipped config; random weights, packed as the plan packs them) at each row count, with
  enough copies of each matrix that every call reads its weights from memory, as a step does;
- `--kernel attention` (`cpu/decode_attention_fp32.c`): the model's head layout over random
  float32 caches at each key count and query count, one layer's cache per call, 8 distinct caches
  streamed per sample.

The two builds alternate sample by sample (the order flips every repeat); the report gives each
build's median µs per call, the median of the paired ratios (working tree ÷ revision) and their
range, and whether the outputs were identical.

    python experiments/kernel_builds.py --kernel products --against 573db0d --model qwen2.5-coder-0.5b
    python experiments/kernel_builds.py --kernel attention --against 880dd50 --model smollm2-135m

Run it alone; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
from _common import markdown_table, write_report
from _load import load_line

from skipsearch.cpu import bf16_weights, decode_attention
from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native
from skipsearch.cpu.threads import fit_threads_to_load
from skipsearch.models.random_weights import architecture_config, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "kernels"
STREAM_BYTES = 256 * 2**20  # copies of a matrix per sample: more than any cache holds
CACHES = 8  # distinct K/V caches per attention sample


def source_at(source: KernelSource, revision: str, directory: Path) -> KernelSource:
    """`source` as it was at git `revision`: its C file and the headers it had then (a header
    added since is not one the old file includes), written side by side into `directory`."""

    def fetch(path: Path) -> Path | None:
        shown = subprocess.run(
            ["git", "show", f"{revision}:{path.relative_to(ROOT)}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        if shown.returncode != 0:
            return None
        (directory / path.name).write_bytes(shown.stdout)
        return directory / path.name

    file = fetch(source.path)
    if file is None:
        raise ValueError(f"{source.path.name} is not at revision {revision!r}")
    headers = tuple(header for header in map(fetch, source.headers) if header is not None)
    return dataclasses.replace(source, path=file, headers=headers)


@contextmanager
def using(kernel: str, library: NativeLibrary) -> Iterator[None]:
    """The package's calls to `kernel` go to `library` inside the block."""
    if kernel == "products":
        with mock.patch.object(bf16_weights, "load_kernel", lambda: library):
            yield
    else:
        with mock.patch.object(decode_attention, "load_kernel", lambda dtype=torch.float32: library):
            yield


def product_cases(
    config: dict, rows: list[int]
) -> Iterator[tuple[str, Callable[[], list[torch.Tensor]], float]]:
    """(label, a sample's calls, calls per sample) for every projection shape at every row count."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {
        "q / o": (hidden, heads * head_dim),
        "k / v": (hidden, config["num_key_value_heads"] * head_dim),
        "gate / up": (hidden, config["intermediate_size"]),
        "down": (config["intermediate_size"], hidden),
        "head": (hidden, config["vocab_size"]),
    }
    generator = torch.Generator().manual_seed(0)
    for name, (inputs, outputs) in shapes.items():
        copies = max(1, STREAM_BYTES // (2 * inputs * outputs))
        weight = torch.randn(outputs, inputs, generator=generator) / inputs**0.5
        modules = [bf16_weights.Bf16WeightLinear(weight, None) for _ in range(copies)]
        for count in rows:
            x = torch.randn(1, count, inputs, generator=generator)
            yield (
                f"{name} {inputs}→{outputs}, {count} row{'s' * (count > 1)}",
                lambda x=x, modules=modules: [module(x) for module in modules],
                copies,
            )


def attention_cases(
    config: dict, keys: list[int], queries: list[int]
) -> Iterator[tuple[str, Callable[[], list[torch.Tensor]], float]]:
    """(label, a sample's calls, calls per sample) for every key count and query count."""
    hidden, heads, kv_heads = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    head_dim = config.get("head_dim") or hidden // heads
    generator = torch.Generator().manual_seed(0)
    for length in keys:
        caches = [
            [torch.randn(1, kv_heads, length, head_dim, generator=generator) for _ in range(2)]
            for _ in range(CACHES)
        ]
        for count in queries:
            query = torch.randn(1, heads, count, head_dim, generator=generator)
            yield (
                f"{length} keys, {count} quer{'ies' if count > 1 else 'y'}",
                lambda query=query, caches=caches: [
                    decode_attention.decode_attention(query, key, value, scale=head_dim**-0.5)
                    for key, value in caches
                ],
                CACHES,
            )


def timed(
    kernel: str, library: NativeLibrary, sample: Callable[[], list[torch.Tensor]]
) -> tuple[float, list]:
    """Seconds one sample takes on `library`'s build, and its outputs."""
    with using(kernel, library):
        began = time.perf_counter()
        outputs = sample()
        return time.perf_counter() - began, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=("products", "attention"), required=True)
    parser.add_argument("--against", required=True, help="the git revision whose build is the baseline")
    parser.add_argument("--model", default="smollm2-135m", choices=shipped_configs())
    parser.add_argument("--rows", default="1,2,3,4,5,6,8", help="products: rows per call")
    parser.add_argument("--keys", default="512,2048,8000", help="attention: cache lengths")
    parser.add_argument("--queries", default="1,2,3,4,5", help="attention: queries per call")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--suffix", default="", help="appended to the report's name (another CPU)")
    parser.add_argument("--out", type=Path, default=OUT, help="the report's folder")
    args = parser.parse_args()
    threads = fit_threads_to_load()
    before = os.getloadavg()
    products = args.kernel == "products"
    source = bf16_weights.kernel_source() if products else decode_attention.SOURCES[torch.float32]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    built_from = [str(path) for path in (source.path, *source.headers)]
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *built_from], cwd=ROOT).returncode != 0
    tree = f"{head.strip()}{' + uncommitted changes' if dirty else ''}"
    with tempfile.TemporaryDirectory() as directory:
        try:
            baseline = source_at(source, args.against, Path(directory))
        except ValueError as error:
            parser.error(f"{error}; give a revision that has it (git log -- {source.path.relative_to(ROOT)})")
        libraries = {"tree": load_native(source), "revision": load_native(baseline)}
    for name, library in libraries.items():
        if library.function is None:
            parser.error(f"the {name}'s {args.kernel} kernel does not load here: {library.reason}")
    config = architecture_config(args.model)
    cases = (
        product_cases(config, [int(r) for r in args.rows.split(",")])
        if args.kernel == "products"
        else attention_cases(
            config, [int(k) for k in args.keys.split(",")], [int(q) for q in args.queries.split(",")]
        )
    )
    rows = []
    for label, sample, calls in cases:
        seconds: dict[str, list[float]] = {"tree": [], "revision": []}
        outputs: dict[str, list] = {}
        for repeat in range(args.repeats + 1):
            for name in ("tree", "revision") if repeat % 2 else ("revision", "tree"):
                spent, outputs[name] = timed(args.kernel, libraries[name], sample)
                if repeat:  # the first round warms both builds up
                    seconds[name].append(spent / calls)
        same = all(torch.equal(a, b) for a, b in zip(outputs["tree"], outputs["revision"], strict=True))
        ratios = sorted(t / r for t, r in zip(seconds["tree"], seconds["revision"], strict=True))
        rows.append([
            label,
            f"{1e6 * statistics.median(seconds['revision']):.1f}",
            f"{1e6 * statistics.median(seconds['tree']):.1f}",
            f"**{statistics.median(ratios):.2f}** ({ratios[0]:.2f}–{ratios[-1]:.2f})",
            "yes" if same else "**no**",
        ])  # fmt: skip
        print(" | ".join(rows[-1]), flush=True)
    lines = [
        f"# The {args.kernel} kernel: the working tree against {args.against}, {args.model}",
        "",
        f"`{' '.join(['python', 'experiments/kernel_builds.py', *sys.argv[1:]])}`. Working tree at {tree}; "
        f"{source.path.name} built from both; "
        f"{threads.reason}. Median µs per call of {args.repeats} paired samples, the builds alternating.",
        "",
        *markdown_table(
            ["case", f"{args.against} µs", "tree µs", "tree ÷ revision (pairs)", "same bits"], rows
        ),
        "",
        load_line(before, os.getloadavg()) + ".",
        "",
    ]
    write_report(args.out / f"builds-{args.kernel}-{args.model}{args.suffix}.md", lines, show=False)


if __name__ == "__main__":
    main()
