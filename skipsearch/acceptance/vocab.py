"""The frequency ranking behind a draft vocabulary (docs/theory.md, "The draft vocabulary"): which
`k` token ids a draft head keeps.

A draft vocabulary of size `k` is the first `k` ids of a `VocabRanking`: the special tokens first
(a draft that cannot propose EOS can never end a sequence), then every other id by how often the
model's tokenizer produced it on a counting corpus, ties and never-seen ids by ascending id, so
the same corpus always gives the same ranking.

The corpus must be disjoint from the prompts acceptance is measured on: a ranking counted on them
already knows which tokens they use, and the measured acceptance of a small `k` would flatter the
draft. The default corpus is a seeded sample of the Python standard library's source, present
wherever Python is; a default file that contains a measurement prompt (the `stdlib` prompt source
cuts its prompts from such files) is left out up front, and text the caller adds that contains
one is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skipsearch.acceptance.prompts import Prompt, PromptSpec, select_prompts, stdlib_dir
from skipsearch.errors import ConfigError
from skipsearch.store import draft_vocab_cache_path, write_text_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from skipsearch.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Bump when counting or ordering changes what a corpus yields: cached rankings then miss.
RANKING_VERSION = 1
# ~1.5M tokens of code: enough that the top 32k ids are settled, small enough to count in seconds.
DEFAULT_MAX_FILES = 400
DEFAULT_MAX_CHARS = 6_000_000
# Not the standard library's own code: installed packages vary by machine, tests hold deliberately
# odd input, codec modules are tables of literal characters, pydoc_data is one large prose dump.
_SKIPPED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "pydoc_data", "__pycache__"}
)
# A prompt is found in a corpus by its end, the part that survives truncation to the prompt-token
# budget and that the continuation follows. Shorter prompts are not looked for: a line any code
# base might hold says nothing about a leak, and would refuse every corpus.
PROMPT_END_CHARS = 2000
MIN_PROMPT_CHARS = 40


@dataclass(frozen=True)
class Document:
    """One text of a counting corpus; `name` says where it came from (a file path, a user's file)."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The texts a ranking is counted on, what they are, and which default files were left out."""

    documents: tuple[Document, ...]
    source: str
    dropped: tuple[str, ...] = ()

    def digest(self) -> str:
        """SHA-256 over every document's name and text: the ranking's cache key and provenance."""
        hasher = hashlib.sha256(f"v{RANKING_VERSION}".encode())
        for document in self.documents:
            for part in (document.name, document.text):
                hasher.update(hashlib.sha256(part.encode()).digest())
        return hasher.hexdigest()

    def with_documents(self, extra: Sequence[Document]) -> Corpus:
        if not extra:
            return self
        return Corpus(self.documents + tuple(extra), f"{self.source} + {len(extra)} given", self.dropped)


@dataclass(frozen=True)
class VocabRanking:
    """Every token id of a vocabulary exactly once, most useful to a draft first.

    `ids[:num_specials]` are the special tokens, ascending; the rest follow by descending count on
    the corpus that `provenance` describes (source, documents, tokens counted, distinct ids seen,
    corpus hash, tokenizer), ties and never-seen ids by ascending id.
    """

    vocab_size: int
    ids: tuple[int, ...]
    num_specials: int
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.ids) != self.vocab_size or sorted(self.ids) != list(range(self.vocab_size)):
            raise ConfigError(
                f"a ranking must hold every id 0..{self.vocab_size - 1} exactly once, got {len(self.ids)} "
                "ids: build it again"
            )
        if not 0 <= self.num_specials <= self.vocab_size:
            raise ConfigError(f"num_specials must be in [0, {self.vocab_size}], got {self.num_specials}")

    @property
    def specials(self) -> tuple[int, ...]:
        return self.ids[: self.num_specials]

    def top(self, k: int | None) -> tuple[int, ...]:
        """The draft vocabulary of size `k`: the first `k` ids (None: all of them, the full head).

        `k` must keep every special token and fit the vocabulary.
        """
        if k is None:
            return self.ids
        smallest = max(1, self.num_specials)
        if isinstance(k, bool) or not isinstance(k, Integral) or not smallest <= k <= self.vocab_size:
            raise ConfigError(
                f"draft vocabulary {k!r} does not fit this model's {self.vocab_size} ids "
                f"({self.num_specials} of them special tokens the draft must keep): "
                f"use --draft-vocab between {smallest} and {self.vocab_size}, or full"
            )
        return self.ids[:k]

    # -- storage ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RANKING_VERSION,
            "vocab_size": self.vocab_size,
            "num_specials": self.num_specials,
            "provenance": dict(self.provenance),
            "ids": list(self.ids),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VocabRanking:
        try:
            if data["version"] != RANKING_VERSION:
                raise ConfigError(f"version {data['version']} is not {RANKING_VERSION}")
            return cls(
                vocab_size=int(data["vocab_size"]),
                ids=tuple(int(i) for i in data["ids"]),
                num_specials=int(data["num_specials"]),
                provenance=dict(data["provenance"]),
            )
        except KeyError as missing:
            raise ConfigError(f"no field {missing}") from None
        except (TypeError, ValueError) as error:
            raise ConfigError(f"malformed ({error})") from None

    def save(self, path: str | Path) -> Path:
        """One line of JSON (a 152k-id list would otherwise be 152k lines), written atomically."""
        return write_text_atomic(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> VocabRanking:
        """Read a saved ranking; a missing or damaged file is one error naming it."""
        path = Path(path)
        fix = "delete it and the ranking is counted again"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no draft vocabulary ranking at {path}: give the run's {path.name}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"draft vocabulary ranking {path} is unreadable ({error}): {fix}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"draft vocabulary ranking {path} is not a JSON object: {fix}")
        try:
            return cls.from_dict(data)
        except ConfigError as error:
            raise ConfigError(f"draft vocabulary ranking {path} is damaged ({error}): {fix}") from None


# -- the counting corpus --------------------------------------------------------------------------


def _prompt_end(prompt: Prompt) -> str | None:
    text = prompt.text.strip()
    return text[-PROMPT_END_CHARS:] if len(text) >= MIN_PROMPT_CHARS else None


def _found_prompt(text: str, prompts: Sequence[Prompt]) -> Prompt | None:
    """The first prompt whose end occurs in `text`, if any."""
    return next((p for p in prompts if (end := _prompt_end(p)) is not None and end in text), None)


def check_disjoint(documents: Iterable[Document], prompts: Sequence[Prompt]) -> None:
    """Refuse a counting corpus that contains a measurement prompt (see the module docstring)."""
    for document in documents:
        prompt = _found_prompt(document.text, prompts)
        if prompt is not None:
            raise ConfigError(
                f"ranking corpus text {document.name!r} contains measurement prompt {prompt.id!r}: a "
                "ranking counted on the prompts acceptance is measured on flatters small draft "
                "vocabularies; count on other text or measure on other prompts"
            )


def _stdlib_sources(root: Path) -> list[Path]:
    """The standard library's own `.py` files under `root`, sorted (see `_SKIPPED_DIRS`)."""
    found: list[Path] = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in _SKIPPED_DIRS]
        found.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(found)


