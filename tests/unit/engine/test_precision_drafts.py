"""Drafts at lower precision through the engine (`models.draft_weights`): greedy output equals
autoregressive decoding token for token with int8 and int4 sub-layers — alone, beside skips, with a
changed MLP just below `s1`, with draft vocabularies, KV patterns, token trees (static and dynamic),
a confidence stop, tiers and the graphed steps run eagerly — and sampled output follows the target's
distribution on the first two tokens."""

import pytest
import torch

from skipsearch.engine import GammaPolicy, Sampling, speculative_decode
from skipsearch.engine.graphed_decode import graphed_speculative_decode
from skipsearch.engine.graphed_tree import TreeGraphSteps, graphed_tree_decode
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.steps import EagerSteps, draft_forward
from skipsearch.engine.tiered import tiered_decode
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tree_shapes import DynamicTree, TreeShape
from tests.conftest import tiny_model
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT
from tests.unit.engine.test_sampling import CHI2_7_999, _chi_square

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 6
MASKS = {
    "int8 everywhere": "w8:0-5",
    "int4 everywhere": "w4:0-5",
    "int8 MLP below s1": "w8m:1|w4:3-5",  # s1 = 2: verify completes layer 1 with the full MLP
    "int4 MLP then skipped attention": "w4m:0|a:2|w8:4",
    "skips and int4": "a:1|m:1|w4:2-5",
    "int8 attention, skipped MLP": "w8a:2|m:2|w4m:4",
}


def mask_of(text: str) -> SkipMask:
    return SkipMask.parse(text, LAYERS)


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("text", MASKS.values(), ids=MASKS.keys())
def test_greedy_lower_precision_drafts_equal_autoregressive(runner, reference, text, gamma) -> None:
    assert speculative_decode(runner, PROMPT, mask_of(text), NEW_TOKENS, gamma=gamma).tokens == reference


def test_the_draft_runs_its_copies_and_its_exact_state_is_the_full_models(runner) -> None:
    """A changed MLP just below `s1`: the exact state is that layer's attention output, the logits
    come from the int8 MLP on it (not the full one, not the state with no MLP at all)."""
    mask, cache = mask_of("w8m:1|w4:3-5"), runner.new_cache()
    token, at = torch.tensor([[5]]), torch.tensor([[0]])
    exact, logits = draft_forward(runner, mask, token, at, cache)
    hidden = runner.embed(token)
    expected = runner.attention(1, runner.run_layers(hidden, 0, 1, at), runner.rotary(hidden, at), None)
    torch.testing.assert_close(exact, expected)
    skipped = runner.head(
        runner.run_layers(runner.embed(token), 0, LAYERS, at, SkipMask.parse("m:1|w4:3-5", 6))
    )
    assert not torch.allclose(logits, skipped) and not torch.allclose(logits, runner.forward(token))


def test_the_draft_weights_are_loaded_when_the_steps_are_built(runner) -> None:
    mask = mask_of("w4a:5")
    EagerSteps(runner, [mask])
    assert runner.draft_weights.loaded_bytes >= runner.draft_weights.nbytes(mask) > 0


@pytest.mark.parametrize("text", ["w8:0-5", "a:1|m:1|w4:2-5"])
def test_with_a_draft_vocabulary(runner, reference, text) -> None:
    head = DraftHead.gather(runner, list(range(0, 61, 2)))
    result = speculative_decode(runner, PROMPT, mask_of(text), NEW_TOKENS, gamma=3, head=head)
    assert result.tokens == reference


@pytest.mark.parametrize("kv", [KVPattern(2, 6), KVPattern(1, 4, 3)], ids=str)
@pytest.mark.parametrize("text", ["w8:0-5", "w4:0-5"])
def test_with_a_kv_pattern(plan_runner, text, kv) -> None:
    from skipsearch.engine import autoregressive_decode

    expected = autoregressive_decode(plan_runner, PROMPT, NEW_TOKENS).tokens
    result = speculative_decode(plan_runner, PROMPT, mask_of(text), NEW_TOKENS, gamma=3, kv=kv)
    assert result.tokens == expected


