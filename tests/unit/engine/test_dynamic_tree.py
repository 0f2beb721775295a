"""Dynamic token trees (`tree_shapes.DynamicTree`, `engine.tree_rounds.draft_dynamic`): greedy output equals
autoregressive decoding for every mask, budget, draft vocabulary and KV pattern; a tree of one child
a node is the chain; each round's tree is the nodes of highest cumulative draft probability; and
sampled output keeps the target's distribution with the nodes as fixed candidates."""

import pytest
import torch

from skipsearch.engine import speculative_decode
from skipsearch.engine.sampling import GREEDY
from skipsearch.engine.steps import draft_forward
from skipsearch.engine.tree_rounds import draft_dynamic, tree_decode, tree_sample_walk
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.tree_shapes import DynamicTree, RoundTree
from tests.unit.engine.conftest import NEW_TOKENS, PROMPT
from tests.unit.engine.test_sampling import CHI2_7_999, _chi_square, eight_token_setup
from tests.unit.engine.test_tree_rounds import MASKS as TREE_MASKS
from tests.unit.engine.test_tree_sampling import DRAWS, sampled_tokens

pytestmark = pytest.mark.usefixtures("one_thread")

MASKS = {name: mask for name, mask in TREE_MASKS.items() if mask.attn or mask.mlp}
TREES = ["n3", "n8", "n12d4k2", "n6d2k3", "n14d3k3"]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_greedy_dynamic_tree_decoding_equals_autoregressive(runner, reference, mask, tree):
    spec = DynamicTree.parse(tree)
    result = tree_decode(runner, PROMPT, mask, spec, NEW_TOKENS)
    assert result.tokens == reference
    assert sum(n + 1 for n in result.accepted) == NEW_TOKENS
    assert max(result.gammas) <= spec.depth


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_a_dynamic_tree_of_one_child_a_node_is_the_chain(runner, mask):
    chain = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=3)
    tree = tree_decode(runner, PROMPT, mask, DynamicTree(3, 3, 1), NEW_TOKENS)
    assert tree.tokens == chain.tokens
    assert tree.accepted == chain.accepted and tree.gammas == chain.gammas


def test_greedy_dynamic_tree_with_a_draft_vocabulary_equals_autoregressive(runner, reference):
    head = DraftHead.gather(runner, list(range(0, 61, 2)))
    mask = SkipMask.from_layers(6, [2])
    assert (
        tree_decode(runner, PROMPT, mask, DynamicTree.parse("n8"), NEW_TOKENS, head=head).tokens == reference
    )


@pytest.mark.parametrize("tree", ["n3", "n8"])
def test_greedy_dynamic_tree_under_a_kv_pattern_is_lossless(plan_runner, tree):
    prompt = list(range(3, 45))
    reference = tree_decode(plan_runner, prompt, SkipMask(6), DynamicTree(1, 1, 1), NEW_TOKENS).tokens
    mask = SkipMask.from_layers(6, [1, 4])
    patterned = tree_decode(
        plan_runner, prompt, mask, DynamicTree.parse(tree), NEW_TOKENS, kv=KVPattern(2, 6)
    )
    assert patterned.tokens == reference


def _draft_log_probs(runner, mask, prompt: list[int], path: list[int]) -> torch.Tensor:
    """The draft's log-probabilities after `path` (the root's token first), as a chain's draft
    steps see it: the full model's K/V of the prompt, then one masked step a token."""
    cache = runner.prefill(prompt)
    with torch.no_grad():
        for i, token in enumerate(path):
            _, logits = draft_forward(
                runner, mask, torch.tensor([[token]]), torch.tensor([[len(prompt) - 1 + i]]), cache
            )
    return logits[0, -1].float().log_softmax(-1)


