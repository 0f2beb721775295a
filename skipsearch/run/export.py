"""Export a run's best draft as configs other engines read (`skipsearch export`; README, "Commands").

Formats, each one file, read back after writing to prove it says what was meant:
- `skipsearch`: `skipsearch.json`, the canonical record — any mask, γ, tiers, predictions,
  acceptance, provenance; `skipsearch decode --from` reads it.
- `hf`: `generation_config.json` for transformers' assisted generation with
  `assistant_early_exit` (a contiguous prefix only).
- `skip-layers`: `skip_layers.json`, `{KEY: {"attention": [...], "mlp": [...]}}` keyed the way
  Draft & Verify (`skip_layers[model_name]`) and SWIFT (`f"{model_name}_{task_name}"`) index it
  (any mask); `--export-key` names the one key instead.
- `layerskip`: `layerskip.json`, the flags of LayerSkip's `generate.py` (a contiguous prefix only).
- and `tiers.json`, the CUDA-graph capture manifest, when the run has a tier set.

HF and LayerSkip can only exit early. For a sparse best mask they get the best contiguous mask
the run scored, and say so; with none, asking for them is an error naming the fix. `README.md`
states, per format written, what the target engine can and cannot express.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from skipsearch import __version__
from skipsearch.acceptance.vocab import VocabRanking
from skipsearch.errors import ConfigError, SkipsearchError
from skipsearch.masks import SkipMask, parse_draft_vocab, vocab_label
from skipsearch.run.report import study_dir, write_run_outputs
from skipsearch.search import load_study
from skipsearch.search.stored import load_run, run_trials
from skipsearch.store import (
    BEST_FILE,
    DRAFT_VOCAB_FILE,
    EXPORT_README,
    JOURNAL_FILE,
    RUN_FILE,
    TIERS_FILE,
    write_text_atomic,
)
from skipsearch.tiers.manifest import TierManifest

log = logging.getLogger(__name__)

EXPORT_VERSION = 1
NOTES_FILE = "export_notes.md"  # the prose of every note, per format


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
def load_source(path: Path, study: str | None = None, export_key: str | None = None) -> ExportSource:
    """A run directory or its best.json -> the best draft, a contiguous fallback, tiers if any.

    `study` picks one study of a `compare` directory (its report is written first when missing);
    `export_key` is the one key of `skip_layers.json`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist: pass a run directory (skipsearch run --out) or its best.json"
        )
    run_dir = path if path.is_dir() else path.parent
    best_path = path / BEST_FILE if path.is_dir() else path
    has_run = (run_dir / RUN_FILE).is_file()
    if study is not None:
        if not path.is_dir() or not has_run:
            raise ConfigError(f"--study needs a run or compare directory, not {path}")
        best_path = study_dir(run_dir, study) / BEST_FILE
        write_run_outputs(run_dir, study)  # lists the studies when `study` is not one of them
    elif has_run and not best_path.is_file() and (run_dir / JOURNAL_FILE).is_file():
        load_study(run_dir, load_run(run_dir)[0].strategy)  # a compare directory: names its studies
    if path.is_dir() and not has_run and not best_path.is_file():
        raise ConfigError(
            f"{path} is not a run directory (no run.yaml): pass the --out directory of `skipsearch run`"
        )
    if not best_path.is_file():
        raise ConfigError(
            f"{path} holds no finished run (no {BEST_FILE}): finish it with `skipsearch run --resume --out "
            f"{path}` or rebuild its report with `skipsearch report {path}`"
        )
    best_json = _read_best(best_path)
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


# -- the notes ------------------------------------------------------------------------------------
def parse_notes(text: str) -> dict[str, tuple[str, ...]]:
    """`## section` -> its bullets (continuation lines indented by two spaces joined on)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None and line.startswith("- "):
            current.append(line[2:].strip())
        elif current and line.startswith("  ") and line.strip():
            current[-1] += " " + line.strip()
    return {name: tuple(bullets) for name, bullets in sections.items()}


NOTES = parse_notes(resources.files(__package__).joinpath(NOTES_FILE).read_text(encoding="utf-8"))


def note_values(source: ExportSource, draft: ExportedDraft) -> dict[str, Any]:
    """What the notes' `{placeholders}` stand for."""
    exit_layer = draft.mask.exit_layer
    best = source.best
    return {
        "model": source.model,
        "gamma": draft.gamma,
        "s1": draft.mask.first_divergent_layer,
        "exit_layer": exit_layer,
        "last_draft_layer": None if exit_layer is None else exit_layer - 1,
        "n_tiers": 0 if source.tiers is None else len(source.tiers.masks),
        "tiers_file": TIERS_FILE,
        "keys": _key_list(skip_layer_keys(source)),
        "best_mask": best.mask,
        "trial": draft.trial,
        "speed": f", {draft.speedup:.3f}x predicted" if draft.speedup is not None else "",
        "best_speed": f"{best.speedup:.3f}x" if best.speedup is not None else "its score",
        "draft_vocab": source.draft_vocab,
        "draft_vocab_file": DRAFT_VOCAB_FILE,
    }


