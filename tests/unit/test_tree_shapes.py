"""A token tree's shape (`skipsearch.tree_shapes`): its nodes, their parents and depths, the passes it
drafts and what a round of it accepts, in exact numbers."""

import pytest

from skipsearch.errors import ConfigError
from skipsearch.tree_shapes import (
    MAX_NODES,
    DynamicTree,
    TreeShape,
    as_tree,
    parse_tree,
    parse_trees,
    tree_label,
)


def test_a_static_shape_counts_its_nodes_passes_and_verify_rows() -> None:
    shape = TreeShape.parse("2x2x1")
    assert (shape.depth, shape.per_depth, shape.nodes) == (3, (2, 4, 4), 10)
    assert shape.draft_rows == (1, 2, 4) and shape.verify_rows == 11 and shape.leaves == 4
    assert shape.parents == (-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6)
    assert shape.depths == (0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
    assert shape.children[1] == (3, 4) and shape.children[7] == ()
    assert shape.ancestors(9) == (0, 2, 5, 9)
    assert str(shape) == "2x2x1" and as_tree(shape) is shape


def test_a_chain_is_the_tree_of_width_one() -> None:
    chain = TreeShape.parse("3")
    assert chain == TreeShape.chain(3) == TreeShape.parse("1x1x1")
    assert chain.draft_rows == (1, 1, 1) and chain.verify_rows == 4 and chain.parents == (-1, 0, 1, 2)


@pytest.mark.parametrize(
    ("ranks", "accepted"), [((0, 1, 0), 3), ((1, 1, 1), 2), ((2, 0, 0), 0), ((0, 2, 0), 1), ((0,), 1)]
)
def test_a_round_goes_deeper_while_the_targets_token_is_among_the_children(ranks, accepted) -> None:
    assert TreeShape.parse("2x2x1").accepted_depth(ranks) == accepted


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2x0", "bad tree shape"),
        ("axb", "bad tree shape"),
        ("9x1", "at most 8"),
        ("8x4x1", "over the 31"),
        ("0", "at least one"),
    ],
)
def test_a_bad_shape_is_one_clear_error(text, message) -> None:
    with pytest.raises(ConfigError, match=message):
        TreeShape.parse(text)


def test_the_largest_shape_fits_the_verify_the_profile_measures() -> None:
    assert TreeShape.parse("3x3x2").nodes <= MAX_NODES


def test_a_list_of_shapes_drops_chains_and_repeats() -> None:
    assert parse_trees(["chain", "2x1", "2x1", "3", "1x1"]) == (TreeShape((2, 1)),)


@pytest.mark.parametrize("chain", [None, "chain", " Chain ", "3", 3, "1x1x1", TreeShape.chain(2)])
def test_every_spelling_of_a_chain_reads_as_no_tree(chain) -> None:
    """None is the chain in code; `chain`, a number and a width-one shape are how files and
    command lines write it, read in one place (`as_tree`) and written back as `chain`."""
    assert as_tree(chain) is None and tree_label(as_tree(chain)) == "chain"


@pytest.mark.parametrize("text", ["2x1", "n8d3k2", "2x2x1"])
def test_a_tree_label_reads_back_as_the_same_tree(text) -> None:
    tree = as_tree(text)
    assert tree is not None and tree_label(tree) == text and as_tree(tree_label(tree)) == tree


def test_a_dynamic_tree_fixes_its_rows_and_its_node_budget() -> None:
    tree = DynamicTree.parse("n8")  # the default depth: about half the nodes fed
    assert (tree.nodes, tree.depth, tree.top) == (8, 3, 2) and str(tree) == "n8d3k2"
    assert tree.draft_rows == (1, 2, 2) and tree.verify_rows == 9 and tree.leaves == 4
    assert parse_tree("n14d3k3") == DynamicTree(14, 3, 3) and parse_tree("2x1") == TreeShape((2, 1))
    assert tree.at_depth(1) == DynamicTree(2, 1, 2) and tree.at_depth(5) is tree
    assert parse_trees(["chain", "n8", "2x1", "n8d3k2"]) == (tree, TreeShape((2, 1)))
    for budget in range(1, MAX_NODES + 1):  # every budget --tree-nodes takes has a default depth
        assert DynamicTree.for_budget(budget).nodes == budget


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n40", "over the 31"),
        ("n8d2k5", "at most 4 children"),
        ("n20d3k2", "between 5 and 10"),
        ("n8x", "nN"),
    ],
)
def test_a_bad_dynamic_tree_is_one_clear_error(text, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tree(text)


# The draft's top two probabilities at each depth of the target's path, and the target's rank there.
SURE, SPLIT = (0.9, 0.05), (0.5, 0.4)


@pytest.mark.parametrize(
    ("ranks", "probs", "accepted"),
    [
        ([0, 0, 0], [SURE, SURE, SURE], 3),  # the draft's first choices all along: fed, then kept
        ([2, 0, 0], [SURE, SURE, SURE], 0),  # the root's third choice is never drafted (top 2)
        ([1, 0, 1], [SPLIT, (0.8, 0.1), SPLIT], 2),  # 0.4*0.8 is fed; 0.32*0.4 loses to 0.2 and 0.16
        ([1, 0, 0], [SURE, (0.8, 0.1), (0.8, 0.1)], 1),  # 0.05*0.8 is not fed: 0.72, 0.09 are
        ([0, 1, 0], [SURE, (0.6, 0.3), SURE], 3),  # 0.9*0.3 is fed; its child 0.243 is a leaf
    ],
)
def test_a_dynamic_round_accepts_while_the_paths_node_is_fed_or_among_the_likeliest(ranks, probs, accepted):
    """n6d3k2: 2 nodes fed at depths 1 and 2, and the 2 likeliest of the other nodes drafted."""
    assert DynamicTree(6, 3, 2).accepted_depth(ranks, probs) == accepted


@pytest.mark.parametrize("deeper", [(0.8, 0.1), (0.01, 0.005), (0.5, 0.49)])
def test_a_dynamic_round_reads_no_position_past_the_paths_deepest_fed_node(deeper) -> None:
    """The path's node at depth 2 is not fed (0.05*0.8 loses to 0.72 and 0.09), so the round drafts
    from positions 0 and 1 only: what the draft says at position 2 (another round's) changes nothing.
    The round-aware estimator's fixed point rests on it."""
    tree = DynamicTree(6, 3, 2)
    assert tree.accepted_depth([1, 0, 0], [SURE, (0.8, 0.1), deeper]) == 1
