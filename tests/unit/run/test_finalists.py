"""The verdict's finalists: the best drafts of a search re-scored with the rounds estimator at their γ*."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from skipsearch.acceptance.estimator import Estimator
from skipsearch.cli import main
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.run.finalists import finalist_records, load_finalists, rescore
from skipsearch.search.objective import make_scorer
from skipsearch.search.results import TrialRecord
from skipsearch.store import FINALISTS_FILE, SUMMARY_FILE
from skipsearch.tree_shapes import TreeShape
from tests.conftest import make_tokenizer, random_reference, tiny_model
from tests.unit.conftest import rows_latency

LAYERS = 6


def record(number: int, mask: str, score: float, gamma: int = 1, vocab: int | str = "full") -> TrialRecord:
    return TrialRecord(
        number=number,
        mask=mask,
        num_layers=LAYERS,
        score=score,
        gamma_best=gamma,
        per_gamma={g: score for g in range(1, 5)},
        r_draft=0.5,
        strategy="learned",
        origin="sampler",
        cache_hit=False,
        repeat=False,
        eval_seconds=0.1,
        details={"draft_vocab": vocab, f"tokens_per_round_{gamma}": 1.5},
    )


@pytest.fixture(scope="module")
def measurement() -> SimpleNamespace:
    runner = LayerwiseRunner(tiny_model("llama", layers=LAYERS))
    reference = random_reference(runner, [9, 12, 7], new_tokens=24)
    vocab_ids = lambda k: range(k)  # noqa: E731 - the first k ids stand in for a frequency ranking
    return SimpleNamespace(estimator=Estimator(runner, reference, "shared-kv", vocab_ids))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = make_tokenizer()
    tiny_model("llama", layers=LAYERS, vocab_size=len(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_finalists_are_the_best_distinct_drafts() -> None:
    records = [
        record(0, "a:1|m:1", 0.7),
        record(1, "a:2|m:2", 0.9),
        record(2, "a:2|m:2", 0.9),  # the same draft again
        record(3, "a:2|m:2", 0.8, vocab=32),  # the same mask with another vocabulary: another draft
        record(4, "a:3|m:3", 0.6),
    ]
    assert [r.number for r in finalist_records(records)] == [1, 3, 0]


def test_at_gamma_1_the_exact_score_is_the_shared_kv_score(measurement: SimpleNamespace) -> None:
    """A round of one draft is exactly what shared-kv sees, so the re-score must not move — with the
    full vocabulary and with a draft vocabulary (whose argmax then defines the rounds)."""
    scorer = make_scorer("speedup", "closed-form", draft_vocab=(None, 40), vocab_size=61)
    estimator = measurement.estimator
    masks = ["a:4|m:4", "a:2,4|m:2,4"]
    records = []
    for number, text in enumerate(masks):
        mask = SkipMask.parse(text, LAYERS)
        for vocab in (None, 40):
            profile = estimator.evaluate(mask, 1.0, (40,)).for_vocab(vocab)
            score = scorer(mask, profile)
            searched = record(2 * number + (vocab is not None), text, score.per_gamma[1], 1, vocab or "full")
            records.append(searched)
    finalists = rescore(records, measurement, scorer, 1.0)
    assert len(finalists) == 3
    assert [f.exact_score for f in finalists] == sorted((f.exact_score for f in finalists), reverse=True)
    for finalist in finalists:
        assert finalist.exact_score == pytest.approx(finalist.search_score)


def test_at_gamma_3_the_rounds_are_the_engines(measurement: SimpleNamespace) -> None:
    scorer = make_scorer("speedup", "closed-form")
    mask = SkipMask.parse("a:1,3|m:1,3", LAYERS)
    finalist = rescore([record(0, str(mask), 0.9, gamma=3)], measurement, scorer, 1.0)[0]
    exact = Estimator(measurement.estimator.runner, measurement.estimator.reference, "rounds", round_gamma=3)
    assert finalist.exact_tokens_per_round == pytest.approx(exact.evaluate(mask).tokens_per_round(3))
    assert finalist.exact_score == pytest.approx(scorer(mask, exact.evaluate(mask)).per_gamma[3])


def test_a_run_writes_its_finalists_and_its_verdict_ranks_by_them(
    model_dir: str, tmp_path: Path, cache_in_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    args = ["run", "--model", model_dir, "--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "24"]
    assert main([*args, "--budget", "4", "--strategy", "random", "--out", str(out)]) == 0
    finalists = load_finalists(out)
    assert 1 <= len(finalists) <= 3 and (out / FINALISTS_FILE).is_file()
    best = json.loads((out / "best.json").read_text())
    assert (
        best["mask"] == finalists[0].mask and best["finalists"][0]["exact_score"] == finalists[0].exact_score
    )
    text = (out / SUMMARY_FILE).read_text()
    assert "Finalists re-scored exactly" in text and "kernel plan: " in text
    assert f"{finalists[0].exact_score:.2f}x" in text.split("## Verdict")[1]


def test_a_tree_finalist_is_re_scored_with_its_own_trees_rounds(measurement) -> None:
    """A draft whose search chose the tree 2x1 is re-measured in rounds mode simulating that tree,
    and its exact score is the tree's, from those rounds."""
    tree = TreeShape.parse("2x1")
    best = record(0, "a:2|m:2", 1.3)
    best = TrialRecord(
        **{**best.__dict__, "details": {**best.details, "tree": "2x1", "tree_tokens_per_round": 2.0}}
    )
    scorer = make_scorer(cost="calibrated", latency=rows_latency(0.0, LAYERS), trees=(tree,))
    [finalist] = rescore([best], measurement, scorer, 1.0)
    assert (finalist.tree, finalist.gamma) == ("2x1", tree.depth)
    estimator = measurement.estimator
    exact = Estimator(estimator.runner, estimator.reference, "rounds", round_tree=tree)
    profile = exact.evaluate(SkipMask.parse("a:2|m:2", LAYERS), 1.0)
    assert finalist.exact_tokens_per_round == profile.tree_tokens_per_round(tree)
    assert (
        finalist.exact_score
        == scorer(SkipMask.parse("a:2|m:2", LAYERS), profile).details["score_by_tree"]["2x1"]
    )
