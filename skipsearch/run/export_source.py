"""What an export is made of, read from a run directory or its best.json (`skipsearch export`):
the best draft, the run's best contiguous draft for early-exit-only engines, and its tier set."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skipsearch.acceptance.vocab import VocabRanking
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask, parse_draft_vocab
from skipsearch.run.report import study_dir, write_run_outputs
from skipsearch.search import load_study
from skipsearch.search.stored import load_run, run_trials
from skipsearch.store import BEST_FILE, DRAFT_VOCAB_FILE, JOURNAL_FILE, RUN_FILE, TIERS_FILE
from skipsearch.tiers.manifest import TierManifest

EXPORT_VERSION = 1


@dataclass(frozen=True)
class ExportedDraft:
    """One exportable draft: a mask, its draft length and what the search predicted for it."""

    mask: SkipMask
    gamma: int
    speedup: float | None
    trial: int | None


@dataclass(frozen=True)
class ExportSource:
    """What an export is made of: the run's best.json, its best contiguous draft, its tiers."""

    path: Path
    run_dir: Path | None
    best_json: Mapping[str, Any]
    best: ExportedDraft
    contiguous: ExportedDraft | None
    tiers: TierManifest | None
    study: str | None
    export_key: str | None = None
    draft_vocab_ids: tuple[int, ...] | None = None
    gguf_type: str | None = None  # gguf-draft: every kept layer at this type (None: the draft's own)

    @property
    def num_layers(self) -> int:
        return self.best.mask.num_layers

    @property
    def model(self) -> str:
        return str(self.best_json["model"])

    @property
    def draft_vocab(self) -> int | None:
        """The best draft's vocabulary size (None: full); runs from before vocabularies say none."""
        return parse_draft_vocab(self.best_json.get("draft_vocab"))


@dataclass(frozen=True)
class Exported:
    """One written file, already read back; `notes` say what its engine can and cannot do."""

    format: str
    path: Path
    draft: ExportedDraft | None
    notes: tuple[str, ...]


# -- reading the run ------------------------------------------------------------------------------
def load_source(
    path: Path, study: str | None = None, export_key: str | None = None, gguf_type: str | None = None
) -> ExportSource:
    """A run directory or its best.json -> the best draft, a contiguous fallback, tiers if any.

    `study` picks one study of a `compare` directory (its report is written first when missing);
    `export_key` is the one key of `skip_layers.json`, `gguf_type` the type of the draft GGUF's
    weights."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist: pass a run directory (skipsearch run --out) or its best.json"
        )
    run_dir = path if path.is_dir() else path.parent
    best_path = path / BEST_FILE if path.is_dir() else path
    has_run = (run_dir / RUN_FILE).is_file()
    summary: dict[str, Any] = {}
    if study is not None:
        if not path.is_dir() or not has_run:
            raise ConfigError(f"--study needs a run or compare directory, not {path}")
        best_path = study_dir(run_dir, study) / BEST_FILE
        summary = write_run_outputs(run_dir, study, write=False).summary  # lists the studies if not one
    elif has_run and not best_path.is_file() and (run_dir / JOURNAL_FILE).is_file():
        load_study(run_dir, load_run(run_dir)[0].strategy)  # a compare directory: names its studies
    if path.is_dir() and not has_run and not best_path.is_file():
        raise ConfigError(
            f"{path} is not a run directory (no run.yaml): pass the --out directory of `skipsearch run`"
        )
    if study is None and not best_path.is_file():
        raise ConfigError(
            f"{path} holds no finished run (no {BEST_FILE}): finish it with `skipsearch run --resume --out "
            f"{path}` or rebuild its report with `skipsearch report {path}`"
        )
    best_json = summary if study is not None else _read_best(best_path)
    best = ExportedDraft(
        SkipMask.parse(best_json["mask"], int(best_json["num_layers"])),
        int(best_json["gamma_best"]),
        best_json.get("score"),
        best_json.get("trial"),
    )
    tiers_path = run_dir / TIERS_FILE
    vocab = parse_draft_vocab(best_json.get("draft_vocab"))
    if vocab is not None and not (run_dir / DRAFT_VOCAB_FILE).is_file():
        raise ConfigError(
            f"{best_path} drafts from {vocab} token ids but {run_dir / DRAFT_VOCAB_FILE} (the ranking "
            "they come from) is missing: export from the run directory that holds it"
        )
    ids = None if vocab is None else VocabRanking.load(run_dir / DRAFT_VOCAB_FILE).top(vocab)
    return ExportSource(
        path=path,
        run_dir=run_dir if has_run else None,
        best_json=best_json,
        best=best,
        contiguous=best if _is_prefix(best.mask) else (_best_contiguous(run_dir) if has_run else None),
        tiers=TierManifest.load(tiers_path) if tiers_path.is_file() else None,
        study=study or (_study_name(run_dir) if has_run else None),
        export_key=export_key,
        draft_vocab_ids=ids,
        gguf_type=gguf_type,
    )


def _read_best(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read {path} ({error}): rebuild it with `skipsearch report RUN`") from None
    missing = [
        k
        for k in ("model", "mask", "num_layers", "gamma_best")
        if not isinstance(data, dict) or k not in data
    ]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: pass the best.json of a `skipsearch run`")
    return data


def _is_prefix(mask: SkipMask) -> bool:
    """An early exit at `E < L`: what HF and LayerSkip can run."""
    return mask.exit_layer is not None and mask.exit_layer < mask.num_layers


def _best_contiguous(run_dir: Path) -> ExportedDraft | None:
    """The highest-scoring early exit any study of the run scored, or None."""
    prefixes = [r for r in run_trials(run_dir) if _is_prefix(r.skip_mask)]
    if not prefixes:
        return None
    record = max(prefixes, key=lambda r: (r.score, -r.number))
    return ExportedDraft(record.skip_mask, record.gamma_best, record.score, record.number)


def _study_name(run_dir: Path) -> str:
    return load_run(run_dir)[0].strategy


def model_name(model: str) -> str:
    """The name research code keys a model by: the last part of a hub id or path, no `.gguf`."""
    name = Path(model.rstrip("/")).name
    return name.removesuffix(".gguf") or model


def skip_layer_keys(source: ExportSource) -> tuple[str, ...]:
    """`--export-key`, else Draft & Verify's `model_name` and SWIFT's `model_name_task_name`
    (the task: the run's prompt source, e.g. `humaneval`)."""
    if source.export_key is not None:
        return (source.export_key,)
    name = model_name(source.model)
    task = str(source.best_json.get("prompt_set") or "task").rsplit("-", 1)[0]
    return (name, f"{name}_{task}")
