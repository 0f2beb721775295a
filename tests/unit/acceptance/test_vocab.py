"""Draft vocabulary ranking: ordering, bounds of `top`, storage, and disjointness from the prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from skipsearch.acceptance import vocab
from skipsearch.acceptance.prompts import Prompt, PromptSpec, load_prompts, select_prompts
from skipsearch.acceptance.vocab import (
    Corpus,
    Document,
    VocabRanking,
    build_ranking,
    check_disjoint,
    count_tokens,
    rank_ids,
    ranking_for,
    read_corpus_file,
    stdlib_corpus,
)
from skipsearch.errors import ConfigError
from skipsearch.models.loading import LoadedModel
from skipsearch.store import DRAFT_VOCAB_FILE, draft_vocab_cache_path
from tests.conftest import make_tokenizer, tiny_model

CODE = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    """A tiny model whose head has 28 rows more than its tokenizer has ids (292): never produced."""
    return LoadedModel(tiny_model(vocab_size=320), make_tokenizer(), "tiny", "test")


def _ranking(ids: tuple[int, ...] = (2, 0, 3, 1), specials: int = 1) -> VocabRanking:
    return VocabRanking(len(ids), ids, specials, {"source": "hand-made"})


# -- ordering -------------------------------------------------------------------------------------


def test_specials_first_then_descending_count_ties_by_ascending_id() -> None:
    counts = np.array([0, 5, 3, 5, 0, 1, 9])
    ids, specials = rank_ids(counts, {6, 4, 99})  # 99 is outside the head: ignored
    assert ids == (4, 6, 1, 3, 2, 5, 0)
    assert specials == 2


def test_build_ranking_counts_the_tokenizer_ids(loaded: LoadedModel) -> None:
    tokenizer = loaded.tokenizer
    corpus = Corpus((Document("a", CODE), Document("b", CODE + "x = 1\n")), "hand-made")
    ranking = build_ranking(tokenizer, corpus, 320, {0, 2}, "tiny")
    expected = np.bincount(tokenizer.encode(CODE) * 2 + tokenizer.encode("x = 1\n"), minlength=320)
    assert np.array_equal(count_tokens(tokenizer, corpus.documents, 320), expected)
    assert ranking.specials == (0, 2)
    rest = ranking.ids[2:]
    assert [expected[i] for i in rest] == sorted((expected[i] for i in rest), reverse=True)
    assert ranking.ids[-28:] == tuple(range(292, 320))  # never produced: last, ascending
    assert ranking.provenance["tokens"] == int(expected.sum())
    assert ranking.provenance["distinct_ids"] == int(np.count_nonzero(expected))
    assert ranking.provenance["documents"] == 2
    assert ranking.provenance["corpus_sha256"] == corpus.digest()


def test_a_ranking_must_be_a_permutation_of_the_vocabulary() -> None:
    with pytest.raises(ConfigError, match=r"every id 0\.\.3 exactly once"):
        VocabRanking(4, (0, 1, 1, 3), 1)
    with pytest.raises(ConfigError, match="num_specials"):
        VocabRanking(2, (0, 1), 3)


# -- top ------------------------------------------------------------------------------------------


def test_top_is_a_prefix_and_none_is_everything() -> None:
    ranking = _ranking()
    assert ranking.top(None) == (2, 0, 3, 1)
    assert ranking.top(4) == (2, 0, 3, 1)
    assert ranking.top(1) == (2,)


@pytest.mark.parametrize("k", [0, -3, 5, True, 2.5])
def test_top_out_of_range_names_the_vocabulary_and_the_fix(k: object) -> None:
    with pytest.raises(
        ConfigError, match=r"this model's 4 ids .* use --draft-vocab between 1 and 4, or full"
    ):
        _ranking().top(k)


def test_top_keeps_every_special_token() -> None:
    ranking = _ranking(specials=3)
    assert ranking.top(3) == (2, 0, 3)
    with pytest.raises(ConfigError, match=r"3 of them special tokens .* between 3 and 4"):
        ranking.top(2)


# -- storage --------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path) -> None:
    ranking = _ranking()
    path = ranking.save(tmp_path / DRAFT_VOCAB_FILE)
    again = VocabRanking.load(path)
    assert again == ranking
    assert again.provenance == ranking.provenance
    assert len(path.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"version": 1, "vocab_size": 4, "ids": [2, 0', "unreadable"),
        ("[1, 2]", "not a JSON object"),
        (
            '{"version": 1, "vocab_size": 4, "num_specials": 1, "provenance": {}}',
            "damaged \\(no field 'ids'\\)",
        ),
        ('{"version": 1, "vocab_size": 4, "num_specials": 1, "provenance": {}, "ids": [0, 1]}', "damaged"),
        ('{"version": 7, "vocab_size": 1, "num_specials": 0, "provenance": {}, "ids": [0]}', "version 7"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / DRAFT_VOCAB_FILE
    path.write_text(text)
    with pytest.raises(ConfigError, match=why) as error:
        VocabRanking.load(path)
    assert str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no draft vocabulary ranking at"):
        VocabRanking.load(tmp_path / "nope.json")


# -- disjointness ---------------------------------------------------------------------------------


def test_a_corpus_holding_a_measurement_prompt_is_refused() -> None:
    prompt = load_prompts("humaneval")[0]
    leaked = Document("mine.py", "# my code\n" + prompt.text + "    pass\n")
    check_disjoint([Document("other.py", CODE)], [prompt])
    with pytest.raises(ConfigError, match=r"'mine.py' contains measurement prompt 'HumanEval.jsonl.gz:1'"):
        check_disjoint([Document("other.py", CODE), leaked], [prompt])


def test_a_short_prompt_is_not_looked_for() -> None:
    check_disjoint([Document("a.py", "x = 1\nreturn a + b\n")], [Prompt("p", "return a + b", chat=False)])


def test_the_default_corpus_leaves_out_the_files_stdlib_prompts_come_from() -> None:
    every = len(load_prompts("stdlib"))
    prompts = select_prompts(PromptSpec(source="stdlib", n_prompts=every))  # every stdlib prompt
    plain = stdlib_corpus(max_files=40)
    with pytest.raises(ConfigError, match="contains measurement prompt 'stdlib/"):
        check_disjoint(plain.documents, prompts)
    corpus = stdlib_corpus(prompts, max_files=40)
    check_disjoint(corpus.documents, prompts)
    assert corpus.dropped
    assert len(corpus.documents) == 40
    assert not {d.name for d in corpus.documents} & set(corpus.dropped)
    assert not any(name.split("/")[0] in ("site-packages", "test", "encodings") for name in corpus.dropped)


def test_the_default_corpus_leaves_out_every_file_a_long_prompt_comes_from() -> None:
    """The long-context prompt set is disjoint from the counting corpus a draft vocabulary is
    ranked on, whichever files the corpus samples."""
    prompts = load_prompts("stdlib-long")
    corpus = stdlib_corpus(prompts, max_files=10**5, max_chars=10**10)  # the whole standard library
    check_disjoint(corpus.documents, prompts)
    assert {p.id.split("/")[1].split(":")[0] for p in prompts} <= set(corpus.dropped)


def test_the_default_corpus_is_a_seeded_sample_under_its_caps() -> None:
    first, again, other = (
        stdlib_corpus(max_files=5),
        stdlib_corpus(max_files=5),
        stdlib_corpus(max_files=5, seed=1),
    )
    assert first == again and first.digest() == again.digest()
    assert first.digest() != other.digest()
    assert len(stdlib_corpus(max_chars=1).documents) == 1
    with pytest.raises(ConfigError, match="max_files must be >= 1"):
        stdlib_corpus(max_files=0)


def test_read_corpus_file(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(CODE)
    assert read_corpus_file(tmp_path / "mine.py") == Document("mine.py", CODE)
    with pytest.raises(ConfigError, match=r"cannot read ranking corpus .*nope\.txt"):
        read_corpus_file(tmp_path / "nope.txt")


# -- ranking_for ----------------------------------------------------------------------------------


def test_ranking_for_counts_once_then_reads_the_cache(
    loaded: LoadedModel, cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = PromptSpec(source="humaneval", n_prompts=2)
    extra = [Document("mine.py", CODE * 3)]
    ranking = ranking_for(loaded, spec, extra, max_files=3)
    corpus = stdlib_corpus(select_prompts(spec), max_files=3).with_documents(extra)
    path = draft_vocab_cache_path("tiny", corpus.digest())
    assert VocabRanking.load(path) == ranking
    assert ranking.vocab_size == 320
    assert ranking.specials == (0, 2)  # the tokenizer's <s> and the model's EOS
    assert ranking.provenance["documents"] == 4
    assert ranking.provenance["source"].endswith("+ 1 given")

    def no_counting(*args: object) -> None:
        raise AssertionError("counted again")

    monkeypatch.setattr(vocab, "build_ranking", no_counting)
    assert ranking_for(loaded, spec, extra, max_files=3) == ranking


def test_ranking_for_refuses_given_text_with_a_measurement_prompt(
    loaded: LoadedModel, cache_in_tmp: Path
) -> None:
    spec = PromptSpec(source="humaneval", n_prompts=3)
    leaked = Document("leak.txt", "\n".join(p.text for p in select_prompts(spec)))
    with pytest.raises(ConfigError, match=r"'leak\.txt' contains measurement prompt"):
        ranking_for(loaded, spec, [leaked], max_files=3)
    assert not cache_in_tmp.exists()


def test_ranking_json_is_plain_data(tmp_path: Path) -> None:
    data = json.loads(_ranking().save(tmp_path / "r.json").read_text())
    assert data == {
        "version": 1,
        "vocab_size": 4,
        "num_specials": 1,
        "provenance": {"source": "hand-made"},
        "ids": [2, 0, 3, 1],
    }
