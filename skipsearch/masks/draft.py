"""Draft: a mask plus a draft vocabulary and a KV pattern, what a search proposes.

The draft vocabulary (docs/theory.md, "The draft vocabulary") is `full`, or the top-`k` ids of a
frequency ranking, so that each draft step multiplies only `k` rows of the LM head. Verify always
uses the full head, so the output stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks.kv_pattern import KVPattern, kv_label
from skipsearch.masks.skip_mask import SkipMask, check_parse_arguments
from skipsearch.options import check

FULL_VOCAB = "full"
VOCAB_KEY = "v"
KV_KEY = "kv"


def parse_draft_vocab(text: str | int | None) -> int | None:
    """`full` (or None) -> None, `"8192"` / 8192 -> 8192: the draft vocabulary size `k`."""
    if text is None or (isinstance(text, str) and text.strip().lower() == FULL_VOCAB):
        return None
    try:
        size = int(text) if not isinstance(text, bool) else None
    except ValueError:
        size = None
    if size is None:
        raise InvalidMaskError(
            f"--draft-vocab {text!r} is not a draft vocabulary size: pass a positive integer k (the top-k "
            "ids) or full"
        )
    try:
        return check("draft_vocab", size)
    except ConfigError as error:
        raise InvalidMaskError(f"{error} (or full)") from None


def vocab_label(draft_vocab: int | None) -> int | str:
    """`"full"` or the size `k`: how JSON files, `trials.csv` and reports name a draft vocabulary
    (`parse_draft_vocab` reads it back)."""
    return FULL_VOCAB if draft_vocab is None else draft_vocab


def split_draft(text: str) -> tuple[str, int | None, KVPattern | None]:
    """`a:4|m:4|v:8192|kv:s4w1024` -> (`a:4|m:4`, 8192, s4w1024); without `v:` the vocabulary is
    None (full), without `kv:` the KV pattern is None (full)."""
    parts = [part.strip() for part in text.strip().split("|") if part.strip()]
    found: dict[str, str] = {}
    for key, example in ((VOCAB_KEY, "|v:8192"), (KV_KEY, "|kv:s4w1024")):
        given = [p for p in parts if p.startswith(f"{key}:")]
        if len(given) > 1:
            raise InvalidMaskError(f"cannot read draft {text!r}: give {key}: once, e.g. {example}")
        if given:
            found[key] = given[0].split(":", 1)[1]
            parts.remove(given[0])
    vocab = parse_draft_vocab(found[VOCAB_KEY]) if VOCAB_KEY in found else None
    return "|".join(parts), vocab, KVPattern.parse(found.get(KV_KEY))


@dataclass(frozen=True)
class Draft:
    """A search candidate: a SkipMask, a draft vocabulary of `vocab` ids (None = the full
    vocabulary) and a KV pattern (None = every key).

    The string form extends the mask's: `a:4,14|m:4,14,20|v:8192|kv:s4w1024`; a plain mask string
    means the full vocabulary and every key, so every mask string written before drafts existed
    still reads the same.
    """

    mask: SkipMask
    vocab: int | None = None
    kv: KVPattern | None = None

    def __post_init__(self) -> None:
        if self.vocab is not None and (isinstance(self.vocab, bool) or int(self.vocab) < 1):
            raise InvalidMaskError(
                f"draft vocabulary must be a positive size or None (full), got {self.vocab!r}"
            )

    @classmethod
    def parse(cls, text: str, num_layers: int) -> Draft:
        """Read `a:..|m:..|v:K|kv:sSwW` (`v:` and `kv:` optional, meaning full)."""
        check_parse_arguments(text, num_layers)
        mask_text, vocab, kv = split_draft(text)
        return cls(SkipMask.parse(mask_text, num_layers), vocab, kv)

    def __str__(self) -> str:
        text = str(self.mask) if self.vocab is None else f"{self.mask}|{VOCAB_KEY}:{self.vocab}"
        return text if self.kv is None else f"{text}|{KV_KEY}:{self.kv}"

    def to_dict(self) -> dict:
        return {**self.mask.to_dict(), "draft_vocab": vocab_label(self.vocab), "kv": kv_label(self.kv)}

    @classmethod
    def from_dict(cls, data: dict) -> Draft:
        return cls(
            SkipMask.from_dict(data),
            parse_draft_vocab(data.get("draft_vocab")),
            KVPattern.parse(data.get("kv")),
        )
