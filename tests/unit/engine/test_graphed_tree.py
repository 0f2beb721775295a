"""Token trees on the graphed steps, run without capture (`engine.graphed_tree`): greedy output equals
autoregressive decoding and the eager trees round for round, the last rounds stop at the output's
end, a chain-shaped tree is the graphed chain, sampling draws what the eager trees draw, and the
static tree mask is the prefix and the ancestors over every slot."""

from collections import Counter

import pytest
import torch

from skipsearch.engine import GammaPolicy
from skipsearch.engine.graphed_decode import graphed_speculative_decode
from skipsearch.engine.graphed_tree import TreeGraphSteps, graphed_tree_decode
from skipsearch.engine.graphs import GraphSteps
from skipsearch.engine.sampling import Sampling
from skipsearch.engine.tree_rounds import tree_decode
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import TreeShape
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT
from tests.unit.engine.test_graphs import host_reads  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

MASKS = {
    "sparse multi": SkipMask.from_layers(6, [1, 4]),
    "mlp before skipped attn": SkipMask(6, attn=[3], mlp=[2]),
    "first layer": SkipMask.from_layers(6, [0, 3]),  # s1 = 0: the verify reuses no layer
}
SHAPES = ["2x1", "2x2x1", "3x1x1"]


def tree_steps(
    runner: LayerwiseRunner,
    mask: SkipMask,
    shape: TreeShape,
    head: DraftHead | None = None,
    room: int | None = None,
) -> TreeGraphSteps:
    room = len(PROMPT) + NEW_TOKENS + shape.verify_rows if room is None else room
    return TreeGraphSteps(GraphSteps(runner, [mask], [0], room, capture=False, heads=[head]), shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_greedy_graphed_trees_equal_autoregressive_and_the_eager_trees_round_for_round(
    runner, reference, mask, shape
) -> None:
    tree = TreeShape.parse(shape)
    steps = tree_steps(runner, mask, tree)
    eager = tree_decode(runner, PROMPT, mask, tree, NEW_TOKENS)
    for _ in range(2):  # the steps serve every sequence: the prefill resets them
        graphed = graphed_tree_decode(steps, PROMPT, NEW_TOKENS)
        assert graphed.tokens == reference
        assert graphed.accepted == eager.accepted and graphed.gammas == eager.gammas
    assert max(graphed.accepted) >= 2  # rounds that accepted paths past the root's children


@pytest.mark.parametrize("new_tokens", [1, 2, 3, 5])
def test_the_last_rounds_draft_fewer_depths_and_never_overshoot(runner, reference, new_tokens) -> None:
    """A round drafts at most the depths the output still has room for, the last token comes from one
    full-model step: exactly `new_tokens` tokens, the autoregressive ones."""
    steps = tree_steps(runner, MASKS["sparse multi"], TreeShape.parse("2x2x1"))
    graphed = graphed_tree_decode(steps, PROMPT, new_tokens)
    assert graphed.tokens == reference[:new_tokens]
    assert sum(n + 1 for n in graphed.accepted) == new_tokens
    assert max(graphed.gammas) == min(3, new_tokens - 1)


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_a_chain_shaped_tree_is_the_graphed_chain(runner, mask) -> None:
    chain = graphed_speculative_decode(
        GraphSteps(runner, [mask], [2], len(PROMPT) + NEW_TOKENS + 3, capture=False),
        PROMPT,
        NEW_TOKENS,
        GammaPolicy.fixed(2),
    )
    tree = graphed_tree_decode(tree_steps(runner, mask, TreeShape.parse("1x1")), PROMPT, NEW_TOKENS)
    assert tree.tokens == chain.tokens
    assert tree.accepted == chain.accepted and tree.gammas == chain.gammas


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.8, top_k=20)], ids=["T=1", "T=0.8 k=20"])
@pytest.mark.parametrize("vocab", [None, range(0, 61, 2)], ids=["full vocabulary", "draft vocabulary"])
def test_sampled_graphed_trees_draw_what_the_eager_trees_draw(runner, sampling, vocab) -> None:
    """Same draws from the same generator, in the same order: the same tokens and rounds as
    `tree_decode`, whose distribution test_tree_sampling.py checks."""
    mask, tree = MASKS["sparse multi"], TreeShape.parse("2x2x1")
    head = None if vocab is None else DraftHead.gather(runner, vocab)
    steps = tree_steps(runner, mask, tree, head)
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        graphed = graphed_tree_decode(steps, PROMPT, NEW_TOKENS, sampling, generator)
        generator = torch.Generator().manual_seed(seed)
        eager = tree_decode(runner, PROMPT, mask, tree, NEW_TOKENS, sampling, generator, head=head)
        assert graphed.tokens == eager.tokens and graphed.accepted == eager.accepted
        assert len(graphed.tokens) == NEW_TOKENS
        assert all(0 <= token < runner.config.vocab_size for token in graphed.tokens)


def test_greedy_graphed_trees_from_a_draft_vocabulary_equal_autoregressive(runner, reference) -> None:
    head = DraftHead.gather(runner, list(range(0, 61, 2)))
    steps = tree_steps(runner, MASKS["sparse multi"], TreeShape.parse("3x2x1"), head)
    assert graphed_tree_decode(steps, PROMPT, NEW_TOKENS).tokens == reference


def test_the_static_mask_sees_the_prefix_and_the_ancestors_over_every_slot(runner) -> None:
    steps = tree_steps(runner, MASKS["sparse multi"], TreeShape.parse("2x1"), room=10)
    root = torch.tensor([[7]])
    steps.begin(3, root, 2)  # root 0 at slot 3; children 1, 2; grandchildren 3 (of 1), 4 (of 2)
    assert steps.ids[0, 0] == 7
    assert steps.positions.tolist() == [[3, 4, 4, 5, 5]]
    mask = steps.attend[0, 0]
    assert mask[:, :3].all() and not mask[:, 8:].any()  # slots past the tree are stale
    assert mask[:, 3:8].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]
    chain = tree_steps(runner, MASKS["sparse multi"], TreeShape.parse("1x1x1"), room=10)
    chain.begin(4, root, 2)
    causal = torch.arange(10)[None] <= chain.positions[0, :, None]
    assert torch.equal(chain.attend[0, 0], causal)


def test_an_untimed_greedy_round_reads_the_host_once(runner, host_reads: Counter) -> None:  # noqa: F811
    """The drafted tokens and the target's argmax in one copy; the final length check one more."""
    steps = tree_steps(runner, MASKS["sparse multi"], TreeShape.parse("2x2x1"))
    host_reads.clear()
    graphed = graphed_tree_decode(steps, PROMPT, NEW_TOKENS)
    assert sum(host_reads.values()) == len(graphed.accepted) + 1


def test_what_the_graphed_trees_do_not_run_is_refused(runner, plan_runner) -> None:
    with pytest.raises(ConfigError, match="every key"):
        base = GraphSteps(plan_runner, [SkipMask(6)], [0], 40, capture=False, kvs=[KVPattern(2, 6)])
        TreeGraphSteps(base, TreeShape.parse("2x1"))
    with pytest.raises(ConfigError, match="more children a node than the draft's 2 ids"):
        tree_steps(runner, SkipMask(6), TreeShape.parse("3x1"), DraftHead.gather(runner, [4, 9]))
    with pytest.raises(ConfigError, match="static cache holds"):
        graphed_tree_decode(tree_steps(runner, SkipMask(6), TreeShape.parse("2x1")), PROMPT, NEW_TOKENS + 10)
