"""The SSD round: greedy output equals autoregressive decoding for every mask, γ and family; the
cache rollback and the round records (sampled output: test_sampling.py)."""

import json

import pytest

from skipsearch.engine import (
    GammaPolicy,
    Summary,
    autoregressive_decode,
    speculative_decode,
    ssd,
    steps,
)
from skipsearch.engine import shared_kv as cache_ops
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT, Traffic

pytestmark = pytest.mark.usefixtures("one_thread")

MASKS = {
    "contiguous exit 3": SkipMask.prefix(6, 3),
    "sparse single": SkipMask.from_layers(6, [2]),
    "sparse multi": SkipMask.from_layers(6, [1, 4]),
    "first layer": SkipMask.from_layers(6, [0, 3]),
    "attn only": SkipMask(6, attn=[2, 5]),
    "mlp only": SkipMask(6, mlp=[1, 4]),
    "mlp before skipped attn": SkipMask(6, attn=[3], mlp=[2]),
    "last mlp": SkipMask(6, mlp=[5]),
    "empty": SkipMask(6),
}


GAMMAS = {
    "1": 1,
    "3": 3,
    "6": 6,
    "dynamic": GammaPolicy(initial=2, gamma_max=5, min_samples=4, raise_above=0.6, lower_below=0.5),
}


def _rollback_off_by_one(monkeypatch):
    """Make the rollback (the crop of all layers) keep one rejected position too many."""

    def crop(cache, length, layers=None):
        cache_ops.crop(cache, length + (layers is None), layers)

    monkeypatch.setattr(steps, "crop", crop)  # the chain's rollback (`ChainProposal.roll_back`)


@pytest.mark.parametrize("gamma", GAMMAS.values(), ids=GAMMAS.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_greedy_ssd_equals_autoregressive(runner, reference, mask, gamma):
    result = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=gamma)
    assert result.tokens == reference
    assert sum(n + 1 for n in result.accepted) == NEW_TOKENS


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("mistral", {"sliding_window": 8}), ("qwen2", {})],
    ids=["mistral-window-8", "qwen2"],
)
@pytest.mark.parametrize("mask", [SkipMask.from_layers(4, [1, 2]), SkipMask(4, attn=[0], mlp=[3])], ids=str)
def test_greedy_is_lossless_for_other_families(family, overrides, mask):
    """Mistral's window of 8 is crossed many times: rollback must restore the recorded past."""
    runner = LayerwiseRunner(tiny_model(family, layers=4, **overrides))
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    assert speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=4).tokens == expected


def test_switched_off_speculation_decodes_plainly(runner, reference):
    """Thresholds of 1 switch off at the first rejection; the rest are γ = 0 rounds."""
    policy = GammaPolicy(initial=3, min_samples=1, raise_above=1.0, lower_below=1.0, off_below=1.0)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=policy)
    assert result.tokens == reference
    assert result.gammas[0] == 3 and result.gammas[-1] == 0


def test_stops_after_end_of_sequence(runner, reference):
    eos = reference[10]
    cut = reference[: reference.index(eos) + 1]
    assert autoregressive_decode(runner, PROMPT, NEW_TOKENS, eos_ids={eos}).tokens == cut
    assert speculative_decode(runner, PROMPT, MASKS["sparse single"], NEW_TOKENS, eos_ids={eos}).tokens == cut


def test_cache_length_is_checked_after_every_round(runner, monkeypatch):
    checked: list[int] = []

    def spy(cache, expected):
        checked.append(expected)
        cache_ops.check_lengths(cache, expected)

    monkeypatch.setattr(ssd, "check_lengths", spy)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    assert len(checked) == len(result.accepted) + 1
    assert checked[-1] == len(PROMPT) + NEW_TOKENS - 1


def test_rollback_off_by_one_trips_the_invariant(runner, monkeypatch):
    _rollback_off_by_one(monkeypatch)
    with pytest.raises(AssertionError, match="KV cache out of step"):
        speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)