def stdlib_corpus(
    avoid: Sequence[Prompt] = (),
    max_files: int = DEFAULT_MAX_FILES,
    max_chars: int = DEFAULT_MAX_CHARS,
    seed: int = 0,
) -> Corpus:
    """A seeded sample of standard-library source files, up to `max_files` files or `max_chars`.

    A file that contains one of the `avoid` prompts is left out (and listed in `dropped`), so the
    default corpus never collides with the measurement prompts, `stdlib` ones included.
    """
    for name, value in (("max_files", max_files), ("max_chars", max_chars)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}: a ranking needs some text to count")
    root = stdlib_dir()
    files = _stdlib_sources(root)
    random.Random(seed).shuffle(files)
    documents: list[Document] = []
    dropped: list[str] = []
    chars = 0
    for path in files:
        if len(documents) >= max_files or chars >= max_chars:
            break
        document = Document(
            path.relative_to(root).as_posix(), path.read_text(encoding="utf-8", errors="replace")
        )
        if _found_prompt(document.text, avoid) is not None:
            dropped.append(document.name)
            continue
        documents.append(document)
        chars += len(document.text)
    source = f"python {platform.python_version()} stdlib sample (seed {seed})"
    return Corpus(tuple(documents), source, tuple(dropped))


def read_corpus_file(path: str | Path) -> Document:
    """A user's own counting text (UTF-8), e.g. code like what the draft will serve."""
    path = Path(path)
    try:
        return Document(path.name, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read ranking corpus {path} ({error}): give a UTF-8 text file") from None


# -- counting and ranking -------------------------------------------------------------------------


def count_tokens(
    tokenizer: PreTrainedTokenizerBase, documents: Sequence[Document], vocab_size: int
) -> np.ndarray:
    """How often the tokenizer produces each id `< vocab_size` over the documents (no added specials)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    if not documents:
        return counts
    encoded = tokenizer([d.text for d in documents], add_special_tokens=False, verbose=False)["input_ids"]
    ids = np.concatenate([np.asarray(row, dtype=np.int64) for row in encoded])
    counts += np.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
    return counts


def rank_ids(counts: np.ndarray, specials: Iterable[int]) -> tuple[tuple[int, ...], int]:
    """Specials (ascending), then ids by descending count, ties by ascending id; and the special count."""
    special = sorted({int(s) for s in specials if 0 <= s < len(counts)})
    chosen = set(special)
    by_count = np.argsort(-counts, kind="stable").tolist()  # stable: equal counts keep ascending ids
    return tuple(special + [i for i in by_count if i not in chosen]), len(special)


def build_ranking(
    tokenizer: PreTrainedTokenizerBase,
    corpus: Corpus,
    vocab_size: int,
    specials: Iterable[int],
    tokenizer_name: str,
) -> VocabRanking:
    """Count `corpus` with `tokenizer` and rank the model's `vocab_size` ids, `specials` first."""
    counts = count_tokens(tokenizer, corpus.documents, vocab_size)
    ids, num_specials = rank_ids(counts, specials)
    provenance = {
        "source": corpus.source,
        "documents": len(corpus.documents),
        "document_names": [d.name for d in corpus.documents],
        "dropped_for_containing_a_prompt": list(corpus.dropped),
        "tokens": int(counts.sum()),
        "distinct_ids": int(np.count_nonzero(counts)),
        "corpus_sha256": corpus.digest(),
        "tokenizer": tokenizer_name,
    }
    return VocabRanking(vocab_size, ids, num_specials, provenance)


def ranking_for(
    loaded: LoadedModel,
    prompts: PromptSpec,
    extra: Sequence[Document] = (),
    max_files: int = DEFAULT_MAX_FILES,
    max_chars: int = DEFAULT_MAX_CHARS,
    seed: int = 0,
) -> VocabRanking:
    """The ranking for a measurement of `loaded` on `prompts`: from the cache, or counted and cached.

    The corpus is the default stdlib sample without any file that holds one of the prompts, plus
    `extra` (refused if it holds one). Keyed by model and corpus hash, so it is counted once.
    """
    from skipsearch.models.loading import eos_ids

    measured = select_prompts(prompts)
    check_disjoint(extra, measured)
    corpus = stdlib_corpus(measured, max_files, max_chars, seed).with_documents(extra)
    vocab_size = int(loaded.model.config.vocab_size)
    path = draft_vocab_cache_path(loaded.model_id, corpus.digest())
    if path.is_file():
        ranking = VocabRanking.load(path)
        if ranking.vocab_size == vocab_size:
            return ranking
        log.info(
            "cached ranking %s has %d ids, the model %d: counting again", path, ranking.vocab_size, vocab_size
        )
    specials = {*loaded.tokenizer.all_special_ids, *eos_ids(loaded.model)}
    ranking = build_ranking(loaded.tokenizer, corpus, vocab_size, specials, loaded.model_id)
    ranking.save(path)
    log.info("draft vocabulary ranking of %d documents saved to %s", len(corpus.documents), path)
    return ranking
