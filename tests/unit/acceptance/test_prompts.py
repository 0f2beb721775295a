"""Prompt sets: sources, seeded selection, cache keys, encoding and every user error."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from skipsearch.acceptance.prompts import (
    EncodedPrompt,
    PromptSpec,
    encode_prompts,
    load_prompts,
    resolve_source,
    select_prompts,
    truncate_keep_end,
)
from skipsearch.errors import ConfigError, PromptError
from tests.conftest import make_tokenizer

SPEC_BENCH_FILE = Path(__file__).parents[4] / "shared/data/spec_bench/question.jsonl"


def write_jsonl(path: Path, objects: list[object]) -> Path:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objects))
    return path


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"def f{i}(x):\n"} for i in range(20)])


def test_humaneval_has_164_code_prompts() -> None:
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert not any(p.chat for p in prompts)
    assert all("def " in p.text for p in prompts)


def test_stdlib_yields_code_contexts_ending_at_a_def() -> None:
    prompts = load_prompts("stdlib")
    assert len(prompts) > 50
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.text.splitlines()[-1].lstrip().startswith(("def ", "async def ")) for p in prompts)
    assert prompts == load_prompts("stdlib")


def test_stdlib_long_yields_contexts_of_a_thousand_lines_or_more_ending_at_a_def() -> None:
    prompts = load_prompts("stdlib-long")
    assert len(prompts) >= 16  # 8 to measure on and 8 held out for decoding, at least
    assert all(p.id.startswith("stdlib-long/") for p in prompts)
    assert all(1000 <= len(p.text.splitlines()) <= 1600 for p in prompts)
    assert all(p.text.splitlines()[-1].lstrip().startswith(("def ", "async def ")) for p in prompts)


@pytest.mark.skipif(not SPEC_BENCH_FILE.is_file(), reason="shared Spec-Bench data not present")
def test_spec_bench_keeps_first_turn_as_chat() -> None:
    prompts = load_prompts(resolve_source("spec-bench", str(SPEC_BENCH_FILE)))
    first = json.loads(SPEC_BENCH_FILE.read_text().splitlines()[0])
    assert len(prompts) == 480
    assert all(p.chat for p in prompts)
    assert prompts[0].text == first["turns"][0]
    assert prompts[0].id == "question.jsonl:1"


def test_gzipped_jsonl_reads_like_plain(tmp_path: Path, prompt_file: Path) -> None:
    gzipped = tmp_path / "prompts.jsonl.gz"
    gzipped.write_bytes(gzip.compress(prompt_file.read_bytes()))
    assert [p.text for p in load_prompts(str(gzipped))] == [p.text for p in load_prompts(str(prompt_file))]


def test_resolve_source_forms() -> None:
    assert resolve_source("humaneval") == "humaneval"
    assert resolve_source("stdlib") == "stdlib"
    assert resolve_source("spec-bench", "q.jsonl") == "q.jsonl"
    assert resolve_source("my/prompts.jsonl.gz") == "my/prompts.jsonl.gz"


def test_selection_is_deterministic_per_seed(prompt_file: Path) -> None:
    def ids(seed: int, n: int = 5) -> list[str]:
        return [p.id for p in select_prompts(PromptSpec(str(prompt_file), n_prompts=n, seed=seed))]

    assert ids(0) == ids(0)
    assert ids(0) != ids(1)
    assert ids(0, n=10)[:5] == ids(0)


def test_more_prompts_than_the_source_has_is_refused(prompt_file: Path) -> None:
    assert len(select_prompts(PromptSpec(str(prompt_file), n_prompts=20))) == 20
    with pytest.raises(PromptError, match="--n-prompts 100 is more than the 20 prompts"):
        select_prompts(PromptSpec(str(prompt_file), n_prompts=100))


@pytest.mark.parametrize(
    "change",
    [{"n_prompts": 3}, {"max_prompt_tokens": 7}, {"new_tokens": 9}, {"seed": 1}, {"source": "stdlib"}],
)
def test_key_changes_with_every_option(prompt_file: Path, change: dict[str, object]) -> None:
    spec = PromptSpec(str(prompt_file))
    assert spec.key() == PromptSpec(str(prompt_file)).key()
    assert PromptSpec(**{**spec.to_dict(), **change}).key() != spec.key()


def test_key_follows_file_content_not_path(tmp_path: Path, prompt_file: Path) -> None:
    key = PromptSpec(str(prompt_file)).key()
    assert key.startswith("prompts-")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(prompt_file.read_bytes())
    assert PromptSpec(str(copy)).key().split("-")[1] == key.split("-")[1]
    write_jsonl(prompt_file, [{"prompt": "other"}])
    assert PromptSpec(str(prompt_file)).key() != key


def test_spec_dict_round_trip(prompt_file: Path) -> None:
    spec = PromptSpec(str(prompt_file), n_prompts=4, max_prompt_tokens=16, new_tokens=8, seed=3)
    assert PromptSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_truncate_keeps_end_and_optionally_first() -> None:
    assert truncate_keep_end([1, 2, 3, 4, 5], 3, keep_first=False) == (3, 4, 5)
    assert truncate_keep_end([1, 2, 3, 4, 5], 3, keep_first=True) == (1, 4, 5)
    assert truncate_keep_end([1, 2], 3, keep_first=True) == (1, 2)


def test_encoding_truncates_to_last_tokens(tmp_path: Path) -> None:
    text = "def add(a, b):\n    return a + b\n" * 20
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": text}])
    tokenizer = make_tokenizer()
    [encoded] = encode_prompts(PromptSpec(str(path), n_prompts=1, max_prompt_tokens=10), tokenizer)
    assert encoded == EncodedPrompt("long.jsonl:1", tuple(tokenizer.encode(text)[-10:]))


def test_encoding_keeps_bos_when_truncating(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "return a + b\n" * 20}])
    tokenizer = make_tokenizer(bos=True)
    [encoded] = encode_prompts(PromptSpec(str(path), n_prompts=1, max_prompt_tokens=10), tokenizer)
    full = tokenizer.encode("return a + b\n" * 20)
    assert full[0] == tokenizer.bos_token_id
    assert encoded.ids == (full[0], *full[-9:])


def test_turns_use_chat_template_and_text_does_not(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mixed.jsonl", [{"turns": ["Write a poem.", "Shorter."]}, {"prompt": "def f"}]
    )
    tokenizer = make_tokenizer()
    chat, plain = sorted(encode_prompts(PromptSpec(str(path), n_prompts=2), tokenizer), key=lambda e: e.id)
    assert tokenizer.decode(chat.ids) == "<|user|>Write a poem.\n<|assistant|>"
    assert tokenizer.decode(plain.ids) == "def f"


def test_turns_without_chat_template_encode_first_turn(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [{"turns": ["Write a poem.", "Shorter."]}])
    [encoded] = encode_prompts(PromptSpec(str(path), n_prompts=1), make_tokenizer(chat_template=None))
    assert make_tokenizer().decode(encoded.ids) == "Write a poem."


def test_zero_token_prompts_are_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "###"}, {"prompt": "def f"}])
    with caplog.at_level(logging.WARNING, logger="skipsearch.acceptance.prompts"):
        encoded = encode_prompts(PromptSpec(str(path), n_prompts=2), make_tokenizer())
    assert [e.id for e in encoded] == ["p.jsonl:2"]
    assert "dropped 1 prompts" in caplog.text


def test_no_usable_prompts_after_encoding(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "#"}, {"prompt": ""}])
    with pytest.raises(PromptError, match="no usable prompts"):
        encode_prompts(PromptSpec(str(path), n_prompts=2), make_tokenizer())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "ok"}\n\n{"prompt": \n', r"bad\.jsonl:3: not valid JSON \("),
        ('{"prompt": "ok"}\n{"text": "x"}\n', r"bad\.jsonl:2: no 'prompt' or 'turns' field"),
        ("[1, 2]\n", r"bad\.jsonl:1: no 'prompt' or 'turns' field"),
        ('{"prompt": 5}\n', r"bad\.jsonl:1: 'prompt' must be a string, got int"),
        ('{"turns": []}\n', r"bad\.jsonl:1: 'turns' must be a non-empty list of strings"),
        ("\n  \n", r"bad\.jsonl: no prompts"),
        ("", r"bad\.jsonl: no prompts"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptError, match=message):
        load_prompts(str(path))


def test_unreadable_gzip_is_a_prompt_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl.gz"
    path.write_text('{"prompt": "not compressed"}\n')
    with pytest.raises(PromptError, match=r"bad\.jsonl\.gz: cannot read"):
        load_prompts(str(path))


def test_missing_file_lists_sources(tmp_path: Path) -> None:
    with pytest.raises(
        PromptError, match=r"prompt file .*nope\.jsonl not found: use one of humaneval, stdlib"
    ):
        PromptSpec(str(tmp_path / "nope.jsonl")).key()


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        ("spec-bench", None, "spec-bench needs a path"),
        (
            "humanevl",
            None,
            "unknown prompt source 'humanevl': use one of humaneval, stdlib, stdlib-long, spec-bench PATH",
        ),
        ("prompts.json", None, "unknown prompt source 'prompts.json'"),
        ("stdlib", "x.jsonl", "--prompts stdlib takes no path"),
    ],
)
def test_resolve_source_errors(value: str, path: str | None, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        resolve_source(value, path)


@pytest.mark.parametrize("field", ["n_prompts", "max_prompt_tokens", "new_tokens"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), 2**40, "8"])
def test_counts_outside_their_bounds_are_rejected(field: str, value: object) -> None:
    option = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{option} .*: pass "):
        PromptSpec(**{field: value})


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5])
def test_a_prompt_seed_is_in_the_samplers_range(seed: object) -> None:
    with pytest.raises(ConfigError, match="--prompt-seed"):
        PromptSpec(seed=seed)
