"""Where skipsearch keeps things on disk, and how it writes them so a kill never leaves half a file.

Every file name of a run directory and every cache path is defined here once; every writer of a
file that a later command reads goes through `atomic_path` (write a staging file next to the
target, then rename it over the target: a rename is atomic on one file system, so a reader sees
the old file or the new one, never a torn one).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skipsearch.errors import ConfigError, SkipsearchError

# -- a run directory ------------------------------------------------------------------------------
RUN_FILE = "run.yaml"
BEST_FILE = "best.json"
SUMMARY_FILE = "summary.md"
TRIALS_TABLE = "trials.csv"
CONVERGENCE_PLOT = "convergence.png"  # one run's, or a compare's strategies side by side
ALPHA_PLOT = "alpha_vs_r_draft.png"
SKIP_FREQUENCY_PLOT = "skip_frequency.png"
SPEEDUP_PLOT = "speedup_vs_gamma.png"
COMPARISON_TABLE = "comparison.csv"
COMPARISON_SUMMARY = "comparison.md"
TIERS_FILE = "tiers.json"
TIER_TABLE_FILE = "tier_sets.csv"
JOURNAL_FILE = "optuna.journal"
CACHE_DIR = "cache"
STUDIES_DIR = "studies"  # a compare directory's per-study reports (`report --study`)
EVALUATIONS_FILE = "evaluations.jsonl"
CACHE_KEY_FILE = "key.txt"
EXPORT_README = "README.md"
EXPORT_MARKER = ".skipsearch-export"  # in an export directory: the files export wrote there
DRAFT_VOCAB_FILE = "draft_vocab.json"
IMPORTANCE_FILE = "importance.json"
IMPORTANCE_PLOT = "importance.png"
FINALISTS_FILE = "finalists.json"  # the best drafts re-scored exactly (`run.finalists`)
LOCK_FILE = ".owner.lock"  # held with flock by the one command writing the run (`run/owner.py`)
LEGACY_JOURNAL_LOCK = f"{JOURNAL_FILE}.lock"  # Optuna's symlink lock, left by older killed runs; unused
RUN_MARKERS = (RUN_FILE, JOURNAL_FILE)  # either one makes a directory a run


def is_run(directory: Path) -> bool:
    """Whether `directory` holds a run (or a compare): what `--resume` continues."""
    return any((directory / name).is_file() for name in RUN_MARKERS)


def refuse_symlinks(directory: Path) -> None:
    """Refuse a run directory holding a symbolic link anywhere inside it.

    Appends (the journal, the evaluation cache) and the journal repair open files in place, so a
    link would have them write, or truncate, a file outside the run.
    """
    for parent, folders, files in os.walk(directory):
        for name in folders + files:
            if (path := Path(parent) / name).is_symlink() and name != LEGACY_JOURNAL_LOCK:
                raise ConfigError(
                    f"{path} is a symbolic link (to {os.readlink(path)}): a run's files must be its own; "
                    "replace the link with a copy of the file, or start a new run in another --out"
                )


# -- caches shared by runs ------------------------------------------------------------------------
CACHE_ENV = "SKIPSEARCH_CACHE"
REFERENCE_DIR = "reference"
REFERENCE_SUFFIX = ".safetensors"


def cache_dir() -> Path:
    """Where converted models, reference caches and LatencyProfiles live: `SKIPSEARCH_CACHE`, else
    `$HOME/.cache/skipsearch`. Either must be an absolute path: an empty or relative one would put
    half a gigabyte into whatever directory the command runs in (or `/`), so it is one line
    naming the variable instead."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return _absolute(value, CACHE_ENV, "the cache would", "e.g. ~/.cache/skipsearch, or unset it")
    home = os.environ.get("HOME")
    if home is None:
        return Path.home() / ".cache" / "skipsearch"
    fix = f"your home directory, or set {CACHE_ENV} to an absolute path"
    return _absolute(home, "HOME", "the cache would", fix) / ".cache" / "skipsearch"


