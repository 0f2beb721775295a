"""Token-tree rounds (`engine.tree_rounds`): greedy output equals autoregressive decoding for every mask and
shape, a width-1 tree is the chain bit for bit through the one round loop, the cache holds the
accepted path only, and the acceptance walks are exact (sampled distributions: test_tree_sampling.py)."""

import pytest
import torch

from skipsearch.engine import speculative_decode, ssd
from skipsearch.engine.sampling import GREEDY
from skipsearch.engine.shared_kv import compact
from skipsearch.engine.ssd import FixedLength
from skipsearch.engine.steps import EagerSteps
from skipsearch.engine.tree_rounds import EagerTreeSteps, tree_decode, tree_greedy_walk, tree_mask
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.tree_shapes import TreeShape
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")

MASKS = {
    "contiguous exit 3": SkipMask.prefix(6, 3),
    "sparse multi": SkipMask.from_layers(6, [1, 4]),
    "first layer": SkipMask.from_layers(6, [0, 3]),
    "mlp before skipped attn": SkipMask(6, attn=[3], mlp=[2]),
    "empty": SkipMask(6),
}
SHAPES = ["2x2x1", "3x1", "1x2x2", "4", "2x2x2x1"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_greedy_tree_decoding_equals_autoregressive(runner, reference, mask, shape):
    result = tree_decode(runner, PROMPT, mask, TreeShape.parse(shape), NEW_TOKENS)
    assert result.tokens == reference
    assert sum(n + 1 for n in result.accepted) == NEW_TOKENS
    assert max(result.gammas) <= TreeShape.parse(shape).depth


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_a_width_one_tree_is_the_chain(runner, mask):
    """Same kernels, same tokens, same accepted count every round."""
    chain = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=3)
    tree = tree_decode(runner, PROMPT, mask, TreeShape.chain(3), NEW_TOKENS)
    assert tree.tokens == chain.tokens
    assert tree.accepted == chain.accepted and tree.gammas == chain.gammas


def test_a_wider_tree_accepts_at_least_what_its_chain_does(runner):
    """Every path of the chain is in the tree, so greedy rounds accept as much or more."""
    mask = SkipMask.from_layers(6, [1, 3, 4])
    chain = tree_decode(runner, PROMPT, mask, TreeShape.parse("1x1x1"), NEW_TOKENS, timed=False)
    tree = tree_decode(runner, PROMPT, mask, TreeShape.parse("3x3x2"), NEW_TOKENS, timed=False)
    per_round = lambda r: sum(n + 1 for n in r.accepted) / len(r.accepted)  # noqa: E731
    assert per_round(tree) > per_round(chain)


def test_greedy_tree_with_a_draft_vocabulary_equals_autoregressive(runner, reference):
    head = DraftHead.gather(runner, list(range(0, 61, 2)))
    result = tree_decode(
        runner, PROMPT, SkipMask.from_layers(6, [2]), TreeShape.parse("3x2x1"), NEW_TOKENS, head=head
    )
    assert result.tokens == reference


def test_greedy_tree_is_lossless_on_the_plan_attention(plan_runner):
    reference = tree_decode(plan_runner, PROMPT, SkipMask(6), TreeShape.chain(1), NEW_TOKENS).tokens
    result = tree_decode(
        plan_runner, PROMPT, SkipMask.from_layers(6, [1, 4]), TreeShape.parse("2x2x1"), NEW_TOKENS
    )
    assert result.tokens == reference


@pytest.mark.parametrize("shape", ["2x1", "2x2x1"])
def test_greedy_tree_under_a_kv_pattern_is_lossless_on_the_modules(plan_runner, shape):
    """The modules' path (no fused layers here) reads the tree's dense mask, the pattern's sink and
    window folded in: lossless."""
    from skipsearch.masks import KVPattern

    prompt = list(range(3, 45))
    reference = tree_decode(plan_runner, prompt, SkipMask(6), TreeShape.chain(1), NEW_TOKENS).tokens
    mask = SkipMask.from_layers(6, [1, 4])
    patterned = tree_decode(plan_runner, prompt, mask, TreeShape.parse(shape), NEW_TOKENS, kv=KVPattern(2, 6))
    assert patterned.tokens == reference


