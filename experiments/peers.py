"""llama.cpp's decoding speed on the GGUF files skipsearch reads: the peer beside our engine's numbers.

Builds `llama-bench` from the llama.cpp source vendored in the pinned llama-cpp-python sdist (PyPI
ships llama-cpp-python as source only; `pip download` fetches it, its sha256 is checked), Release,
`GGML_NATIVE=ON`, once per version and CPU under `<cache>/peers/` (reused when present; built with
`nice -n 19` on `--jobs` cores, ~10 minutes on two). Then, per model of skipsearch's registry, it
runs `llama-bench -m GGUF -t THREADS -p 0 -n NEW -d CONTEXT -r REPEATS -o json`: NEW tokens decoded
one at a time after CONTEXT tokens already in the KV cache (`-d`, llama-bench's "decode at depth"),
and prints a Markdown table with the CPU, its flags and the load average before and after.

    python experiments/peers.py                               # both models, table on stdout
    python experiments/peers.py --models smollm2-135m --repeats 3
    python experiments/peers.py --out results/peers/<cpu>.md  # also written to a file
    python experiments/peers.py --ggufs R/exports/draft.gguf  # an exported draft beside the models

Run it alone on an idle machine when the numbers are to mean anything: llama.cpp's threads share the
cores with whatever else runs. Nothing is written outside the cache unless `--out` is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import markdown_table
from _load import load_line

from skipsearch.cpu.dtypes import cpu_flags, describe_cpu
from skipsearch.store import cache_dir

LLAMA_CPP_PYTHON = "0.3.36"  # the newest on PyPI when pinned; its vendor/llama.cpp is what is built
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDORED = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp"
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)
VECTOR_FLAGS = ("avx", "amx", "fma", "f16c", "sse4")


class Refusal(Exception):
    """What stops the experiment before it measures: one line, exit 2."""


# -- the build ------------------------------------------------------------------------------------
def build_tools(which=shutil.which) -> dict[str, str]:
    """The C and C++ compilers, cmake and a build tool (ninja, else make), or a `Refusal` naming
    what is missing and how to get it."""
    found = {
        "cc": os.environ.get("CC") or which("cc") or which("gcc") or which("clang"),
        "c++": os.environ.get("CXX") or which("c++") or which("g++") or which("clang++"),
        "cmake": which("cmake"),
        "build": which("ninja") or which("make"),
    }
    missing = [name if name != "build" else "ninja (or make)" for name, path in found.items() if not path]
    if missing:
        raise Refusal(
            f"cannot build llama.cpp: no {', '.join(missing)} on PATH; install them "
            "(e.g. `apt-get install build-essential cmake ninja-build`) and run it again"
        )
    return {name: str(path) for name, path in found.items()}


def build_dir(root: Path, flags: frozenset[str] | None) -> Path:
    """One build per llama-cpp-python version and CPU: `GGML_NATIVE` compiles for this CPU's flags."""
    digest = hashlib.sha256(" ".join(sorted(flags or ())).encode()).hexdigest()[:10]
    return root / f"llama.cpp-{LLAMA_CPP_PYTHON}-{digest}"


def fetch_sdist(root: Path) -> Path:
    """The pinned sdist under `root`, downloaded with pip where missing and checked by its sha256."""
    path = root / SDIST
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"),
                *("--no-binary", ":all:", "--no-deps", "--quiet", "-d", str(root)),
            ],
            check=True,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        path.unlink()
        raise Refusal(f"{path} has sha256 {digest}, not the pinned {SDIST_SHA256}: run it again to fetch it")
    return path


def build_llama_bench(root: Path, jobs: int) -> Path:
    """`llama-bench`, built once under `root` (the source, then `build/bin/llama-bench`)."""
    tools = build_tools()
    target = build_dir(root, cpu_flags())
    binary = target / "build" / "bin" / "llama-bench"
    if binary.is_file():
        return binary
    sdist = fetch_sdist(root)
    source = target / "src"
    if not (source / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory(dir=root) as scratch, tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(VENDORED + "/")]
            archive.extractall(scratch, members=members, filter="data")
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(source, ignore_errors=True)
            os.replace(Path(scratch) / VENDORED, source)
    generator = "Ninja" if Path(tools["build"]).name == "ninja" else "Unix Makefiles"
    env = {**os.environ, "CC": tools["cc"], "CXX": tools["c++"]}
    nice = ["nice", "-n", "19"]
    configure = [tools["cmake"], "-S", str(source), "-B", str(target / "build"), "-G", generator]
    subprocess.run([*nice, *configure, *CMAKE_FLAGS], check=True, env=env)
    compile_ = [tools["cmake"], "--build", str(target / "build"), "--target", "llama-bench", "-j", str(jobs)]
    subprocess.run([*nice, *compile_], check=True, env=env)
    return binary


