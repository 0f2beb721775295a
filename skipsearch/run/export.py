"""Export a run's best draft as configs other engines read (`skipsearch export`; README, "Commands").

Every format (`export_formats`: `skipsearch`, `hf`, `skip-layers`, `layerskip`, `gguf-draft`) is
one file, read back after writing to prove it says what was meant, and `tiers.json`, the CUDA-graph
capture manifest, when the run has a tier set; what is exported is read by `export_source`.

HF and LayerSkip can only exit early. For a sparse best mask they get the best contiguous mask
the run scored, and say so; with none, asking for them is an error naming the fix. `README.md`
states, per format written, what the target engine can and cannot express.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from skipsearch.errors import ConfigError, SkipsearchError
from skipsearch.run.export_formats import ALL, FORMATS, Format
from skipsearch.run.export_notes import NOTES
from skipsearch.run.export_source import Exported, ExportedDraft, ExportSource
from skipsearch.store import EXPORT_MARKER, EXPORT_README, TIERS_FILE, check_output_dir, write_text_atomic
from skipsearch.tiers.manifest import TierManifest

log = logging.getLogger(__name__)


# -- exporting ------------------------------------------------------------------------------------
def draft_for(source: ExportSource, fmt: Format) -> ExportedDraft:
    """The best mask, or for an early-exit-only engine the best early exit of the run; refused for an
    engine that cannot run a sub-layer at lower precision when the best draft does, and for whatever
    else the format refuses (`Format.check`), all before anything is written."""
    if source.best.mask.quantized and not fmt.precision:
        raise ConfigError(
            f"format {fmt.name} cannot say that the draft {source.best.mask} runs sub-layers at int8/int4 "
            "(only skips): use --format skipsearch or gguf-draft"
        )
    if not fmt.prefix_only:
        fmt.check(source, source.best)
        return source.best
    if source.contiguous is None:
        where = "its best.json has no run beside it" if source.run_dir is None else "no trial exits early"
        best = source.best.mask
        shape = "is sparse" if best.attn or best.mlp else "skips no layer"
        raise ConfigError(
            f"format {fmt.name} runs only an early exit but the best mask {best} {shape} and "
            f"{where}: export a contiguous run (`skipsearch run --space contiguous --strategy exhaustive`) "
            "or use --format skipsearch or skip-layers"
        )
    fmt.check(source, source.contiguous)
    return source.contiguous


def export(source: ExportSource, formats: Iterable[str], out: Path) -> list[Exported]:
    """Write and read back every requested format, then README.md; `all` skips (and notes) the
    early-exit formats a sparse-only run cannot fill, where asking for one by name is an error."""
    check_export_dir(out)
    names = list(formats)
    unknown = [n for n in names if n != ALL and n not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown export format {unknown[0]!r}: use one of {', '.join([*FORMATS, ALL])}")
    wanted = [name for name, fmt in FORMATS.items() if fmt.in_all] if ALL in names else names
    if source.gguf_type is not None and "gguf-draft" not in wanted:
        raise ConfigError(f"--gguf-type {source.gguf_type} is for --format gguf-draft only: add that format")
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
    written = sorted({item.path.name for item in exported} | {EXPORT_README})
    write_text_atomic(out / EXPORT_MARKER, "\n".join(written) + "\n")
    for name, why in skipped.items():
        log.warning("format %s not written: %s", name, why)
    return exported


def check_export_dir(out: Path) -> None:
    """Refuse, before anything is written, an `--out` that export could not write or that holds
    files it did not write (a user's README.md would be replaced), as `run --out` refuses a
    directory of other files. Export's own directory carries `EXPORT_MARKER`; one written before
    the marker existed is recognised by its file names and its README's first line."""
    check_output_dir(out, "--out")
    if not out.is_dir() or (out / EXPORT_MARKER).is_file():
        return
    names = sorted(path.name for path in out.iterdir())
    ours = {fmt.file for fmt in FORMATS.values()} | {TIERS_FILE, EXPORT_README}
    readme_path = out / EXPORT_README
    old_export = readme_path.is_file() and readme_path.read_text(errors="replace").startswith(_README_TITLE)
    foreign = [name for name in names if name not in ours or not old_export]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ConfigError(
            f"--out {out} holds files skipsearch export did not write ({foreign[0]}{more}), which it would "
            "replace: pass a new or empty directory"
        )


_README_TITLE = "# skipsearch export:"


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
        f"{_README_TITLE} {source.model}",
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