def _key_list(keys: tuple[str, ...]) -> str:
    quoted = [f"`{key}`" for key in keys]
    return (
        f"the key {quoted[0]}" if len(quoted) == 1 else f"the keys {', '.join(quoted[:-1])} and {quoted[-1]}"
    )


def notes(section: str, source: ExportSource, draft: ExportedDraft) -> list[str]:
    values = note_values(source, draft)
    return [note.format(**values) for note in NOTES[section]]


# -- the formats ----------------------------------------------------------------------------------
Reader = Callable[[Path, int], tuple[SkipMask, int | None]]


@dataclass(frozen=True)
class Format:
    """A target: its file, whether it needs an early exit, how to write, read back and explain it."""

    name: str
    file: str
    prefix_only: bool
    write: Callable[[ExportSource, ExportedDraft, Path], None]
    read: Reader
    notes: Callable[[ExportSource, ExportedDraft], list[str]]


def _dump(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read {path} ({error}): export it again") from None


def _int(data: Mapping[str, Any], key: str, path: Path, low: int = 1) -> int:
    value = data.get(key) if isinstance(data, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{path}: {key} must be an integer >= {low}, got {value!r}: export it again")
    return value


# skipsearch --------------------------------------------------------------------------------------
def write_skipsearch(source: ExportSource, draft: ExportedDraft, path: Path) -> None:
    best = source.best_json
    mask = draft.mask
    _dump(
        path,
        {
            "format": "skipsearch",
            "version": EXPORT_VERSION,
            "model": source.model,
            "model_source": best.get("model_source"),
            "num_layers": mask.num_layers,
            "mask": str(mask),
            "skipped_attn": sorted(mask.attn),
            "skipped_mlp": sorted(mask.mlp),
            "exit_layer": mask.exit_layer,
            "draft_vocab": vocab_label(source.draft_vocab),
            "draft_vocab_ids": None if source.draft_vocab_ids is None else list(source.draft_vocab_ids),
            "gamma": draft.gamma,
            "gamma_policy": {"kind": "fixed", "gamma": draft.gamma},
            "tiers": None if source.tiers is None else source.tiers.to_dict(),
            "r_draft": best.get("r_draft"),
            "r_reuse": best.get("r_reuse"),
            "objective": best.get("objective"),
            "cost": best.get("cost"),
            "score": best.get("score"),
            "predicted_speedup": best.get("predicted_speedup"),
            "speedup_by_gamma": best.get("speedup_by_gamma"),
            "acceptance": best.get("acceptance"),
            "provenance": {
                "run": None if source.run_dir is None else str(source.run_dir),
                "study": source.study,
                "trial": best.get("trial"),
                "strategy": best.get("strategy"),
                "seed": best.get("seed"),
                "budget": best.get("budget"),
                "prompt_set": best.get("prompt_set"),
                "estimator_mode": best.get("estimator_mode"),
                "reference_cache": best.get("reference_cache"),
                "latency_profile": best.get("latency_profile"),
                "torch": best.get("torch"),
                "transformers": best.get("transformers"),
                "skipsearch": __version__,
            },
            "notes": notes_skipsearch(source, draft),
        },
    )


def read_skipsearch(path: Path, num_layers: int) -> tuple[SkipMask, int | None]:
    data = _load(path)
    if (
        not isinstance(data, dict)
        or data.get("format") != "skipsearch"
        or not isinstance(data.get("mask"), str)
    ):
        raise ConfigError(f"{path} is not a skipsearch export (format/mask missing): export it again")
    mask = SkipMask.parse(data["mask"], _int(data, "num_layers", path))
    if (sorted(mask.attn), sorted(mask.mlp), mask.exit_layer) != (
        data.get("skipped_attn"),
        data.get("skipped_mlp"),
        data.get("exit_layer"),
    ):
        raise ConfigError(f"{path}: skipped_attn / skipped_mlp / exit_layer disagree with mask {mask}")
    return mask, _int(data, "gamma", path)


def notes_skipsearch(source: ExportSource, draft: ExportedDraft) -> list[str]:
    tiers = [] if source.tiers is None else notes("skipsearch-tiers", source, draft)
    vocab = [] if source.draft_vocab is None else notes("skipsearch-draft-vocab", source, draft)
    return [*notes("skipsearch", source, draft), *vocab, *tiers]


def _full_vocab_note(source: ExportSource, draft: ExportedDraft) -> list[str]:
    """Engines without a draft-vocabulary option run the mask with the full head: say so."""
    return [] if source.draft_vocab is None else notes("no-draft-vocab", source, draft)


# hf ----------------------------------------------------------------------------------------------
def write_hf(source: ExportSource, draft: ExportedDraft, path: Path) -> None:
    from transformers import GenerationConfig

    config = GenerationConfig(
        assistant_early_exit=draft.mask.exit_layer,
        num_assistant_tokens=draft.gamma,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
    )
    config.validate(strict=True)
    config.save_pretrained(path.parent)


def read_hf(path: Path, num_layers: int) -> tuple[SkipMask, int | None]:
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(path.parent)
        config.validate(strict=True)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a valid generation config ({error}): export it again") from None
    data = config.to_dict()
    exit_layer = _int(data, "assistant_early_exit", path)
    if exit_layer >= num_layers or config.num_assistant_tokens_schedule != "constant":
        raise ConfigError(
            f"{path}: assistant_early_exit {exit_layer} must be below {num_layers} with a constant schedule"
        )
    return SkipMask.prefix(num_layers, exit_layer), _int(data, "num_assistant_tokens", path)


def notes_hf(source: ExportSource, draft: ExportedDraft) -> list[str]:
    return [*_fallback_note(source, draft), *_full_vocab_note(source, draft), *notes("hf", source, draft)]


# skip-layers -------------------------------------------------------------------------------------
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


def write_skip_layers(source: ExportSource, draft: ExportedDraft, path: Path) -> None:
    entry = {"attention": sorted(draft.mask.attn), "mlp": sorted(draft.mask.mlp)}
    _dump(path, {key: entry for key in skip_layer_keys(source)})


def _is_skip_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == {"attention", "mlp"}
        and all(isinstance(v, list) and all(type(i) is int for i in v) for v in entry.values())
    )


def read_skip_layers(path: Path, num_layers: int) -> tuple[SkipMask, int | None]:
    """Every key's mask; they must agree (one draft under several names)."""
    data = _load(path)
    if not isinstance(data, dict) or not data or not all(_is_skip_entry(e) for e in data.values()):
        raise ConfigError(
            f'{path}: expected {{KEY: {{"attention": [ints], "mlp": [ints]}}}} keyed by model name: '
            "export it again"
        )
    masks = {SkipMask(num_layers, e["attention"], e["mlp"]) for e in data.values()}
    if len(masks) != 1:
        raise ConfigError(f"{path}: its keys hold different masks: export it again")
    return masks.pop(), None


def notes_skip_layers(source: ExportSource, draft: ExportedDraft) -> list[str]:
    return [*_full_vocab_note(source, draft), *notes("skip-layers", source, draft)]


# layerskip ---------------------------------------------------------------------------------------
def layerskip_argv(draft: ExportedDraft) -> list[str]:
    return [
        "--generation_strategy",
        "self_speculative",
        "--exit_layer",
        str(draft.mask.exit_layer),
        "--num_speculations",
        str(draft.gamma),
    ]


def write_layerskip(source: ExportSource, draft: ExportedDraft, path: Path) -> None:
    argv = layerskip_argv(draft)
    _dump(
        path,
        {
            "generation_strategy": "self_speculative",
            "exit_layer": draft.mask.exit_layer,
            "num_speculations": draft.gamma,
            "argv": argv,
            "command": f"torchrun generate.py --model MODEL {' '.join(argv)}",
            "notes": notes_layerskip(source, draft),
        },
    )


def read_layerskip(path: Path, num_layers: int) -> tuple[SkipMask, int | None]:
    data = _load(path)
    exit_layer, gamma = _int(data, "exit_layer", path), _int(data, "num_speculations", path)
    if exit_layer >= num_layers or data.get("generation_strategy") != "self_speculative":
        raise ConfigError(f"{path}: exit_layer must be below {num_layers} with strategy self_speculative")
    draft = ExportedDraft(SkipMask.prefix(num_layers, exit_layer), gamma, None, None)
    if data.get("argv") != layerskip_argv(draft):
        raise ConfigError(f"{path}: argv disagrees with exit_layer / num_speculations: export it again")
    return draft.mask, gamma


def notes_layerskip(source: ExportSource, draft: ExportedDraft) -> list[str]:
    fallback, full_vocab = _fallback_note(source, draft), _full_vocab_note(source, draft)
    return [*fallback, *full_vocab, *notes("layerskip", source, draft)]


def _fallback_note(source: ExportSource, draft: ExportedDraft) -> list[str]:
    return [] if draft.mask == source.best.mask else notes("fallback", source, draft)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("skipsearch", "skipsearch.json", False, write_skipsearch, read_skipsearch, notes_skipsearch),
        Format("hf", "generation_config.json", True, write_hf, read_hf, notes_hf),
        Format(
            "skip-layers", "skip_layers.json", False, write_skip_layers, read_skip_layers, notes_skip_layers
        ),
        Format("layerskip", "layerskip.json", True, write_layerskip, read_layerskip, notes_layerskip),
    )
}
ALL = "all"


