"""A token tree's round priced from the latency profile (`cost.tree_cost`): a chain-shaped tree costs the
chain's round exactly, rows cost what the profile's passes over that many positions cost, and the
best shape wins only where its extra rows pay."""

import json

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.tree_cost import best_tree, score_tree, tree_round_time
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.tree_shapes import DynamicTree, TreeShape, as_tree

LAYERS = 4
POSITIONS = (1, 2, 4, 8, 16, 32)


def latency(per_row: float, contexts: tuple[int, ...] = (512,)) -> LatencyProfile:
    """Every sub-layer 1 ms at one position, `per_row` ms more for each further row; head 2 ms;
    attention over `c` keys `c / 512` of that (a table per context in `contexts`)."""
    row = [(1.0 + per_row * (p - 1)) / 1e3 for p in POSITIONS]
    tables = {
        "embed": [[0.0] * len(POSITIONS) for _ in contexts],
        "head": [[2 * t for t in row] for _ in contexts],
        "attn": [[[t * c / 512 for t in row] for c in contexts] for _ in range(LAYERS)],
        "mlp": [[row for _ in contexts] for _ in range(LAYERS)],
    }
    return LatencyProfile.from_dict(
        {
            "meta": {"device": "test", "model": "tiny", "num_layers": LAYERS},
            "context_lengths": list(contexts),
            "positions": list(POSITIONS),
            **tables,
            "spread": json.loads(json.dumps(tables)),
            "round_overhead": {"1": 0.0, "8": 0.0},
        }
    )


def profile(ranks: list[int]) -> AcceptanceProfile:
    return AcceptanceProfile(
        mask="a:2|m:2",
        greedy_match=(tuple(rank == 0 for rank in ranks),),
        sampling_accept=(tuple(1.0 for _ in ranks),),
        temperature=1.0,
        target_rank=(tuple(ranks),),
    )


MASK = SkipMask.from_layers(LAYERS, [2])


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_a_chain_shaped_tree_costs_the_chains_round(gamma) -> None:
    form = Calibrated(latency(0.3), MASK, context=512)
    assert tree_round_time(form, TreeShape.chain(gamma)).total == pytest.approx(form.round_time(gamma).total)


@pytest.mark.parametrize("gamma", [1, 3])
def test_under_a_kv_pattern_a_chain_shaped_tree_costs_the_patterned_chains_round(gamma) -> None:
    """The draft's attention at the keys the pattern reads and no layer reused, as the chain's."""
    two = latency(0.3, (32, 512))
    form = Calibrated(two, MASK, context=512, kv=KVPattern(4, 28))
    assert tree_round_time(form, TreeShape.chain(gamma)).total == pytest.approx(form.round_time(gamma).total)
    plain = Calibrated(two, MASK, context=512)
    shape = TreeShape.parse("2x1")
    assert tree_round_time(form, shape).draft < tree_round_time(plain, shape).draft  # 32 keys read, not 512
    with pytest.raises(ValueError, match="pillars"):
        tree_round_time(Calibrated(latency(0.3), MASK, 512, kv=KVPattern(4, 28, 8)), TreeShape.parse("2x1"))


def test_a_tree_pays_for_each_extra_row_what_the_profile_says() -> None:
    free, costly = Calibrated(latency(0.0), MASK, 512), Calibrated(latency(1.0), MASK, 512)
    shape = TreeShape.parse("2x2")  # draft passes of 1 and 2 rows, a verify of 7 rows (4 leaves)
    # rows free: the round is 2 draft steps and one step's verify, as the chain of 2 would be
    assert tree_round_time(free, shape).total == pytest.approx(free.round_time(2).total)
    # at 1 ms a row, each extra row of a draft pass and of the verify costs its sub-layers again
    assert tree_round_time(costly, shape).total > tree_round_time(costly, TreeShape.chain(2)).total * 2


def test_the_search_picks_a_tree_where_rows_are_free_and_the_chain_where_they_are_not() -> None:
    ranks = [1, 0, 1, 0, 0, 1, 2, 0, 1, 0] * 10  # the target is often the draft's second choice
    shapes = (TreeShape.chain(2), TreeShape.parse("2x2"), TreeShape.parse("3x3x1"))
    free = best_tree(profile(ranks), Calibrated(latency(0.0), MASK, 512), shapes)
    costly = best_tree(profile(ranks), Calibrated(latency(1.0), MASK, 512), shapes)
    assert as_tree(free.shape) is not None and as_tree(costly.shape) is None  # the chain
    wide = score_tree(profile(ranks), Calibrated(latency(0.0), MASK, 512), TreeShape.parse("2x2"))
    assert wide.tokens_per_round > profile(ranks).tokens_per_round(2)


def test_a_dynamic_tree_costs_the_static_tree_of_its_rows() -> None:
    """n6d2k2 drafts passes of 1 and 2 rows and verifies 7 rows, 4 of them unfed leaves: 2x2's rows."""
    form = Calibrated(latency(0.4), MASK, context=512)
    dynamic, static = DynamicTree.parse("n6d2k2"), TreeShape.parse("2x2")
    assert tree_round_time(form, dynamic) == tree_round_time(form, static)
    bigger = tree_round_time(form, DynamicTree.parse("n8d3k2")).total
    assert bigger > tree_round_time(form, static).total  # one more pass, two more verify rows
