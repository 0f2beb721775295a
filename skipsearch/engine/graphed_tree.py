"""Token-tree rounds (`engine.tree_rounds`) on static shapes, captured as CUDA graphs over a `GraphSteps`'
cache and pool (`engine.graphs`); on a CPU, or with `capture=False`, the same steps run eagerly.

A tree of shape `S` (`tree_shapes.TreeShape`) has a fixed node budget, so every pass has a static shape:

- a draft step per depth `d`, over the `S.draft_rows[d]` nodes of that depth;
- a verify per depth `k = 0 .. S.depth`, over the `verify_rows` of `S` cut to its first `k` depths:
  the last rounds of a sequence draft fewer depths (`tree_decode`'s rule), so the output never
  overshoots, and a cut tree numbers its nodes as the whole one does (depth by depth), so its
  passes read the same buffers' first rows. Depth 0 is one full-model step of the pending token.

The inputs live in buffers of `N + 1` rows (node `i` in row `i`, the root first): the node tokens,
their positions `start + depth(i)`, the drafted nodes' exact states, and the tree mask over every
key slot of the static cache — row `i` sees the prefix (slots `< start`) and the slots
`start + j` of its ancestors `j` and itself, never a stale slot. A round fills positions and mask
once, on the device, from `start` (`TreeGraphSteps.begin`); each depth's draft writes its
children's tokens into the next depth's rows.

The round is `tree_decode`'s, played by the one round loop (`ssd.run_rounds`): drafts write the
nodes' K/V in slot `start + i` (in node order, so the static cache's append is that layout); the
verify reuses the layers below `s1` (the mask's first divergent layer): they run only for the
leaves, the rest from the draft's exact states, after the layers `>= s1` are cropped back to
`start` (`steps.verify_forward`). The proposal is `tree_rounds.TreeProposal`, whose greedy or
sampled walk picks the path; its K/V moves next to the root in every layer and the device lengths
are clamped behind it (`shared_kv.compact` on a `StaticKV`).

A chain-shaped tree (`1x1...`) fills the causal mask: the chain's kernels, the chain's tokens.
Host reads: an untimed greedy round reads the drafted tokens and the target's argmax in one copy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from skipsearch.engine.graphs import GraphSteps, Outputs
from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.shared_kv import StaticKV
from skipsearch.engine.ssd import FixedLength, run_rounds
from skipsearch.engine.steps import Round, divergent_layer, draft_forward, verify_forward
from skipsearch.engine.tree_rounds import TreeProposal, children_of, depth_rows
from skipsearch.errors import ConfigError
from skipsearch.tree_shapes import TreeShape


def ancestry(shape: TreeShape) -> torch.Tensor:
    """`[N + 1, N + 1]`: True where node row `i` attends to node column `j` (`j` is `i` or one of
    its ancestors); the root's row and a chain's rows are causal."""
    seen = torch.zeros(shape.verify_rows, shape.verify_rows, dtype=torch.bool)
    for node in range(shape.verify_rows):
        seen[node, list(shape.ancestors(node))] = True
    return seen


def cut(shape: TreeShape, depth: int) -> TreeShape:
    """`shape` drafted to its first `depth` depths (>= 1): the last rounds of a sequence."""
    return TreeShape(shape.widths[:depth])


class TreeGraphSteps:
    """Mask `tier` of `base`'s token-tree passes of `shape` (module docstring): `shape.depth` draft
    graphs and `shape.depth + 1` verify graphs, captured into `base`'s pool over its cache, or run
    eagerly where `base` runs eagerly (`mode` says which). `base.max_len` bounds prompt + output +
    one round's `verify_rows`."""

    def __init__(self, base: GraphSteps, shape: TreeShape, tier: int = 0) -> None:
        self.base, self.shape, self.mode, self.runner = base, shape, base.mode, base.runner
        self.mask, self.head = base.masks[tier], base.heads[tier]
        if base.kvs[tier] is not None:
            raise ConfigError(
                "token trees on CUDA graphs draft over every key: build the GraphSteps without a KV pattern"
            )
        if self.head is not None and max(shape.widths) > len(self.head.ids):
            ids = len(self.head.ids)
            raise ConfigError(f"tree {shape} has more children a node than the draft's {ids} ids")
        runner, device = base.runner, base.runner.device
        rows, bucket = shape.verify_rows, base.token.shape[0]
        fed = rows - shape.leaves
        long = {"dtype": torch.long, "device": device}
        self.ids = torch.zeros(bucket, rows, **long)
        self.positions = torch.zeros(1, rows, **long)
        self.attend = torch.zeros(1, 1, rows, base.max_len, dtype=torch.bool, device=device)
        self.exact = torch.zeros(bucket, fed, runner.config.hidden_size, dtype=base.dtype, device=device)
        self.depths = torch.tensor(shape.depths, **long)
        self.ancestry = ancestry(shape).to(device)
        self.cache, self.s1 = base.cache, (divergent_layer(self.mask, None),)
        self._fill(0, torch.zeros(1, 1, **long))  # inputs a capture-time run can attend with
        with torch.no_grad():  # a captured graph must not record autograd state
            self.drafts = [base.record(self._draft_step(depth)) for depth in range(shape.depth)]
            self.verifies = [base.record(self._verify_step(depth)) for depth in range(shape.depth + 1)]

    # -- the captured passes ------------------------------------------------------------------
    def _draft_step(self, depth: int) -> Callable[[], Outputs]:
        """The masked model over the nodes of `depth` (`steps.draft_forward`): their exact states
        at `s1` and logits `[b, rows, V or k]`."""
        rows = depth_rows(self.shape, depth)
        ids, at = self.ids[:, rows.start : rows.stop], self.positions[:, rows.start : rows.stop]
        attend = self.attend[:, :, rows.start : rows.stop]
        base = self.base

        def step() -> Outputs:
            return draft_forward(base.runner, self.mask, ids, at, base.cache, self.head, attend)

        return step

    def _verify_step(self, depth: int) -> Callable[[], Outputs]:
        """The full model over the tree cut to `depth` depths (`steps.verify_forward`): layers
        `< s1` for the leaves, the rest from the fed nodes' exact states; logits `[rows, V]`."""
        rows = cut(self.shape, depth).verify_rows if depth else 1
        fed = rows - (cut(self.shape, depth).leaves if depth else 1)
        leaves, at, attend = self.ids[:, fed:rows], self.positions[:, :rows], self.attend[:, :, :rows]
        base = self.base

        def step() -> Outputs:
            exact = self.exact[:, :fed] if fed else None
            return (verify_forward(base.runner, self.mask, exact, leaves, at, base.cache, attend),)

        return step

    # -- a round ------------------------------------------------------------------------------
    def prefill(self, prompt: Sequence[int]) -> StaticKV:
        self.cache = self.base.prefill(prompt)
        return self.cache

    def begin(self, start: int, root: torch.Tensor, depth: int) -> None:
        """A round of `depth` depths from slot `start` (checked to fit the cache): fill its inputs
        on the device, the root token `root` `[1, 1]`, every node's position `start + depth`, and
        the tree mask over every slot (module docstring)."""
        self.base.check_room(start + (cut(self.shape, depth).verify_rows if depth else 1))
        self._fill(start, root)

    def _fill(self, start: int, root: torch.Tensor) -> None:
        self.ids[:, :1].copy_(root.view(1, 1).expand(self.ids.shape[0], 1))
        self.positions.copy_(self.depths[None] + start)
        offset = self.base.slots - start
        nodes = self.ancestry.index_select(1, offset.clamp(0, self.shape.verify_rows - 1))
        self.attend[0, 0].copy_((offset < 0) | (nodes & (offset < self.shape.verify_rows)))

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> TreeProposal:
        """The tree cut to `at.gamma` depths, drafted one replay per depth; each row's children
        chosen outside the graph (`tree_rounds.children_of`) and written into the next depth's rows.
        Depth 0 drafts nothing: the root alone (`TreeProposal.root`)."""
        self.begin(at.start, at.pending, at.gamma)
        device = self.ids.device
        if at.gamma == 0:
            return TreeProposal.root(device)
        tree = cut(self.shape, at.gamma)
        fed = tree.verify_rows - tree.leaves
        tokens = torch.empty(tree.nodes, dtype=torch.long, device=device)
        vocab = self.base.runner.config.vocab_size
        probs = None if sampling.greedy else torch.empty(fed, vocab, device=device)
        for level, width in enumerate(tree.widths):
            rows = depth_rows(tree, level)
            hidden, logits = self.drafts[level]()
            self.exact[:, rows.start : rows.stop].copy_(hidden)
            chosen, q = children_of(logits[0], width, sampling, generator, self.head)
            kids = chosen.reshape(1, -1)
            tokens[rows.stop - 1 : rows.stop - 1 + kids.shape[1]] = kids[0]
            # a child without a token feeds token 0, never accepted
            self.ids[:, rows.stop : rows.stop + kids.shape[1]] = kids.clamp_min(0)
            if probs is not None and q is not None:
                probs[rows.start : rows.stop] = q
        return TreeProposal(tree, tokens, probs, self.exact[:1, :fed], tree.depth)

    def verify(self, at: Round, proposal: TreeProposal) -> torch.Tensor:
        """One replay of the verify of `proposal`'s tree (the shape cut to its depth; 0: the root
        alone): full-model logits `[rows, V]`, row `i` after node `i` (a copy: the next replay
        rewrites the captured tensor)."""
        (logits,) = self.verifies[proposal.length]()
        return logits.clone()


@torch.no_grad()
def graphed_tree_decode(
    steps: TreeGraphSteps,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    timed: bool = False,
) -> DecodeTrace:
    """`tree_decode` with the mask and shape of `steps`, on their graphs (`ssd.run_rounds`):
    greedy output equals `autoregressive_decode`'s token for token, sampled output follows the
    target's distribution. `gammas` holds each round's depth, `accepted` the depth it accepted.
    `timed` records each round's phases and checks the cache after it, at a device sync per phase
    boundary; untimed, the cache is checked once, after the last round."""
    schedule = FixedLength(steps.shape.depth)
    result, _ = run_rounds(
        steps.runner, prompt, max_new_tokens, steps, schedule, sampling, generator, eos_ids, timed
    )
    return result
