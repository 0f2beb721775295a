"""KVPattern: the keys a draft step attends to (docs/theory.md, "KV patterns").

A KVPattern keeps the first `sink` positions and the last `window` of the cache, so at long context
a draft step reads a fixed number of keys instead of all of them. Every layer still runs; verify
attends to the whole cache.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.options import check

FULL_KV = "full"


@dataclass(frozen=True)
class KVPattern:
    """The keys a draft step attends to: the first `sink` positions of the cache, the last `window`
    up to and including its own, and `pillars` more per layer and K/V head:
    `s{sink}w{window}[k{pillars}]` (`s4w1024`, `s4w256k64`).

    A draft at position `p` sees keys `[0, sink)` and `[p + 1 - window, p]`; while `p + 1 <= sink +
    window` that is every key, and the draft step is exactly the full model's. Pillars (SparseSpec's
    PillarAttn, docs/theory.md "KV patterns") are the keys between sink and window that the full
    model attended to most at the first position of the previous round's verify
    (`kv.pillars`); a decode's first round, which follows no verify, has none.
    """

    sink: int
    window: int
    pillars: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidMaskError(f"KV pattern {name} must be an integer, got {value!r}")
        if self.sink < 0 or self.window < 1 or self.pillars < 0:
            raise InvalidMaskError(
                f"KV pattern {self}: the sink and the pillars must be >= 0 and the window >= 1 "
                "(the window holds the draft's own position), e.g. s4w1024 or s4w256k64"
            )
        try:
            for name in ("sink", "window", "pillars"):
                check(f"kv_{name}", getattr(self, name))
        except ConfigError as error:
            raise InvalidMaskError(f"KV pattern {self}: {error}") from None

    @classmethod
    def parse(cls, text: str | None) -> KVPattern | None:
        """`full` (or None) -> None; `s4w1024` -> KVPattern(4, 1024); `s4w256k64` -> KVPattern(4, 256, 64)."""
        if text is None or (isinstance(text, str) and text.strip().lower() == FULL_KV):
            return None
        found = _KV_FORM.fullmatch(text.strip().lower()) if isinstance(text, str) else None
        if found is None:
            raise InvalidMaskError(
                f"cannot read KV pattern {text!r}: write 'full' or s<sink>w<window>[k<pillars>], "
                "e.g. s4w1024 or s4w256k64"
            )
        return cls(int(found["sink"]), int(found["window"]), int(found["pillars"] or 0))

    def __str__(self) -> str:
        return f"s{self.sink}w{self.window}" + (f"k{self.pillars}" if self.pillars else "")

    @property
    def keys_read(self) -> int:
        """Keys a draft step reads per layer and K/V head once the context exceeds the pattern."""
        return self.sink + self.window + self.pillars

    def sees(self, key: Any, query: Any) -> Any:
        """Whether the draft at position `query` attends to the key at position `key` (at or before
        it) by position alone: in the sink, or among the `window` positions up to its own. Ints or
        tensors that broadcast; the one statement of the pattern's band, for the estimator's masks
        and the engine's window (pillars come on top, chosen per round)."""
        return (key < self.sink) | (key > query - self.window)

    def pillar_region(self, source: Any) -> tuple[int, Any]:
        """`[begin, end)`: the keys pillars are chosen from at a verify whose first position is
        `source` — past the sink, and before the window of any draft position after `source`, so a
        pillar never repeats a key the band already gives."""
        return self.sink, source + 1 - self.window

    def covers(self, context: int) -> bool:
        """Whether a draft step with `context` positions sees all of them (is exact)."""
        return context <= self.sink + self.window


_KV_FORM = re.compile(r"s(?P<sink>\d+)w(?P<window>\d+)(?:k(?P<pillars>\d+))?")


def kv_label(kv: KVPattern | None) -> str:
    """`"full"` or the pattern's string: how JSON files and reports name a KV pattern
    (`KVPattern.parse` reads it back)."""
    return FULL_KV if kv is None else str(kv)