@pytest.mark.parametrize("shape", ["2x2x1", "n8d3k2"])
@pytest.mark.parametrize("text", ["w8m:1|w4:3-5", "a:1|m:1|w4:2-5"])
def test_with_token_trees(runner, reference, text, shape) -> None:
    tree = DynamicTree.parse(shape) if shape.startswith("n") else TreeShape.parse(shape)
    result = tree_decode(runner, PROMPT, mask_of(text), tree, NEW_TOKENS, timed=False)
    assert result.tokens == reference
    assert max(result.accepted) >= 2


def test_with_a_confidence_stop(runner, reference) -> None:
    policy = GammaPolicy.fixed(4, stop_below=0.6)
    result = speculative_decode(runner, PROMPT, mask_of("a:1|m:1|w4:2-5"), NEW_TOKENS, gamma=policy)
    assert result.tokens == reference
    assert min(result.gammas[:-1]) < 4  # some rounds stopped early


def test_with_tiers_on_the_graphed_steps_run_eagerly(runner, reference) -> None:
    masks = (mask_of("w8:0-5"), mask_of("a:1|m:1|w4:2-5"))
    policy = TierPolicy(window=2, thresholds=(0.5,))
    eager = tiered_decode(runner, PROMPT, masks, (2, 3), policy, NEW_TOKENS)
    steps = GraphSteps(runner, masks, (2, 3), len(PROMPT) + NEW_TOKENS + 5, capture=False)
    graphed = tiered_decode(runner, PROMPT, masks, (2, 3), policy, NEW_TOKENS, steps=steps)
    assert eager.result.tokens == graphed.result.tokens == reference
    assert eager.tiers == graphed.tiers


@pytest.mark.parametrize("text", ["w4:0-5", "w8m:1|w4:3-5"])
def test_graphed_chains_and_trees_run_eagerly(runner, reference, text) -> None:
    mask, room = mask_of(text), len(PROMPT) + NEW_TOKENS + 8
    chain = graphed_speculative_decode(
        GraphSteps(runner, [mask], [3], room, capture=False), PROMPT, NEW_TOKENS, GammaPolicy.fixed(3)
    )
    assert chain.tokens == reference
    tree = TreeGraphSteps(GraphSteps(runner, [mask], [0], room, capture=False), TreeShape.parse("2x2x1"))
    assert graphed_tree_decode(tree, PROMPT, NEW_TOKENS).tokens == reference


# -- sampling -------------------------------------------------------------------------------------
def eight_token_runner() -> LayerwiseRunner:
    """`tests.conftest.eight_token_model` 32 wide (int4 groups are at least 32 inputs), its seed chosen
    so that at T = 5 every p(x) >= 0.028 and the drafts below are 0.07 and 0.5 from p in total variation."""
    model = tiny_model(
        "llama",
        layers=3,
        seed=11,
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.1,
    )
    return LayerwiseRunner(model)


@pytest.mark.parametrize("text", ["w4:0-2", "a:1|m:1|w8:0|w4:2"])
def test_sampled_first_two_tokens_follow_the_target(text) -> None:
    """The draft's q is its own (the quantized sub-layers'), so rejection sampling keeps the output
    the target's: the first token follows p, the second the marginal sum_t p(t) p(. | t) (chi-square,
    8 bins each)."""
    runner, sampling, prompt = eight_token_runner(), Sampling(temperature=5.0), (1, 5, 3)
    mask = SkipMask.parse(text, 3)
    with torch.no_grad():
        p = sampling.probs(runner.forward(torch.tensor([prompt]))[0, -1])
        firsts = torch.tensor([[*prompt, t] for t in range(8)])
        marginal = p @ sampling.probs(runner.forward(firsts)[:, -1])
        q = sampling.probs(runner.forward(torch.tensor([prompt]), mask)[0, -1])
    assert float((p - q).abs().sum()) / 2 > 0.05  # the draft is not the target
    counts = torch.zeros(2, 8)
    for seed in range(600):
        generator = torch.Generator().manual_seed(seed)
        result = speculative_decode(runner, prompt, mask, 2, gamma=2, sampling=sampling, generator=generator)
        counts[0, result.tokens[0]] += 1
        counts[1, result.tokens[1]] += 1
    assert _chi_square(counts[0], p) < CHI2_7_999
    assert _chi_square(counts[1], marginal) < CHI2_7_999