def test_the_mask_lets_a_node_see_the_prefix_and_its_ancestors_only():
    shape = TreeShape.parse("2x1")  # root 0; children 1, 2; grandchildren 3 (of 1), 4 (of 2)
    keys = tree_mask(shape, 3, range(5), 8, torch.device("cpu"))
    mask = keys.dense[0, 0]
    assert mask[:, :3].all()
    assert mask[:, 3:].tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, False, True, False, False],
        [True, True, False, True, False],
        [True, False, True, False, True],
    ]
    assert keys.base == 3 and keys.bits.tolist() == [0b1, 0b11, 0b101, 0b1011, 0b10101]
    assert tree_mask(TreeShape.chain(3), 3, range(4), 7, torch.device("cpu")) is None
    assert tree_mask(shape, 3, range(1), 4, torch.device("cpu")) is None  # the root's pass is causal


def test_the_greedy_walk_follows_the_targets_argmax():
    shape = TreeShape.parse("2x2")  # 1,2 under the root; 3,4 under 1; 5,6 under 2
    tokens = [10, 20, 11, 12, 21, 22]
    target = [20, 0, 22, 0, 0, 0, 7]  # after the root 20 (node 2), after node 2 22 (node 6), then 7
    assert tree_greedy_walk(shape, tokens, target) == ([2, 6], 7)
    assert tree_greedy_walk(shape, tokens, [99, *target[1:]]) == ([], 99)


def test_compact_moves_the_accepted_path_next_to_the_root(runner):
    cache = runner.prefill(list(PROMPT[:5]))  # 4 cached positions; the root at slot 4
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    runner.run_layers(runner.embed(ids), 0, runner.num_layers, torch.arange(4, 10)[None], cache=cache)
    before = cache.layers[0].keys.clone()
    compact(cache, 4, [2, 5])  # nodes 2 and 5: slots 6 and 9
    keys = cache.layers[0].keys
    assert keys.shape[2] == 7
    assert torch.equal(keys[:, :, :5], before[:, :, :5])
    assert torch.equal(keys[:, :, 5], before[:, :, 6]) and torch.equal(keys[:, :, 6], before[:, :, 9])


@pytest.mark.parametrize("new_tokens", [1, 5, NEW_TOKENS])
def test_one_loop_plays_the_chain_and_the_width_one_tree(runner, reference, monkeypatch, new_tokens):
    """`ssd.run_rounds` plays a chain's rounds and a token tree's: the chain's steps and a width-1
    tree's steps, under the same schedule, settle every round through the one loop — each by its own
    proposal's accept and rollback — and agree round for round. One new token is one γ = 0 round of
    each shape (a tree's: its root alone)."""
    settled: list[str] = []
    settle = ssd.settle

    def spy(cache, tokens, proposal, *rest):
        settled.append(type(proposal).__name__)
        return settle(cache, tokens, proposal, *rest)

    monkeypatch.setattr(ssd, "settle", spy)
    mask = MASKS["sparse multi"]
    chain_steps = EagerSteps(runner, [mask])
    chain, _ = ssd.run_rounds(runner, PROMPT, new_tokens, chain_steps, FixedLength(3), GREEDY, None, ())
    chain_settled, settled[:] = list(settled), []
    tree_steps = EagerTreeSteps(runner, mask, TreeShape.chain(3))
    tree, _ = ssd.run_rounds(runner, PROMPT, new_tokens, tree_steps, FixedLength(3), GREEDY, None, ())
    assert tree.tokens == chain.tokens == reference[:new_tokens]
    assert tree.gammas == chain.gammas and tree.accepted == chain.accepted
    assert chain_settled == ["ChainProposal"] * len(chain.gammas)
    assert settled == ["TreeProposal"] * len(tree.gammas)
    assert new_tokens > 1 or chain.gammas == (0,)