def _absolute(value: str, variable: str, what: str, fix: str) -> Path:
    path = Path(value).expanduser() if value.strip() else None
    if path is None or not path.is_absolute():
        problem = "is empty" if path is None else f"is {value!r}, a relative path"
        raise ConfigError(
            f"{variable} {problem}, so {what} go wherever the command runs: set {variable} to an absolute "
            f"path ({fix})"
        )
    return path


def check_environment() -> None:
    """`HOME` and `SKIPSEARCH_CACHE` as the command will use them, checked before anything is imported
    that reads them: an empty or relative `HOME` has matplotlib and Hugging Face make their caches
    under `/` or the current directory at import, before the cache's own check."""
    home = os.environ.get("HOME")
    if home is not None:
        _absolute(
            home,
            "HOME",
            "the caches of the libraries skipsearch uses (matplotlib's, ...) would",
            "your home directory",
        )
    cache_dir()


def check_cache_dir() -> Path:
    """The cache directory, checked before any work writes to it: a legal, absolute path to a
    directory (or one that can be made) that this process can write to."""
    directory = cache_dir()
    variable = CACHE_ENV if CACHE_ENV in os.environ else "the cache"
    try:
        check_output_dir(directory, variable)
    except ConfigError as error:
        raise ConfigError(f"{error}; or set {CACHE_ENV} to a directory you can write to") from None
    return directory


def adopt_cache_dir(directory: Path) -> None:
    """Make `directory` this process's cache for every later lookup.

    For a Ray actor, a process that exists only to evaluate masks for one driver: when it can read
    the driver's cache, it uses that one for everything (the reference, a converted GGUF, the
    kernel plan), as the driver does. The environment variable is the process-wide setting every
    `cache_dir()` reads, and it travels to any child process the actor starts.
    """
    os.environ[CACHE_ENV] = str(directory)


def reference_cache_path(key: str) -> Path:
    """Where the ReferenceCache of `key` (`acceptance.reference.reference_key`) is kept."""
    return cache_dir() / REFERENCE_DIR / f"{key}{REFERENCE_SUFFIX}"


def matplotlib_beside_cache() -> None:
    """Put matplotlib's font cache and config with skipsearch's cache, not under HOME, unless the
    user chose a place (`MPLCONFIGDIR`): a command or an API call writes where it was pointed and
    into its cache, nowhere else. Called before matplotlib is first imported. Where the cache has no
    valid place (HOME empty or relative), matplotlib keeps its own default: the command line refuses
    that environment before any work, and an API call meets the same error where it needs the cache."""
    if "MPLCONFIGDIR" in os.environ:
        return
    try:
        os.environ["MPLCONFIGDIR"] = str(cache_dir() / "matplotlib")
    except SkipsearchError:
        return


def cache_dir_holding(reference: Path) -> Path:
    """The cache directory a `reference_cache_path` lies in."""
    return reference.parent.parent


def gguf_join_path(gguf_file: str) -> Path:
    """Where a GGUF shipped in parts (a registry alias) is joined once."""
    return cache_dir() / "gguf" / gguf_file


def converted_gguf_path(stem: str, sha256: str) -> Path:
    """The float32 safetensors directory a GGUF is de-quantized into once (other dtypes add a suffix)."""
    return cache_dir() / "converted" / f"{stem}-{sha256[:16]}"


def slug(text: str) -> str:
    """A file-name-safe form of a model id or device (`org/name` -> `org_name`, `cuda:0` -> `cuda_0`)."""
    return re.sub(r"[^\w.-]+", "_", text).strip("_.") or "model"


def default_profile_path(model_id: str, device: str, dtype: str, graphs: bool = False) -> Path:
    """Where `skipsearch profile` writes by default: one per model, kind of device and dtype.

    Timings depend on the kind of device and the dtype, not on which of several alike GPUs ran
    them, so `cuda:0` and `cuda` share a file and bf16 and fp32 do not. `dtype` is a resolved
    name (`float32`, not `auto`). A LatencyProfile of CUDA-graph replays (`profile --graphs`) prices
    another engine, so it has a file of its own (`-graphs`) and never replaces the eager one.
    """
    kind = "-graphs" if graphs else ""
    name = f"{slug(model_id)}-{slug(device.split(':')[0])}-{slug(dtype)}{kind}.json"
    return cache_dir() / "profiles" / name


