"""Helpers shared by the engine experiments (`fidelity.py`, `engine_vs_hf.py`, `bottleneck_shares.py`).

Not an experiment itself: thread setup, model + prompt loading, the end-of-sequence ids and the
CSV / Markdown writers, so the three scripts differ only in what they measure (and what they
compute comes from the library: `skipsearch.validate`, `skipsearch.bench`).
The scripts run as `python experiments/<name>.py`, which puts this folder on `sys.path`.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
from skipsearch.acceptance.worker import Measurement, prepare
from skipsearch.models.loading import LoadedModel, eos_ids, load_model
from skipsearch.models.runner import LayerwiseRunner

MODEL = "smollm2-135m"
RESULTS = Path(__file__).resolve().parents[1] / "results"
DEFAULT_THREADS = 1


def configure(threads: int) -> str:
    """Pin torch's intra-op threads and set up logging; returns a line for the reports.

    The machine's two cores are shared with other jobs: one thread per process keeps timings far
    steadier than two threads fighting the neighbours for the same cores.
    """
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return (
        f"torch {torch.__version__}, {threads} intra-op thread(s) (torch.set_num_threads), "
        f"{torch.get_num_interop_threads()} inter-op"
    )


@dataclass
class Setup:
    """A loaded model, the encoded prompts, the end-of-sequence ids and, if built, the estimator."""

    loaded: LoadedModel
    runner: LayerwiseRunner
    spec: PromptSpec
    prompts: list[tuple[int, ...]]
    eos_ids: frozenset[int]
    measurement: Measurement | None = None

    @property
    def estimator_data(self) -> Measurement:
        if self.measurement is None:
            raise ValueError("this Setup was loaded without a ReferenceCache: load(spec, reference=True)")
        return self.measurement


def load(spec: PromptSpec, mode: str = "shared-kv", reference: bool = True) -> Setup:
    """The embedded model and `spec`'s prompts; with `reference`, `prepare` also builds (or reuses)
    the ReferenceCache and estimator — a `shared-kv` reference serves `self` mode too."""
    if reference:
        measurement = prepare(MeasureConfig(MODEL, prompts=spec, mode=mode))
        loaded, runner = measurement.loaded, measurement.runner
    else:
        measurement, loaded = None, load_model(MODEL)
        runner = LayerwiseRunner(loaded.model)
    prompts = [p.ids for p in encode_prompts(spec, loaded.tokenizer)]
    return Setup(loaded, runner, spec, prompts, eos_ids(loaded.model), measurement)


def encode(setup: Setup, spec: PromptSpec) -> list[tuple[int, ...]]:
    """More prompts for an already loaded model (no reference cache is built for them)."""
    return [p.ids for p in encode_prompts(spec, setup.loaded.tokenizer)]


class Stamp:
    """Wall time and load average around a measurement: on shared cores, the context of every number."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.load_before = os.getloadavg()

    def finish(self) -> dict[str, Any]:
        return {
            "load_before": " ".join(f"{x:.1f}" for x in self.load_before),
            "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "minutes": (time.perf_counter() - self.began) / 60,
        }


def stamp_line(meta: Mapping[str, Any]) -> str:
    return (
        f"Load average (1/5/15 min) {meta['load_before']} before, {meta['load_after']} after; "
        f"wall time {meta['minutes']:.1f} min."
    )


# -- writers -------------------------------------------------------------------------------------


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of dicts (all with the first row's keys) as CSV; floats rounded to 6 significant digits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})


def write_report(path: Path, lines: Sequence[str], show: bool = True) -> None:
    """A Markdown report's lines to `path` (its folder made), printed first where `show`."""
    text = "\n".join(lines)
    if show:
        print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """GitHub Markdown table lines: first column left-aligned, the rest right-aligned."""
    align = "|:---|" + "---:|" * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", align, *("| " + " | ".join(row) + " |" for row in rows)]


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def experiment_parser(doc: str, out: Path) -> argparse.ArgumentParser:
    """Options every engine experiment takes: thread count, output folder, report-only rerun."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=out, help="output folder (default %(default)s)")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the outputs from the saved measurements.json"
    )
    return parser