def test_rollback_off_by_one_changes_the_output(runner, reference, monkeypatch):
    """Without the check, the stale position is attended to and the output drifts."""
    _rollback_off_by_one(monkeypatch)
    monkeypatch.setattr(ssd, "check_lengths", lambda cache, expected: None)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    assert result.tokens != reference


def test_round_records(runner):
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    summary = Summary.of([result])
    assert len(result.timings) == summary.rounds == len(result.gammas)
    assert result.timings[0].context == len(PROMPT)
    assert [t.context for t in result.timings] == sorted(t.context for t in result.timings)
    assert 0 < summary.acceptance <= 1
    assert summary.tokens_per_round == pytest.approx(NEW_TOKENS / summary.rounds)
    assert json.loads(json.dumps(result.to_dict()))["tokens"] == list(result.tokens)


KV_PATTERNS = {
    "sink and window": KVPattern(2, 6),
    "window only": KVPattern(0, 4),
    "with pillars": KVPattern(1, 4, 3),
}


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("mask", [SkipMask(6), SkipMask.from_layers(6, [2])], ids=["no skip", "skip 2"])
@pytest.mark.parametrize("kv", KV_PATTERNS.values(), ids=KV_PATTERNS.keys())
def test_greedy_ssd_with_a_kv_pattern_equals_autoregressive(plan_runner, kv, mask, gamma):
    reference = autoregressive_decode(plan_runner, PROMPT, NEW_TOKENS).tokens
    result = speculative_decode(plan_runner, PROMPT, mask, NEW_TOKENS, gamma=gamma, kv=kv)
    assert result.tokens == reference
    assert any(n < g for n, g in zip(result.accepted, result.gammas, strict=True))  # the pattern bites


# -- host reads ------------------------------------------------------------------------------------
SWITCHED_OFF = GammaPolicy(initial=3, min_samples=1, raise_above=1.0, lower_below=1.0, off_below=1.0)


@pytest.mark.parametrize("gamma", [3, GAMMAS["dynamic"], SWITCHED_OFF], ids=["3", "dynamic", "switched off"])
def test_an_untimed_greedy_round_reads_the_host_once(runner, reference, traffic, gamma):
    """Counted (`Traffic`): every read of a tensor's value from Python — the engine's and the
    model's forward's, which reads nothing here (transformers' modules over a DynamicCache, whose
    lengths are shapes) — host-to-device copies, device syncs and cache checks. Untimed, each round
    reads once (`greedy_commit`: the accepted count with the committed tokens) and copies nothing
    (its pending token stays on the device); the decode copies twice (the prompt, its last token),
    syncs once (after the prefill) and checks the cache once (after the last round)."""
    mask = MASKS["sparse multi"]
    result, seen = traffic(
        lambda: speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=gamma, timed=False)
    )
    assert result.tokens == reference and result.timings == ()
    assert seen == Traffic(reads=len(result.accepted), copies=2, syncs=1, checks=1)


def test_a_timed_round_syncs_at_every_phase_boundary(runner, reference, traffic):
    """The breakdown stays what it was: each round syncs at its start, its end and both ends of its
    five phases (draft, cache, verify, sample, cache), and checks the cache; the decode also checks
    it after the prefill."""
    mask = MASKS["sparse multi"]
    result, seen = traffic(lambda: speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=3, timed=True))
    rounds = len(result.accepted)
    assert result.tokens == reference
    assert len(result.timings) == rounds and all(t.draft > 0 and t.verify > 0 for t in result.timings)
    assert seen == Traffic(reads=rounds, copies=2, syncs=1 + 12 * rounds, checks=1 + rounds)


def test_a_draft_that_stops_reads_its_confidence_after_every_draft_token(runner, reference, traffic):
    """The stop's reads (`steps.draft`): one per draft token, beside the round's own."""
    mask = MASKS["sparse multi"]
    policy = GammaPolicy.fixed(4, stop_below=0.5)
    result, seen = traffic(
        lambda: speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=policy, timed=False)
    )
    assert result.tokens == reference
    assert seen.reads == len(result.accepted) + sum(result.gammas)
