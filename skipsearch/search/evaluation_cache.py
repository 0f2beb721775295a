"""Evaluation cache: mask string -> AcceptanceProfile, persisted as JSONL in one directory.

It is what makes evaluations free to repeat: strategies compared on one model share it, and a
resumed run finds every AcceptanceProfile it measured before. One line per evaluation, appended and flushed
as soon as it finishes, so a killed run loses at most the line being written (skipped on load).
A cache is only valid for one (model, prompt set, estimator, temperature): give each its own
directory, and pass `key` to have a mismatch caught.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.store import CACHE_KEY_FILE, EVALUATIONS_FILE, write_text_atomic

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedEvaluation:
    profile: AcceptanceProfile
    seconds: float


class EvaluationCache:
    """AcceptanceProfiles already measured, by mask string; loads `directory` and appends to it."""

    def __init__(self, directory: Path, key: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_key(key)
        self.path = self.directory / EVALUATIONS_FILE
        self._entries: dict[str, CachedEvaluation] = {}
        if self.path.exists():
            self._load()

    def _check_key(self, key: str | None) -> None:
        if key is None:
            return
        key_path = self.directory / CACHE_KEY_FILE
        if not key_path.exists():
            write_text_atomic(key_path, key)
        elif (stored := key_path.read_text()) != key:
            raise ConfigError(
                f"evaluation cache {self.directory} holds profiles for {stored!r}, not {key!r}: "
                "use a separate cache directory for each model and prompt set"
            )

    def _load(self) -> None:
        text = self.path.read_text()
        if text and not text.endswith("\n"):
            with self.path.open("a") as f:  # end a torn last line so the next entry starts clean
                f.write("\n")
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                entry = json.loads(line)
                self._entries[entry["mask"]] = CachedEvaluation(
                    AcceptanceProfile.from_dict(entry["profile"]), float(entry["seconds"])
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                logger.warning(
                    "skipping unreadable line %d of %s (a run killed mid-write?)", number, self.path
                )

    def get(self, mask: SkipMask | str) -> CachedEvaluation | None:
        return self._entries.get(str(mask))

    def put(self, mask: SkipMask | str, profile: AcceptanceProfile, seconds: float) -> None:
        entry = {"mask": str(mask), "seconds": seconds, "profile": profile.to_dict()}
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        self._entries[str(mask)] = CachedEvaluation(profile, seconds)

    def __contains__(self, mask: object) -> bool:
        return str(mask) in self._entries

    def __len__(self) -> int:
        return len(self._entries)
