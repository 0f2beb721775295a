"""The round-aware estimator (`rounds` mode) reproduces the SSD engine's greedy rounds exactly.

The engine's draft reads the full model's K/V before its round and its own K/V within it; the
`rounds` mode simulates that, so at every position the engine judges, the estimator's greedy match
must equal the engine's accept decision — where `shared-kv` (full K/V within the round too) may not.
"""

import pytest

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.rounds import round_starts, simulate_rounds
from skipsearch.engine import speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import random_reference, tiny_model

LAYERS = 6
NEW_TOKENS = 24
MASKS = [
    SkipMask.from_layers(LAYERS, [2]),
    SkipMask.from_layers(LAYERS, [1, 4]),
    SkipMask(LAYERS, attn=[3], mlp=[1, 5]),
    SkipMask(LAYERS, attn=[], mlp=[2, 4]),
    SkipMask.prefix(LAYERS, 4),
]


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", layers=LAYERS, seed=1)
    model.generation_config.eos_token_id = None
    runner = LayerwiseRunner(model)
    reference = random_reference(runner, [7, 12, 5, 9], new_tokens=NEW_TOKENS, seed=5)
    return runner, reference


def engine_judgements(runner, reference, mask, gamma) -> list[tuple[int, int, bool]]:
    """(reference row, continuation offset, accepted) of every draft token the engine judged."""
    judged = []
    for row in range(reference.input_ids.shape[0]):
        prompt = reference.input_ids[row, : int(reference.prompt_lengths[row])].tolist()
        result = speculative_decode(runner, prompt, mask, NEW_TOKENS, gamma=gamma)
        continuation = reference.input_ids[row, len(prompt) : int(reference.lengths[row])].tolist()
        assert list(result.tokens) == continuation  # lossless: the engine judges the same tokens
        offset = 0
        for drafted, accepted in zip(result.gammas, result.accepted, strict=True):
            judged += [(row, offset + j, j < accepted) for j in range(min(accepted + 1, drafted))]
            offset += accepted + 1
    return judged


def disagreements(profile, judged) -> int:
    return sum(profile.greedy_match[row][offset] != accepted for row, offset, accepted in judged)


def test_rounds_mode_matches_every_engine_judgement(setup) -> None:
    runner, reference = setup
    shared = Estimator(runner, reference, "shared-kv")
    shared_misses = 0
    for gamma in (2, 4):
        rounds = Estimator(runner, reference, "rounds", round_gamma=gamma)
        for mask in MASKS:
            judged = engine_judgements(runner, reference, mask, gamma)
            assert disagreements(rounds.evaluate(mask, temperature=0), judged) == 0, (mask, gamma)
            shared_misses += disagreements(shared.evaluate(mask, temperature=0), judged)
        assert len(rounds.passes) == len(MASKS) and min(rounds.passes) >= 2
    assert shared_misses > 0  # the engine's own K/V within a round matters on these masks


def test_rounds_mode_is_shared_kv_for_a_contiguous_exit(setup) -> None:
    """A prefix's K/V is the full model's, so the round structure cannot change a match."""
    runner, reference = setup
    mask = SkipMask.prefix(LAYERS, 3)
    rounds = Estimator(runner, reference, "rounds", round_gamma=3).evaluate(mask)
    shared = Estimator(runner, reference, "shared-kv").evaluate(mask)
    assert rounds.greedy_match == shared.greedy_match


def test_round_starts_follow_simulated_rounds() -> None:
    matches = [True, True, False, True, True, True, False, True]
    # gamma 3: round at 0 accepts 2 (drafts 0,1,2), next at 3 accepts 3 (drafts 3,4,5; 6 is the
    # verify's bonus position, never drafted), next at 7 is censored (drafts 7)
    assert round_starts(matches, 3) == [0, 0, 0, 3, 3, 3, 6, 7]
    assert simulate_rounds(matches, 3) == [2, 3]
    assert round_starts(matches, 1) == list(range(8))  # one draft per round: each alone
    assert round_starts([], 2) == []
    with pytest.raises(ValueError):
        round_starts(matches, 0)
