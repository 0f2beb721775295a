"""What a token-tree round costs, and what it gains (docs/theory.md, "Token trees").

A round of the static shape `c_1 x ... x c_D` runs `D` draft passes over `n_0 = 1, n_1, ...,
n_{D-1}` rows (the nodes of each depth but the last) and one verify over the `N + 1` rows of the
root and every node. Priced with the latency profile's passes over that many positions: a draft
pass of `r` rows is a pass of the draft's sub-layers over `r` positions, its head `r` rows of the
draft vocabulary's; the verify runs the sub-layers the draft reused (below `s1`) only for the `L`
leaves the draft never fed, and every sub-layer from `s1` on for all `N + 1` rows. Rows are nearly
free while a device's products stay memory-bound (AMX tiles, a GPU), and not on a CPU's vector
units: the profile says which, so the search decides per device where a tree pays. Under a KV
pattern (a sink and a window) each draft pass's attention is priced at the keys it reads and the
verify reuses nothing, as for the chain. A draft with sub-layers at int8 or int4 prices each pass's
sub-layers at their precision's cost over that many rows (the profile's `precisions`, else bytes),
as the chain does; the verify stays at full precision. A chain-shaped tree costs exactly the chain's round
(`cost.calibrated.Calibrated`), which this reproduces.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.cost.calibrated import Calibrated, RoundTime, _in_order, attention_at, draft_time
from skipsearch.tree_shapes import Tree


@dataclass(frozen=True)
class TreeScore:
    """A tree shape's predicted speedup: its tokens a round over its round's cost in steps."""

    shape: Tree
    tokens_per_round: float
    round_cost: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_round / self.round_cost


def tree_round_time(form: Calibrated, shape: Tree) -> RoundTime:
    """Seconds of one round of `shape` for the draft `form` prices (module docstring)."""
    latency, context, kv = form.latency, form.context, form.kv
    if kv is not None and kv.pillars:
        raise ValueError("a token tree's draft takes a sink and a window, not pillars")
    one = latency.weights(context, 1)
    head_one = latency.draft_head_time(form.draft_vocab, context, form.vocab_size)
    draft = 0.0
    for rows in shape.draft_rows:
        passed = latency.weights(context, rows)
        if kv is not None:  # attention at the keys the pattern reads, as the chain's draft step
            passed = attention_at(passed, latency.weights(min(context, kv.keys_read), rows))
        head = head_one * passed.head / one.head  # the draft head grows with rows as the full one does
        draft += draft_time(latency, form.mask, passed) - (passed.head - head)
    full = latency.weights(context, shape.verify_rows)
    leaves = latency.weights(context, shape.leaves)
    reused = form.mask.reused_sublayers if kv is None else 0  # a pattern's draft: no layer is exact
    verify = leaves.embed + sum(_in_order(leaves)[:reused]) + sum(_in_order(full)[reused:]) + full.head
    return RoundTime(draft, verify, latency.overhead(shape.depth))


def score_tree(profile: AcceptanceProfile, form: Calibrated, shape: Tree) -> TreeScore:
    """`shape`'s predicted speedup for the draft `form` prices, from `profile`'s teacher-forced ranks."""
    cost = tree_round_time(form, shape).total / form.latency.step_time(form.context)
    return TreeScore(shape, profile.tree_tokens_per_round(shape), cost)


def best_tree(profile: AcceptanceProfile, form: Calibrated, shapes: tuple[Tree, ...]) -> TreeScore | None:
    """The best of `shapes` (None when there are none); ties go to the smaller tree."""
    scores = [score_tree(profile, form, shape) for shape in shapes]
    return max(scores, key=lambda s: (s.speedup, -s.shape.nodes), default=None)