@pytest.mark.parametrize("tree", ["n8", "n12d4k2", "n6d2k3"])
def test_each_round_verifies_the_fed_nodes_and_the_most_likely_drafted_ones(runner, tree):
    """Recomputes every node's cumulative draft log-probability from plain forwards over its
    ancestors' tokens: the fed nodes of each depth are its `top` most likely, and the leaves the most
    likely of the rest. A draft that read a wrong mask, slot or parent would pick other nodes."""
    spec, mask = DynamicTree.parse(tree), SkipMask.from_layers(6, [1, 4])
    prompt = list(PROMPT)
    cache = runner.prefill(prompt)
    start = len(prompt) - 1
    with torch.no_grad():
        proposal = draft_dynamic(runner, mask, cache, torch.tensor([[prompt[-1]]]), start, spec, GREEDY)
    shape = proposal.shape
    assert isinstance(shape, RoundTree)
    assert shape.nodes == spec.nodes and shape.leaves == spec.leaves
    tokens = [prompt[-1], *proposal.tokens.tolist()]
    score = {0: 0.0}
    drafted: dict[tuple[int, ...], float] = {}  # every node drafted: (ancestors' tokens) -> log-prob
    fed = [node for node in range(shape.verify_rows - shape.leaves)]
    for node in fed:
        path = [tokens[a] for a in shape.ancestors(node)]
        logp = _draft_log_probs(runner, mask, prompt, path)
        top = logp.topk(spec.top)
        for value, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            drafted[(*path, token)] = score[node] + value
        for child in shape.children[node]:
            if child in fed:
                score[child] = drafted[(*path, tokens[child])]
    for depth in range(1, spec.depth):
        at_depth = {k: v for k, v in drafted.items() if len(k) == depth + 1}
        chosen = {tuple(tokens[a] for a in shape.ancestors(n)) for n in fed if shape.depths[n] == depth}
        best = sorted(at_depth.values(), reverse=True)[: spec.top]
        assert sorted((at_depth[c] for c in chosen), reverse=True) == pytest.approx(best, abs=1e-4)
    fed_paths = {tuple(tokens[a] for a in shape.ancestors(n)) for n in fed}
    rest = sorted((v for k, v in drafted.items() if k not in fed_paths), reverse=True)
    leaves = [
        drafted[tuple(tokens[a] for a in shape.ancestors(n))] for n in range(len(fed), shape.verify_rows)
    ]
    assert sorted(leaves, reverse=True) == pytest.approx(rest[: spec.leaves], abs=1e-4)


def test_dynamic_trees_refuse_what_they_cannot_draft():
    from skipsearch.errors import ConfigError

    with pytest.raises(ConfigError, match="between 5 and 10"):
        DynamicTree(20, 3, 2)
    with pytest.raises(ConfigError, match="at most 4 children"):
        DynamicTree(8, 2, 5)
    with pytest.raises(ConfigError, match="bad dynamic tree"):
        DynamicTree.parse("n8x")


@pytest.mark.parametrize("tree", ["n6d3k2"])
def test_sampled_dynamic_tree_tokens_follow_the_target(tree):
    """The first two sampled tokens follow p and its marginal (chi-square, 8 bins), and the root's
    children are accepted as often as fixed candidates are: with probability p's mass on them."""
    setup = eight_token_setup("cpu")
    spec = DynamicTree.parse(tree)
    first, later, marginal, accepted = sampled_tokens(setup, spec)
    assert _chi_square(first, setup.p) < CHI2_7_999
    assert _chi_square(later, marginal) < CHI2_7_999
    expected = float(setup.p[setup.q.topk(spec.top).indices].sum())  # the root's children: q's top 2
    rate = accepted / DRAWS
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / DRAWS) ** 0.5


def test_the_walk_over_fixed_candidates_gives_p_exactly():
    """Three candidates chosen before any coin, unlikely ones first: the token that leaves the
    root follows p, and the root accepts with p's mass on the candidates."""
    p = torch.tensor([0.30, 0.02, 0.05, 0.25, 0.03, 0.15, 0.10, 0.10])
    shape = RoundTree((-1, 0, 0, 0), 3)
    candidates = [1, 4, 3]
    targets = torch.stack([p] * 4)
    generator = torch.Generator().manual_seed(0)
    counts, accepted, draws = torch.zeros(8), 0, 6000
    for _ in range(draws):
        path, after = tree_sample_walk(shape, candidates, targets, None, generator)
        counts[candidates[path[0] - 1] if path else after] += 1
        accepted += bool(path)
    assert _chi_square(counts, p) < CHI2_7_999
    expected = float(p[candidates].sum())
    assert abs(accepted / draws - expected) < 4 * (expected * (1 - expected) / draws) ** 0.5