def readable_profile_path(model_id: str, device: str, dtype: str, graphs: bool = False) -> Path:
    """The default LatencyProfile, or an eager one written before names carried the dtype
    (`model-device.json`)."""
    path = default_profile_path(model_id, device, dtype, graphs)
    legacy = cache_dir() / "profiles" / f"{slug(model_id)}-{slug(device)}.json"
    return legacy if not graphs and not path.is_file() and legacy.is_file() else path


def kernels_dir() -> Path:
    """Where the CPU backend keeps its measured choices and compiled kernels."""
    return cache_dir() / "kernels"


def kernel_choice_path(machine: str, dtype: str) -> Path:
    """Where a choice the CPU backend measured on this machine is kept (`cpu.choices`)."""
    return kernels_dir() / f"{machine}-{dtype}.json".replace("/", "_")


def native_library_path(name: str, digest: str) -> Path:
    """Where a compiled C kernel is kept, one per source, compiler and flags (`cpu.native`)."""
    return kernels_dir() / f"{name}-{digest}.so"


def draft_vocab_cache_path(model_id: str, corpus_hash: str) -> Path:
    """Where a draft vocabulary ranking is kept: one per model and counting corpus, counted once."""
    return cache_dir() / "draft_vocab" / f"{slug(model_id)}-{corpus_hash[:16]}.json"


# -- output paths, checked before any work ---------------------------------------------------------
NAME_MAX = 255  # bytes in one path component (Linux, every common file system)
PATH_MAX = 4096  # bytes in a whole path, its terminating NUL included


def check_output_file(path: str | Path, option: str) -> Path:
    """A file a command will write (`--json`, a profile's `--out`), checked before its work: a legal
    name, not a directory, in a directory that exists or can be made, which this process can write
    to. The check writes nothing but a probe file it removes at once."""
    path = _legal(path, option)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory: give a file path such as {path / 'out.json'}")
    _check_writable(path.parent, option, path)
    return path


def check_output_dir(path: str | Path, option: str) -> Path:
    """A directory a command will write into (`--out` of an export, the cache), checked the same
    way: a legal name, not a file, existing or creatable, writable."""
    path = _legal(path, option)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file: pass a directory")
    _check_writable(path, option, path)
    return path


def _legal(path: str | Path, option: str) -> Path:
    """`path` when every component fits NAME_MAX bytes and the whole path PATH_MAX: a longer one
    fails inside the first `stat`, as a traceback, long after the command started."""
    path = Path(path)
    if not str(path):
        raise ConfigError(f"{option} is empty: pass a path")
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(
                f"{option}: the name {part[:40]}... is {len(os.fsencode(part))} bytes, longer than the "
                f"{NAME_MAX} a file name may have: pass a shorter name"
            )
    if len(os.fsencode(os.path.abspath(path))) >= PATH_MAX:
        raise ConfigError(
            f"{option}: the path is longer than the {PATH_MAX} bytes a path may have: pass a shorter one"
        )
    return path


def _check_writable(directory: Path, option: str, path: Path) -> None:
    """Whether a file can be created in `directory`, or in the nearest ancestor that exists (the
    command makes the rest): a probe file made and removed there, which is what root, a read-only
    mount and `/proc` answer truthfully and `os.access` does not."""
    existing = Path(os.path.abspath(directory))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {path}: {existing} is a file, not a directory: pass a path in a directory"
        )
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".skipsearch-probe-")
    except OSError as error:
        raise ConfigError(
            f"{option} {path} cannot be written ({existing}: {error.strerror}): pass a path you can write to"
        ) from None
    os.close(handle)
    os.unlink(probe)


# -- atomic writes --------------------------------------------------------------------------------
@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a staging path next to `path`; on success rename it over `path`, on error remove it.

    The staging file shares the target's folder, so the rename never crosses file systems. A
    directory works too: create it at the staging path and it replaces `path` whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    staging = Path(name)
    staging.unlink()
    try:
        yield staging
        if staging.is_dir() and path.is_dir():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` so that a reader never sees a partial file."""
    with atomic_path(path) as staging:
        staging.write_text(text)
    return Path(path)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as staging:
        staging.write_bytes(data)
    return Path(path)