# -- exporting ------------------------------------------------------------------------------------
def draft_for(source: ExportSource, fmt: Format) -> ExportedDraft:
    """The best mask, or for an early-exit-only engine the best early exit of the run."""
    if not fmt.prefix_only:
        return source.best
    if source.contiguous is None:
        where = "its best.json has no run beside it" if source.run_dir is None else "no trial exits early"
        raise ConfigError(
            f"format {fmt.name} runs only an early exit but the best mask {source.best.mask} is sparse and "
            f"{where}: export a contiguous run (`skipsearch run --space contiguous --strategy exhaustive`) "
            "or use --format skipsearch or skip-layers"
        )
    return source.contiguous


def export(source: ExportSource, formats: Iterable[str], out: Path) -> list[Exported]:
    """Write and read back every requested format, then README.md; `all` skips (and notes) the
    early-exit formats a sparse-only run cannot fill, where asking for one by name is an error."""
    names = list(formats)
    unknown = [n for n in names if n != ALL and n not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown export format {unknown[0]!r}: use one of {', '.join([*FORMATS, ALL])}")
    wanted = list(FORMATS) if ALL in names else names
    drafts: dict[str, ExportedDraft] = {}
    skipped: dict[str, str] = {}
    for name in wanted:
        try:
            drafts[name] = draft_for(source, FORMATS[name])
        except ConfigError as why:
            if ALL not in names:
                raise
            skipped[name] = str(why)
    out.mkdir(parents=True, exist_ok=True)
    exported = [_write(source, FORMATS[name], draft, out) for name, draft in drafts.items()]
    if source.tiers is not None:
        exported.append(_write_tiers(source.tiers, out))
    write_text_atomic(out / EXPORT_README, readme(source, exported, skipped))
    for name, why in skipped.items():
        log.warning("format %s not written: %s", name, why)
    return exported


def _write(source: ExportSource, fmt: Format, draft: ExportedDraft, out: Path) -> Exported:
    path = out / fmt.file
    fmt.write(source, draft, path)
    mask, gamma = fmt.read(path, source.num_layers)
    if mask != draft.mask or gamma not in (None, draft.gamma):
        raise SkipsearchError(f"{path} reads back as {mask} γ={gamma}, not {draft.mask} γ={draft.gamma}")
    return Exported(fmt.name, path, draft, tuple(fmt.notes(source, draft)))


def _write_tiers(manifest: TierManifest, out: Path) -> Exported:
    path = out / TIERS_FILE
    manifest.save(path)
    if TierManifest.load(path) != manifest:
        raise SkipsearchError(f"{path} does not read back as the run's tier set")
    values = {
        "n_tiers": len(manifest.masks),
        "gammas": list(manifest.gammas),
        "window": manifest.policy.window,
        "thresholds": [round(t, 3) for t in manifest.policy.thresholds],
    }
    return Exported("tiers", path, None, tuple(note.format(**values) for note in NOTES["tiers"]))


def readme(source: ExportSource, exported: list[Exported], skipped: Mapping[str, str]) -> str:
    lines = [
        f"# skipsearch export: {source.model}",
        "",
        f"Best mask `{source.best.mask}` at γ = {source.best.gamma} from {source.path}"
        + (f" (study `{source.study}`)." if source.study else "."),
        "",
    ]
    for item in exported:
        lines += [f"## {item.format}: `{item.path.name}`", "", *(f"- {note}" for note in item.notes), ""]
    for name, why in skipped.items():
        lines += [f"## {name}: not written", "", f"- {why}", ""]
    return "\n".join(lines)