# -- the measurement ------------------------------------------------------------------------------
def bench_argv(
    binary: Path, gguf: Path, threads: int, context: int, new_tokens: int, repeats: int
) -> list[str]:
    """Decode `new_tokens` one at a time after `context` tokens in the KV cache (`-d`), no prompt test."""
    return [
        str(binary),
        *("-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(new_tokens)),
        *("-d", str(context), "-r", str(repeats), "-o", "json"),
    ]


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: what ran and its tokens per second over the repeats."""

    model: str
    gguf_type: str
    context: int
    new_tokens: int
    threads: int
    samples: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def std(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0


def parse_bench(text: str, model: str) -> list[BenchRow]:
    """llama-bench's `-o json` (a list of tests) as rows; its `model_type` is the architecture, the
    size and the GGUF's type (`llama 135M Q4_1`, `qwen2 0.5B Q4_K - Medium`); tests with a prompt
    part are not decode tests and are left out."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as error:
        raise Refusal(f"llama-bench printed no JSON ({error}): run its command by hand to see why") from None
    rows = []
    for test in tests:
        if test["n_prompt"] or not test["n_gen"]:
            continue
        samples = tuple(float(s) for s in test["samples_ts"]) or (float(test["avg_ts"]),)
        gguf_type = str(test["model_type"]).split(" ", 2)[-1]
        shape = (int(test["n_depth"]), int(test["n_gen"]), int(test["n_threads"]))
        rows.append(BenchRow(model, gguf_type, *shape, samples))
    return rows


def vector_flags(flags: frozenset[str] | None) -> str:
    return " ".join(sorted(f for f in flags or () if f.startswith(VECTOR_FLAGS))) or "unreadable"


def table(
    rows: Sequence[BenchRow],
    cpu: str,
    flags: frozenset[str] | None,
    load_before: Sequence[float],
    load_after: Sequence[float],
    command: str,
) -> list[str]:
    """The report: what ran, on which CPU and under what load, and one line per model and test."""
    header = ["model", "GGUF type", "context", "new tokens", "threads", "repeats", "tok/s (mean ± std)"]
    body = [
        [r.model, r.gguf_type, str(r.context), str(r.new_tokens), str(r.threads), str(len(r.samples)),
         f"{r.mean:.1f} ± {r.std:.1f}"]
        for r in rows
    ]  # fmt: skip
    return [
        f"# llama.cpp decoding (llama-cpp-python {LLAMA_CPP_PYTHON}'s vendored llama.cpp, llama-bench)",
        "",
        f"`{command}`",
        "",
        f"CPU: {cpu}; vector flags: {vector_flags(flags)}. {load_line(load_before, load_after)}.",
        "",
        *markdown_table(header, body),
        "",
    ]


def model_ggufs(names: Sequence[str]) -> dict[str, Path]:
    """The GGUF file behind each registry alias (joined on first use for an assembled one)."""
    from skipsearch.models.loading import resolve_gguf
    from skipsearch.models.registry import REGISTRY

    unknown = [n for n in names if n not in REGISTRY or REGISTRY[n].kind == "hub"]
    if unknown:
        gguf_aliases = [a for a, e in REGISTRY.items() if e.kind != "hub"]
        raise Refusal(f"--models {unknown[0]} has no GGUF in the registry: use {' or '.join(gguf_aliases)}")
    return {name: resolve_gguf(REGISTRY[name]) for name in names}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="registry aliases with a GGUF")
    parser.add_argument(
        "--ggufs",
        nargs="+",
        type=Path,
        default=[],
        help="more GGUF files (e.g. `export --format gguf-draft`'s)",
    )
    parser.add_argument("--threads", type=int, default=2, help="llama-bench -t (default 2)")
    parser.add_argument("--context", type=int, default=256, help="tokens cached before decoding (-d)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens decoded per repeat (-n)")
    parser.add_argument("--repeats", type=int, default=5, help="llama-bench -r (default 5)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the build (default 2)")
    parser.add_argument("--build-only", action="store_true", help="build llama-bench and print its path")
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.ggufs if not path.is_file()]
    if missing:
        parser.error(f"--ggufs {missing[0]} is not a file: pass a .gguf file")
    for name in ("threads", "context", "new_tokens", "repeats", "jobs"):
        low = 0 if name == "context" else 1
        if getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ggufs = {} if args.build_only else model_ggufs(args.models)
        ggufs |= {path.name: path for path in args.ggufs}
        binary = build_llama_bench(cache_dir() / "peers", args.jobs)
        if args.build_only:
            print(binary)
            return 0
        before, rows, commands = os.getloadavg(), [], []
        for name, gguf in ggufs.items():
            argv_ = bench_argv(binary, gguf, args.threads, args.context, args.new_tokens, args.repeats)
            commands.append(" ".join(argv_))
            done = subprocess.run(argv_, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise Refusal(f"llama-bench failed on {gguf} (exit {done.returncode}: {reason})")
            rows += parse_bench(done.stdout, name)
        after = os.getloadavg()
    except Refusal as why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        step = " ".join(str(part) for part in error.cmd[:4])
        print(f"error: `{step} ...` failed (exit {error.returncode}): its output is above", file=sys.stderr)
        return 1
    lines = table(rows, describe_cpu(), cpu_flags(), before, after, "; ".join(commands))
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
