"""The verdict's finalists, re-scored exactly: the top masks of a search in `rounds` mode at their γ*.

A search ranks masks with the cheap `shared-kv` estimator, which sees every draft step as the first
of its round and so overrates sparse masks by up to 6% (docs/search.md). The `rounds` estimator
simulates the engine's own rounds at one γ and matches the engine exactly there, at three times
the cost — too dear for every mask, cheap for a few. So once the search ends, its `FINALISTS`
best distinct drafts (mask, draft vocabulary and KV pattern) are measured again in `rounds` mode at their own
γ*, scored by the run's own cost model at that γ, and the verdict ranks them by that exact score.
The finalists are written to `finalists.json`, which `report` reads back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.masks import FULL_KV, FULL_VOCAB, KVPattern, SkipMask, parse_draft_vocab
from skipsearch.search.results import TrialRecord
from skipsearch.store import FINALISTS_FILE, write_text_atomic
from skipsearch.tree_shapes import CHAIN, as_tree, tree_label

if TYPE_CHECKING:
    from skipsearch.acceptance.worker import Measurement
    from skipsearch.search.score import Scorer

FINALISTS = 3


@dataclass(frozen=True)
class Finalist:
    """One finalist: its search score (`shared-kv` or the run's mode) and its exact score (`rounds`
    at γ*), with the tokens per round each predicts at γ*."""

    trial: int
    mask: str
    draft_vocab: int | str
    gamma: int
    search_score: float
    exact_score: float
    search_tokens_per_round: float | None
    exact_tokens_per_round: float
    kv: str = FULL_KV  # finalists.json files written before KV patterns lack it
    tree: str = CHAIN  # the round shape as finalists.json labels it (`tree_label`; `as_tree` reads it)


def finalist_records(records: list[TrialRecord], count: int = FINALISTS) -> list[TrialRecord]:
    """The `count` best distinct drafts (mask, draft vocabulary, KV pattern and round shape), best first."""
    chosen: dict[tuple[str, object, object, object], TrialRecord] = {}
    for record in sorted(records, key=lambda r: (-r.score, r.number)):
        details = record.details
        key = (
            record.mask,
            details.get("draft_vocab", FULL_VOCAB),
            details.get("kv", FULL_KV),
            details.get("tree"),
        )
        chosen.setdefault(key, record)
    return list(chosen.values())[:count]


def rescore(
    records: list[TrialRecord], measurement: Measurement, scorer: Scorer, temperature: float
) -> list[Finalist]:
    """Each finalist measured in `rounds` mode at its γ* (or simulating its token tree's rounds)
    and scored by `scorer` at that γ (or that tree); best first."""
    from skipsearch.acceptance.estimator import Estimator

    estimator = measurement.estimator
    finalists = []
    for record in finalist_records(records):
        vocab = parse_draft_vocab(record.details.get("draft_vocab", FULL_VOCAB))
        kv = KVPattern.parse(record.details.get("kv", FULL_KV))
        tree = as_tree(record.details.get("tree"))
        label = tree_label(tree)
        exact = Estimator(
            estimator.runner,
            estimator.reference,
            "rounds",
            estimator.vocab_ids,
            round_gamma=record.gamma_best,
            round_vocab=vocab,
            round_tree=tree,
        )
        mask = SkipMask.parse(record.mask, record.num_layers)
        vocabs = () if vocab is None else (vocab,)
        profile = exact.evaluate(mask, temperature, vocabs, kv).for_vocab(vocab, kv)
        score = scorer(mask, profile)
        gamma = record.gamma_best
        if tree is not None:  # the tree's own score, from its simulated rounds
            finalists.append(
                Finalist(
                    trial=record.number,
                    mask=record.mask,
                    draft_vocab=record.details.get("draft_vocab", FULL_VOCAB),
                    gamma=tree.depth,
                    search_score=record.score,
                    exact_score=score.details["score_by_tree"][label],
                    search_tokens_per_round=record.details.get("tree_tokens_per_round"),
                    exact_tokens_per_round=profile.tree_tokens_per_round(tree),
                    kv=record.details.get("kv", FULL_KV),
                    tree=label,
                )
            )
            continue
        finalists.append(
            Finalist(
                trial=record.number,
                mask=record.mask,
                draft_vocab=record.details.get("draft_vocab", FULL_VOCAB),
                gamma=gamma,
                search_score=record.per_gamma[gamma],
                exact_score=score.per_gamma[gamma],
                search_tokens_per_round=record.details.get(f"tokens_per_round_{gamma}"),
                exact_tokens_per_round=profile.tokens_per_round(gamma),
                kv=record.details.get("kv", FULL_KV),
            )
        )
    return sorted(finalists, key=lambda f: -f.exact_score)


def save_finalists(run_dir: Path, finalists: list[Finalist]) -> None:
    write_text_atomic(run_dir / FINALISTS_FILE, json.dumps([asdict(f) for f in finalists], indent=2))


def load_finalists(run_dir: Path) -> list[Finalist]:
    """The finalists a run wrote, best first; none for a run that ended before they were re-scored."""
    path = run_dir / FINALISTS_FILE
    if not path.is_file():
        return []
    return [Finalist(**item) for item in json.loads(path.read_text())]
