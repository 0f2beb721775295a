"""The eager passes of a round: the draft's stop on its own confidence, and a pillar draft reading
the pillars its previous verify chose (their losslessness through the whole decode: test_ssd.py)."""

import pytest
import torch

from skipsearch.engine import (
    GREEDY,
    GammaController,
    GammaPolicy,
    autoregressive_decode,
    speculative_decode,
    steps,
)
from skipsearch.engine.ssd import OneMask, run_rounds
from skipsearch.masks import KVPattern, SkipMask
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")


def _draft_confidences(runner, mask, monkeypatch) -> list[float]:
    """The draft's confidence at every draft step of a decode without a stop."""
    seen: list[float] = []

    def spy(logits, q, token):
        seen.append(confidence(logits, q, token))
        return seen[-1]

    confidence = steps.confidence
    monkeypatch.setattr(steps, "confidence", spy)
    speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=GammaPolicy.fixed(4, stop_below=1e-9))
    monkeypatch.setattr(steps, "confidence", confidence)
    return seen


@pytest.mark.parametrize(
    "mask",
    [SkipMask.from_layers(6, [1, 4]), SkipMask(6, attn=[3], mlp=[2])],
    ids=["sparse multi", "mlp before skipped attn"],
)
def test_a_draft_that_stops_when_unsure_is_lossless(runner, reference, mask, monkeypatch):
    """With the stop at the median of the draft's own confidence, some rounds end early and some
    draft all γ; the output is still the autoregressive one."""
    median = float(torch.tensor(_draft_confidences(runner, mask, monkeypatch)).median())
    policy = GammaPolicy.fixed(4, stop_below=median)
    result = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=policy)
    assert result.tokens == reference
    assert sum(n + 1 for n in result.accepted) == NEW_TOKENS
    drafted = set(result.gammas[:-1])  # the last round is clipped by the output's end
    assert 4 in drafted and drafted & {1, 2, 3}


def test_greedy_confidence_is_the_softmax_maximum():
    logits = torch.tensor([2.0, 0.0, 1.0])
    assert steps.confidence(logits, None, torch.tensor(0)) == pytest.approx(float(logits.softmax(-1)[0]))
    q = torch.tensor([0.1, 0.6, 0.3])
    assert steps.confidence(logits, q, torch.tensor(2)) == pytest.approx(0.3)


def test_a_pillar_draft_reads_the_pillars_its_previous_verify_chose(plan_runner, monkeypatch):
    """After each verify the steps hold the next round's pillars, inside the pattern's region, and
    the draft gathers exactly those; a new prefill forgets them."""
    kv, chosen, read = KVPattern(1, 4, 3), [], []
    eager = steps.EagerSteps(plan_runner, [SkipMask(6)], None, [kv])
    original = steps.PillarKeys.gather

    def gather(pattern, positions, cache):
        read.append([p.clone() for p in positions])
        return original(pattern, positions, cache)

    monkeypatch.setattr(steps.PillarKeys, "gather", gather)
    verify = eager.verify

    def recorded(at, proposal):
        logits = verify(at, proposal)
        chosen.append((at.start, [p.clone() for p in eager.pillars]))
        return logits

    monkeypatch.setattr(eager, "verify", recorded)
    schedule = OneMask(GammaController(GammaPolicy.fixed(3)))
    result, _ = run_rounds(plan_runner, PROMPT, NEW_TOKENS, eager, schedule, GREEDY, None, ())
    assert result.tokens == autoregressive_decode(plan_runner, PROMPT, NEW_TOKENS).tokens
    assert len(read) == len(chosen) - 1  # every round but the first drafts with pillars
    for (start, pillars), gathered in zip(chosen, read, strict=False):
        for layer, positions in enumerate(pillars):
            assert positions.shape == (plan_runner.config.num_key_value_heads, 3)
            assert ((positions >= kv.sink) & (positions < start + 1 - kv.window)).all()
            assert torch.equal(gathered[layer], positions)
    eager.prefill(PROMPT)
    assert eager.pillars == []
