"""One owner per run directory: the command that writes a run holds an OS lock on it throughout.

Two commands on one `--out` (two new runs, or a resume of a run that is still going) would append
to one journal and delete what the other made. The owner holds `fcntl.flock` on `LOCK_FILE` inside
the directory from before its first write to its exit, and a second command is refused in one line
naming the owner's pid. The kernel drops the lock when its process dies, so a run killed with
SIGKILL leaves no stale lock: the next command simply takes it.

What `--out` may be is checked under the lock, so the answer cannot change while it is acted on:
a new or empty directory for a new run, a run for `--resume`, and nothing inside it a symlink.
A new run that fails before its first trial removes what it created (the directory itself when it
made it), and only that: never what was there before, nor a directory another process holds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skipsearch.errors import ConfigError
from skipsearch.store import JOURNAL_FILE, LOCK_FILE, check_output_dir, is_run, refuse_symlinks

_ATTEMPTS = 10  # a previous owner may remove the directory between our open and our lock


@contextmanager
def run_owner(out: Path, resume: bool) -> Iterator[None]:
    """Own `out` for the duration: lock it, check it suits a new run or a resume, and on failure
    before the first trial of a new run remove what this command created."""
    _refuse_foreign(out, resume)
    created_dir, before, handle = _acquire(out)
    try:
        try:
            _check_contents(out, resume)
            yield
        except BaseException:
            if not resume and not _has_trials(out):
                _remove_created(out, created_dir, before)
            raise
    finally:
        os.close(handle)  # releases the lock


def check_read_only(run_dir: Path, command: str) -> None:
    """Before a command that only reads `run_dir` (`report`, `export`) touches it: refuse a run
    another command is writing (its report would be rewritten under it), naming that owner's pid,
    and a journal a killed writer tore, which only the run's owner repairs (`--resume`: the
    repair cuts the file and keeps the original beside it, a write no reader may make)."""
    from skipsearch.search.journal import whole_records_length
    from skipsearch.search.study import stored_kind

    owner = live_owner(run_dir)
    if owner is not None:
        raise ConfigError(
            f"{run_dir} is being written by a skipsearch command (pid {owner}): {command} it once that "
            "finishes (its report is rewritten at every trial)"
        )
    journal = run_dir / JOURNAL_FILE
    if journal.is_file() and not journal.is_symlink():
        data = journal.read_bytes()
        if whole_records_length(data) != len(data):
            raise ConfigError(
                f"{journal} ends in a torn record (a run killed while writing): repair it with "
                f"`skipsearch {stored_kind(run_dir)} --out {run_dir} --resume`, which keeps the original "
                f"beside it; {command} does not write into a run"
            )


def live_owner(run_dir: Path) -> str | None:
    """The pid of the command that holds `run_dir`'s lock now, or None when none does (a lock file
    left by a finished or killed owner holds nothing: the kernel dropped its lock)."""
    try:
        handle = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: it never blocks another reader
    except BlockingIOError:
        return _owner_pid(handle)
    finally:
        os.close(handle)  # releases a shared lock taken above
    return None


def _refuse_foreign(out: Path, resume: bool) -> None:
    """Refuse, before writing anything, an `--out` that is a file, a non-empty directory that is
    not a run (`--out /`, a source tree), or no run to resume: even the lock file does not belong
    there. Checked again under the lock (`_check_contents`), where the answer cannot change; a
    directory with a lock file is left to that check, as its owner may be half-way through."""
    check_output_dir(out, "--out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: pass a directory")
    if not is_run(out) and not (out / LOCK_FILE).exists():
        if resume:
            raise ConfigError(f"{out} holds no run to resume: drop --resume to start one there")
        if out.is_dir():
            _refuse_others(out)


def _refuse_others(out: Path) -> None:
    others = sorted(path.name for path in out.iterdir() if path.name != LOCK_FILE)
    if others:
        raise ConfigError(
            f"--out {out} is not empty and holds no run (it has {others[0]}"
            f"{f' and {len(others) - 1} more' if len(others) > 1 else ''}): pass a new or empty directory"
        )


def _acquire(out: Path) -> tuple[bool, set[Path], int]:
    """(whether this command created `out`, what `out` held before, the descriptor holding its lock)."""
    for _ in range(_ATTEMPTS):
        created = _make_dir(out)
        before = set(out.iterdir())
        lock = out / LOCK_FILE
        try:
            handle = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if created:
                out.rmdir()
            raise ConfigError(
                f"cannot write to --out {out} ({error.strerror}): pass a directory you can write to"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner_pid(handle)
            os.close(handle)
            raise ConfigError(
                f"{out} is in use by another skipsearch command (pid {owner}): wait for it to finish, "
                "or pass another --out"
            ) from None
        if _same_file(handle, lock):
            pid = f"{os.getpid()}\n".encode()
            os.pwrite(handle, pid, 0)
            os.ftruncate(handle, len(pid))
            return created, before, handle
        os.close(handle)  # its owner removed the directory after a failed start: begin again
    raise ConfigError(f"{out} keeps being removed by another command: wait for it, or pass another --out")


def _make_dir(out: Path) -> bool:
    """Create `out`; True when this call made it."""
    try:
        out.mkdir(parents=True)
    except FileExistsError:
        if not out.is_dir():
            raise ConfigError(f"--out {out} is a file: pass a directory") from None
        return False
    except OSError as error:
        raise ConfigError(
            f"cannot create --out {out} ({error.strerror}): pass a directory you can write to"
        ) from None
    return True


def _owner_pid(handle: int) -> str:
    """The pid the owner wrote into the lock file (it writes it right after locking)."""
    for _ in range(20):
        words = os.pread(handle, 32, 0).split()
        if words:
            return words[0].decode(errors="replace")
        time.sleep(0.025)
    return "unknown"


def _same_file(handle: int, path: Path) -> bool:
    """Whether `path` still names the file open as `handle` (not removed or replaced since)."""
    try:
        named = path.stat(follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(handle)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _check_contents(out: Path, resume: bool) -> None:
    refuse_symlinks(out)
    if is_run(out):
        if not resume:
            raise ConfigError(f"{out} already holds a run: pass --resume to continue it, or another --out")
        return
    if resume:
        raise ConfigError(f"{out} holds no run to resume: drop --resume to start one there")
    _refuse_others(out)


def _has_trials(out: Path) -> bool:
    """Whether any study in `out` finished a trial: then the run is worth a `--resume`."""
    if not (out / JOURNAL_FILE).is_file():
        return False
    import optuna
    from optuna.trial import TrialState

    from skipsearch.search.study import journal_storage

    storage = journal_storage(out)
    return any(
        optuna.load_study(study_name=name, storage=storage).get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)
        )
        for name in optuna.study.get_all_study_names(storage)
    )


def _remove_created(out: Path, created_dir: bool, before: set[Path]) -> None:
    """Remove what this command made in `out`, still holding its lock."""
    if created_dir:
        shutil.rmtree(out, ignore_errors=True)
        return
    for path in sorted(set(out.iterdir()) - before):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
