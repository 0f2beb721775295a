"""A token tree's shape (`skipsearch.trees`): its nodes, their parents and depths, the passes it
drafts and what a round of it accepts, in exact numbers."""

import pytest

from skipsearch.errors import ConfigError
from skipsearch.trees import MAX_NODES, TreeShape, parse_trees


def test_a_static_shape_counts_its_nodes_passes_and_verify_rows() -> None:
    shape = TreeShape.parse("2x2x1")
    assert (shape.depth, shape.per_depth, shape.nodes) == (3, (2, 4, 4), 10)
    assert shape.draft_rows == (1, 2, 4) and shape.verify_rows == 11 and shape.leaves == 4
    assert shape.parents == (-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6)
    assert shape.depths == (0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
    assert shape.children[1] == (3, 4) and shape.children[7] == ()
    assert shape.ancestors(9) == (0, 2, 5, 9)
    assert str(shape) == "2x2x1" and not shape.is_chain


def test_a_chain_is_the_tree_of_width_one() -> None:
    chain = TreeShape.parse("3")
    assert chain == TreeShape.chain(3) == TreeShape.parse("1x1x1") and chain.is_chain
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
    assert parse_trees(["chain", "2x1", "2x1", "3"]) == (TreeShape((2, 1)), TreeShape.chain(3))
