"""The notes of an export: what each target engine can and cannot express, as prose in
`export_notes.md` (one `## section` per list), filled in from the run (`note_values`).

`run.export_formats` picks the sections each format's notes are made of; `run.export` writes them
into `exports/README.md`.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from skipsearch.run.export_source import ExportedDraft, ExportSource, skip_layer_keys
from skipsearch.store import DRAFT_VOCAB_FILE, TIERS_FILE
from skipsearch.tree_shapes import as_tree

NOTES_FILE = "export_notes.md"  # the prose of every note, per format


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
        "tree": tree_label(source),
    }


def tree_label(source: ExportSource) -> str | None:
    """The token-tree shape the run's best draft drafts (None: a chain)."""
    tree = as_tree(source.best_json.get("tree"))
    return None if tree is None else str(tree)


def no_tree_note(source: ExportSource, draft: ExportedDraft) -> list[str]:
    """An engine that drafts chains, told the best draft was scored as a token tree."""
    return [] if tree_label(source) is None else notes("no-tree", source, draft)


def _key_list(keys: tuple[str, ...]) -> str:
    quoted = [f"`{key}`" for key in keys]
    return (
        f"the key {quoted[0]}" if len(quoted) == 1 else f"the keys {', '.join(quoted[:-1])} and {quoted[-1]}"
    )


def notes(
    section: str, source: ExportSource, draft: ExportedDraft, extra: Mapping[str, Any] | None = None
) -> list[str]:
    values = {**note_values(source, draft), **(extra or {})}
    return [note.format(**values) for note in NOTES[section]]


def full_vocab_note(source: ExportSource, draft: ExportedDraft) -> list[str]:
    """Engines without a draft-vocabulary option run the mask with the full head: say so."""
    return [] if source.draft_vocab is None else notes("no-draft-vocab", source, draft)


def fallback_note(source: ExportSource, draft: ExportedDraft) -> list[str]:
    return [] if draft.mask == source.best.mask else notes("fallback", source, draft)
