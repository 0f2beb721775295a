"""Decoding on the graphed steps, run without capture: the autoregressive baseline and one mask's
rounds give the eager engine's tokens, and the baseline reads the host once per chunk."""

from collections import Counter

import pytest

from skipsearch.engine import GammaPolicy, autoregressive_decode, speculative_decode
from skipsearch.engine.graphed_decode import graphed_autoregressive_decode, graphed_speculative_decode
from skipsearch.engine.graphs import GraphSteps
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model, with_plan_attention
from tests.unit.engine.test_graphs import host_reads  # noqa: F401  (a fixture)

PROMPT = (5, 17, 3, 42, 8, 23, 11)
NEW_TOKENS = 24
GAMMA = 3
ROOM = len(PROMPT) + NEW_TOKENS + GAMMA + 2
MASK = SkipMask(4, [1], [1, 2])


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=4))


def steps_for(runner: LayerwiseRunner, head: DraftHead | None = None) -> GraphSteps:
    return GraphSteps(runner, [MASK], [GAMMA], ROOM, capture=False, heads=[head])


@pytest.mark.parametrize("check_every", [1, 5, 16, 100])
def test_graphed_autoregressive_decoding_equals_the_eager_baseline(runner, check_every) -> None:
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS)
    steps = steps_for(runner)
    for _ in range(2):  # the steps serve every sequence: the prefill resets them
        got = graphed_autoregressive_decode(steps, PROMPT, NEW_TOKENS, check_every=check_every)
        assert got.tokens == expected.tokens


def test_the_output_stops_at_the_first_end_of_sequence_token(runner) -> None:
    full = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    stop = full[6]
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS, eos_ids={stop}).tokens
    got = graphed_autoregressive_decode(steps_for(runner), PROMPT, NEW_TOKENS, eos_ids={stop}, check_every=4)
    assert got.tokens == expected == full[: full.index(stop) + 1]


def test_the_baseline_reads_the_host_once_per_chunk(runner, host_reads: Counter) -> None:  # noqa: F811
    """One read for the chunk of chosen tokens; nothing per token. A per-token read would make 24."""
    steps = steps_for(runner)
    host_reads.clear()
    graphed_autoregressive_decode(steps, PROMPT, NEW_TOKENS, check_every=8)
    assert sum(host_reads.values()) == NEW_TOKENS // 8


def test_a_sequence_longer_than_the_static_cache_is_refused(runner) -> None:
    with pytest.raises(ConfigError, match="static cache holds"):
        graphed_autoregressive_decode(steps_for(runner), PROMPT, ROOM)


@pytest.mark.parametrize("vocab", [None, range(0, 60)])
def test_graphed_rounds_of_one_mask_equal_the_eager_engine(runner, vocab) -> None:
    head = None if vocab is None else DraftHead.gather(runner, vocab)
    eager = speculative_decode(runner, PROMPT, MASK, NEW_TOKENS, GAMMA, head=head)
    policy = GammaPolicy.fixed(GAMMA)
    graphed = graphed_speculative_decode(steps_for(runner, head), PROMPT, NEW_TOKENS, policy)
    assert graphed.tokens == eager.tokens == autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    assert graphed.accepted == eager.accepted


def test_a_policy_beyond_the_captured_drafts_or_with_a_draft_stop_is_refused(runner) -> None:
    steps = steps_for(runner)
    with pytest.raises(ConfigError, match="captured up to 3"):
        graphed_speculative_decode(steps, PROMPT, NEW_TOKENS, GammaPolicy(initial=3))
    with pytest.raises(ConfigError, match="draft stop needs the eager engine"):
        graphed_speculative_decode(steps, PROMPT, NEW_TOKENS, GammaPolicy.fixed(GAMMA, 0.5))


@pytest.fixture(scope="module")
def plan_runner() -> LayerwiseRunner:
    return LayerwiseRunner(with_plan_attention(tiny_model("llama", layers=4)))


@pytest.mark.parametrize("kv", [KVPattern(2, 6), KVPattern(0, 4), KVPattern(3, 40)], ids=str)
@pytest.mark.parametrize("mask", [SkipMask(4), MASK], ids=["no skip", "skip"])
def test_graphed_kv_pattern_drafts_equal_the_eager_engine(plan_runner, kv, mask) -> None:
    """The window gathered from the device-held position into a fixed-size buffer reads the keys
    the eager engine's slice reads: the same drafts, rounds and tokens (a window wider than the
    sequence is every key)."""
    eager = speculative_decode(plan_runner, PROMPT, mask, NEW_TOKENS, GAMMA, kv=kv)
    steps = GraphSteps(plan_runner, [mask], [GAMMA], ROOM, capture=False, kvs=[kv])
    graphed = graphed_speculative_decode(steps, PROMPT, NEW_TOKENS, GammaPolicy.fixed(GAMMA))
    assert graphed.tokens == eager.tokens == autoregressive_decode(plan_runner, PROMPT, NEW_TOKENS).tokens
    assert graphed.accepted == eager.accepted


def test_pillars_are_not_captured(plan_runner) -> None:
    with pytest.raises(ConfigError, match="pillars is not captured"):
        GraphSteps(plan_runner, [MASK], [GAMMA], ROOM, capture=False, kvs=[KVPattern(1, 4, 3)])
