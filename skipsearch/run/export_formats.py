"""The export formats, one writer, reader and set of notes each (`run.export` writes them).

- `skipsearch`: `skipsearch.json`, the canonical record — any mask, γ, tiers, predictions,
  acceptance, provenance; `skipsearch decode --from` reads it.
- `hf`: `generation_config.json` for transformers' assisted generation with
  `assistant_early_exit` (a contiguous prefix only).
- `skip-layers`: `skip_layers.json`, `{KEY: {"attention": [...], "mlp": [...]}}` keyed the way
  Draft & Verify (`skip_layers[model_name]`) and SWIFT (`f"{model_name}_{task_name}"`) index it
  (any mask); `--export-key` names the one key instead.
- `layerskip`: `layerskip.json`, the flags of LayerSkip's `generate.py` (a contiguous prefix only).
- `gguf-draft`: `draft.gguf`, the layers the draft keeps cut from the model's own GGUF, a separate
  draft model for llama.cpp (`-md`; whole layers only, any precision: `models.gguf_draft`). Not
  part of `all`: it is a weights file, written only when asked for.

The notes — what each target engine can and cannot express — are prose in `export_notes.md`, read
and filled in by `run.export_notes`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask, vocab_label
from skipsearch.models.gguf_draft import (
    AUTO,
    kept_layers,
    read_draft_gguf,
    source_gguf,
    whole_layer_refusal,
    write_draft_gguf,
)
from skipsearch.run.export_notes import (
    NOTES,
    fallback_note,
    full_vocab_note,
    no_tree_note,
    notes,
    tree_label,
)
from skipsearch.run.export_source import EXPORT_VERSION, ExportedDraft, ExportSource, skip_layer_keys
from skipsearch.store import write_text_atomic


def skipsearch_version() -> str:
    """The installed package's version (pyproject's), as the canonical export records it; read
    from the package's metadata, so this module below the API imports nothing above it."""
    try:
        return metadata.version("skipsearch")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


# -- the formats ----------------------------------------------------------------------------------
Reader = Callable[[Path, int], tuple[SkipMask, int | None]]


def _no_check(source: ExportSource, draft: ExportedDraft) -> None:
    """Most formats hold any draft their `prefix_only` and `precision` admit."""


@dataclass(frozen=True)
class Format:
    """A target: its file, whether it needs an early exit, how to write, read back and explain it,
    whether it can say that a sub-layer runs at lower precision (`precision`), what else it refuses
    before anything is written (`check`) and whether `--format all` writes it (`in_all`)."""

    name: str
    file: str
    prefix_only: bool
    write: Callable[[ExportSource, ExportedDraft, Path], None]
    read: Reader
    notes: Callable[[ExportSource, ExportedDraft], list[str]]
    precision: bool = False
    check: Callable[[ExportSource, ExportedDraft], None] = _no_check
    in_all: bool = True


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
            "int8_attn": sorted(mask.attn_int8),
            "int8_mlp": sorted(mask.mlp_int8),
            "int4_attn": sorted(mask.attn_int4),
            "int4_mlp": sorted(mask.mlp_int4),
            "exit_layer": mask.exit_layer,
            "draft_vocab": vocab_label(source.draft_vocab),
            "draft_vocab_ids": None if source.draft_vocab_ids is None else list(source.draft_vocab_ids),
            "gamma": draft.gamma,
            "gamma_policy": {"kind": "fixed", "gamma": draft.gamma},
            "tree": tree_label(source),
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
                "skipsearch": skipsearch_version(),
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
    tree = [] if tree_label(source) is None else notes("skipsearch-tree", source, draft)
    return [*notes("skipsearch", source, draft), *vocab, *tree, *tiers]


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
    fallbacks = [
        *fallback_note(source, draft),
        *full_vocab_note(source, draft),
        *no_tree_note(source, draft),
    ]
    return [*fallbacks, *notes("hf", source, draft)]


# skip-layers -------------------------------------------------------------------------------------
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
    return [
        *full_vocab_note(source, draft),
        *no_tree_note(source, draft),
        *notes("skip-layers", source, draft),
    ]


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
    fallback, full_vocab = fallback_note(source, draft), full_vocab_note(source, draft)
    return [*fallback, *full_vocab, *no_tree_note(source, draft), *notes("layerskip", source, draft)]


# gguf-draft --------------------------------------------------------------------------------------
def check_gguf_draft(source: ExportSource, draft: ExportedDraft) -> None:
    """Whole layers only, and a model that came from a GGUF (resolved now: an HF model is refused)."""
    refusal = whole_layer_refusal(draft.mask)
    if refusal is not None:
        raise ConfigError(refusal)
    source_gguf(source.model, source.best_json.get("model_source"))


def write_gguf_draft(source: ExportSource, draft: ExportedDraft, path: Path) -> None:
    model_gguf = source_gguf(source.model, source.best_json.get("model_source"))
    write_draft_gguf(model_gguf, draft.mask, draft.gamma, source.gguf_type or AUTO, path)


def _gguf_values(source: ExportSource, draft: ExportedDraft) -> dict[str, Any]:
    """The draft GGUF's notes' values: the layers dropped, the weights and the run's acceptance."""
    dropped = sorted(draft.mask.skipped_layers)
    acceptance = source.best_json.get("acceptance") or {}
    per_round = (acceptance.get("tokens_per_round") or {}).get(str(draft.gamma))
    alpha = acceptance.get("alpha")
    return {
        "n_kept": len(kept_layers(draft.mask)),
        "last_block": len(kept_layers(draft.mask)) - 1,
        "dropped": ", ".join(map(str, dropped)) or "none",
        "gguf_weights": NOTES["gguf-weights-" + (source.gguf_type or AUTO)][0],
        "estimator_mode": source.best_json.get("estimator_mode") or "an unrecorded",
        "alpha": "not recorded" if alpha is None else f"{alpha:.3f}",
        "tokens_per_round": "not recorded" if per_round is None else f"{per_round:.2f}",
        "mask": str(draft.mask),
        "model_gguf": source_gguf(source.model, source.best_json.get("model_source")),
    }


def notes_gguf_draft(source: ExportSource, draft: ExportedDraft) -> list[str]:
    mode = "self" if source.best_json.get("estimator_mode") == "self" else "other-mode"
    values = _gguf_values(source, draft)
    return [
        *full_vocab_note(source, draft),
        *no_tree_note(source, draft),
        *notes("gguf-draft", source, draft, values),
        *notes(f"gguf-draft-{mode}", source, draft, values),
    ]


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "skipsearch", "skipsearch.json", False, write_skipsearch, read_skipsearch, notes_skipsearch, True
        ),
        Format("hf", "generation_config.json", True, write_hf, read_hf, notes_hf),
        Format(
            "skip-layers", "skip_layers.json", False, write_skip_layers, read_skip_layers, notes_skip_layers
        ),
        Format("layerskip", "layerskip.json", True, write_layerskip, read_layerskip, notes_layerskip),
        Format(
            "gguf-draft",
            "draft.gguf",
            False,
            write_gguf_draft,
            read_draft_gguf,
            notes_gguf_draft,
            precision=True,
            check=check_gguf_draft,
            in_all=False,
        ),
    )
}
ALL = "all"
