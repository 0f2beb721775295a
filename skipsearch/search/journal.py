"""Repair an Optuna journal that a killed writer left torn, before anyone appends to it.

Optuna 5's `JournalFileBackend` writes one JSON record per line and, on read, silently skips an
unterminated last line. It appends the next record right after it, though, so the torn bytes and
the new record fuse into one line that is not JSON, and every later read of the study raises
`JSONDecodeError`: the run is lost. A journal is an operation log, so any prefix of whole records
is a consistent study. `repair_journal` keeps the longest such prefix, drops what follows (the
torn record, and anything a buggy writer appended after it), keeps the original bytes next to the
file and says so in one log line, telling a torn last record (a writer killed mid-write) from a
journal damaged in the middle (changed by something else, so the records dropped are worth a look).

Every writer locks the journal with `FlockLock`, whose lock the kernel drops when its holder dies:
Optuna's default symlink lock outlives a SIGKILL and costs the next writer a 30 s grace period.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

from optuna.storages.journal._file import BaseJournalFileLock

logger = logging.getLogger(__name__)


class FlockLock(BaseJournalFileLock):
    """Optuna's journal lock as `fcntl.flock` on the journal file itself (which must exist)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._handle: int | None = None

    def acquire(self) -> bool:
        handle = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)  # drops the lock
            self._handle = None


def whole_records_length(data: bytes) -> int:
    """Bytes of the longest prefix of `data` made of newline-terminated JSON records."""
    length = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            break
        length += len(line)
    return length


def backup_path(path: Path) -> Path:
    """`optuna.journal.torn-1`, `-2`, ...: the first name not taken, so no backup is overwritten."""
    number = 1
    while (candidate := path.with_name(f"{path.name}.torn-{number}")).exists():
        number += 1
    return candidate


def repair_journal(path: Path) -> Path | None:
    """Cut `path` after its last whole record; return the backup of the original, None if intact.

    Runs under the journal's lock, so a live writer is never mid-record while we read.
    """
    if not path.is_file():
        return None
    lock = FlockLock(path)
    lock.acquire()
    try:
        data = path.read_bytes()
        keep = whole_records_length(data)
        if keep == len(data):
            return None
        backup = backup_path(path)
        shutil.copyfile(path, backup)
        os.truncate(path, keep)
    finally:
        lock.release()
    kept = data[:keep].count(b"\n")
    dropped = data[keep:].count(b"\n") + (not data.endswith(b"\n"))
    if dropped == 1:
        what = "ended in a torn record (a run killed while writing)"
    else:
        what = f"is damaged in the middle (record {kept + 1} of {kept + dropped} is not whole JSON)"
    logger.warning(
        "%s %s: dropped %d record(s) from byte %d on, kept %d whole ones; the original is saved as %s",
        path,
        what,
        dropped,
        keep,
        kept,
        backup.name,
    )
    return backup
