"""Token-tree rounds: several candidate continuations drafted, verified in one pass, the longest
path the target agrees with kept (docs/theory.md, "Token trees"; the shape: `tree_shapes.TreeShape`).

A round starts as a chain round does (`engine.ssd`): the cache holds positions `0 .. start-1`, the
pending token `t` sits at position `start`. Node `i` of the tree (node 0 is `t`) lives in cache
slot `start + i` and at position `start + depth(i)`; it attends to the prefix and to its
ancestors (`tree_mask`).

1. Draft: one pass per depth, the nodes of the depth as rows of the pass. Each row's top-`c`
   tokens under the draft (greedy), or `c` tokens sampled from `q` without replacement
   (sampling), become its children. Layers below `s1` run exactly as the full model's, so their
   K/V — and the draft's residual stream at `s1` — are exact for every node the draft fed.
2. Verify: the full model over the root and every node in one pass. The exact K/V below `s1` is
   reused: layers `< s1` run only for the leaves, which the draft never fed; layers `>= s1` run for
   every node from the draft's exact states, after cropping their scratch K/V back to `start`.
3. Accept: greedy walks from the root to the child whose token is the target's argmax, while
   there is one; sampling walks by recursive rejection sampling over each node's children
   (`tree_sample_walk`), so the output distribution is exactly the target's.
4. Compact: the accepted path's K/V moves to the positions after the root, the rest is cut off
   (`shared_kv.compact`).

A dynamic tree (`tree_shapes.DynamicTree`) chooses its nodes each round from the draft's probabilities
(`draft_dynamic`): the round's tree (`tree_shapes.RoundTree`) keeps the fed nodes first and the leaves
last, so steps 2-4 run it as they run a static shape.

The rounds are the chain's loop (`engine.ssd.run_rounds`): the tree's passes plug in as its
`RoundSteps` — eagerly on the runner here (`EagerTreeSteps`), or on CUDA graphs
(`engine.graphed_tree`) — and its proposal (`TreeProposal`) brings steps 3 and 4. Near the end of
the output a round drafts fewer depths, so the output never overshoots; the last token is the
tree's γ = 0 round, the root alone (`ROOT`): one full-model step of the pending token.

A chain-shaped tree (`1x1x...`) attends causally: it runs no mask of its own, so it takes the
chain's kernels and gives the chain's tokens and rounds, bit for bit. Other trees' passes run the
plan's kernels too where the plan fuses its layers: the float32 decode-attention kernel reads
each row's ancestors as bits (`kv.tree_keys`); elsewhere (another plan, a GPU) the modules' SDPA
reads the same mask as a dense one. Under a draft's KV pattern (a sink and a window; not pillars)
a draft row sees the prefix's sink and window from its position and all its ancestors, and the
verify reuses no layer, as the chain's does (`engine.steps.divergent_layer`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skipsearch.engine.result import DecodeTrace
from skipsearch.engine.sampling import GREEDY, Sampling, residual, sample
from skipsearch.engine.shared_kv import compact
from skipsearch.engine.ssd import FixedLength, run_rounds
from skipsearch.engine.steps import Round, divergent_layer, draft_forward, verify_forward
from skipsearch.errors import ConfigError
from skipsearch.kv.tree_keys import TreeKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import DynamicTree, Nodes, RoundTree, Tree, TreeShape

ROOT = RoundTree((-1,), 1)  # a γ = 0 round's tree: the root alone, a leaf the draft never fed


@dataclass(frozen=True)
class TreeProposal:
    """The drafted tree of `N` nodes besides the root: `tokens` `[N]`, `tokens[i - 1]` node `i`'s
    token (-1: a child the draft had no token for, which is never accepted); `probs` `[F, V]`,
    `probs[i]` the draft's `q` at fed node `i` over the full vocabulary (sampling a static shape;
    None: the nodes are fixed candidates, `tree_sample_walk`); `exact` `[1, F, d]` the draft's
    exact states of the `F` fed nodes (None: the `ROOT` round, which feeds none); `length` the
    depths drafted, the round's γ."""

    shape: TreeShape | RoundTree
    tokens: torch.Tensor
    probs: torch.Tensor | None
    exact: torch.Tensor | None
    length: int

    @classmethod
    def root(cls, device: torch.device) -> TreeProposal:
        """The γ = 0 round: nothing drafted, the root verified alone."""
        return cls(ROOT, torch.empty(0, dtype=torch.long, device=device), None, None, 0)

    def accept(
        self, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
    ) -> tuple[list[int], list[int], torch.Tensor]:
        """Step 3 over the verify's logits `[N + 1, V]`: the accepted path (node numbers), the tokens
        the round commits — the path's and the target's after it — and that last one `[1, 1]` on the
        device. Greedy reads the drafted tokens and the target's argmax back in one copy and leaves
        the pending token on the device."""
        count = len(self.tokens)
        if sampling.greedy:
            target = logits.argmax(-1)
            both = torch.cat([self.tokens, target]).tolist()
            drafted = both[:count]
            path, after = tree_greedy_walk(self.shape, drafted, both[count:])
            last = path[-1] if path else 0
            pending = target[last : last + 1].view(1, 1)
        else:
            drafted = self.tokens.tolist()
            path, after = tree_sample_walk(self.shape, drafted, sampling.probs(logits), self.probs, generator)
            pending = torch.tensor([[after]], device=logits.device)
        return path, [drafted[node - 1] for node in path] + [after], pending

    def roll_back(self, cache: Any, start: int, path: Sequence[int]) -> None:
        """Step 4: the accepted path's K/V next to the root, the rest cut off (`shared_kv.compact`)."""
        compact(cache, start, path)


def tree_mask(
    shape: Nodes,
    start: int,
    rows: range,
    keys: int,
    device: torch.device,
    pattern: KVPattern | None = None,
) -> TreeKeys | None:
    """The keys of the node rows `rows` over `keys` slots (`kv.tree_keys`): the prefix
    (`0 .. start-1`, under `pattern`'s sink and window when a draft has one) and each row's
    ancestors and itself (slot `start + node`). None where that is the causal mask (a chain, the
    root's pass), so those passes run the chain's path (with `pattern` as the chain's KV pattern)."""
    causal = keys == start + rows.stop and all(
        shape.ancestors(node) == tuple(range(node + 1)) for node in rows
    )
    if causal:
        return None
    ancestors = [shape.ancestors(node) for node in rows]
    return TreeKeys.build(start, ancestors, [shape.depths[node] for node in rows], keys, device, pattern)


def check_tree_pattern(shape: Tree, kv: KVPattern | None) -> None:
    """Refuse a KV pattern a tree's draft does not run, in one line: pillars (chosen by a chain's
    verify), or a window no wider than the tree is deep (a node sees all its ancestors, as a
    chain's token sees the tokens drafted before it while they are in its window)."""
    if kv is None:
        return
    if kv.pillars:
        raise ConfigError(
            f"a token tree's draft takes a sink and a window, not pillars: drop k{kv.pillars} from {kv}"
        )
    if kv.window <= shape.depth:
        raise ConfigError(
            f"KV pattern {kv} has a window of {kv.window}, not wider than tree {shape} is deep: "
            f"use a window over {shape.depth}"
        )


def depth_rows(shape: TreeShape, depth: int) -> range:
    """The node numbers at `depth` (0: the root)."""
    first = 1 + sum(shape.per_depth[: depth - 1]) if depth else 0
    return range(first, first + (shape.per_depth[depth - 1] if depth else 1))


def children_of(
    logits: torch.Tensor,
    width: int,
    sampling: Sampling,
    generator: torch.Generator | None,
    head: DraftHead | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's `width` children `[rows, width]` (vocabulary ids), and `q` `[rows, V]` over the
    full vocabulary (sampling). Greedy takes the draft's top `width`; sampling draws `width`
    without replacement from `q` (Gumbel top-k), which `tree_sample_walk` undoes exactly; a draw
    past the tokens `q` can give is -1."""
    if sampling.greedy:
        chosen = logits.topk(width, dim=-1).indices
        q = None
        valid = torch.ones_like(chosen, dtype=torch.bool)
    else:
        q = sampling.probs(logits)
        noise = torch.rand(q.shape, generator=generator, device=q.device).clamp_min(1e-20)
        keys = q.log() - (-noise.log()).log()
        top = keys.topk(width, dim=-1)
        chosen, valid = top.indices, torch.isfinite(top.values)
    if head is not None:
        chosen = head.token(chosen)
        if q is not None:
            full = q.new_zeros(q.shape[0], head.vocab_size)
            full[:, head.ids] = q
            q = full
    return torch.where(valid, chosen, torch.full_like(chosen, -1)), q


def draft_tree(
    runner: LayerwiseRunner,
    mask: SkipMask,
    cache: object,
    pending: torch.Tensor,
    start: int,
    shape: TreeShape,
    sampling: Sampling,
    generator: torch.Generator | None,
    head: DraftHead | None = None,
    kv: KVPattern | None = None,
) -> TreeProposal:
    """Step 1 of the module docstring: `shape.depth` passes of the masked model (over `kv`'s
    keys of the prefix where the draft has a KV pattern)."""
    device = runner.device
    tokens = torch.empty(shape.nodes, dtype=torch.long, device=device)
    fed_rows = shape.verify_rows - shape.leaves
    probs = None if sampling.greedy else torch.empty(fed_rows, runner.config.vocab_size, device=device)
    exact: list[torch.Tensor] = []
    fed = pending.view(1)
    for depth, width in enumerate(shape.widths):
        rows = depth_rows(shape, depth)
        at = torch.full((1, len(rows)), start + depth, device=device)
        attend = tree_mask(shape, start, rows, start + rows.stop, device, kv)
        ids = fed.clamp_min(0).view(1, -1)  # a child without a token feeds token 0, never accepted
        hidden, logits = draft_forward(runner, mask, ids, at, cache, head, attend, kv)
        exact.append(hidden)
        chosen, q = children_of(logits[0], width, sampling, generator, head)
        first = rows.stop
        tokens[first - 1 : first - 1 + chosen.numel()] = chosen.reshape(-1)
        if probs is not None and q is not None:
            probs[rows.start : rows.stop] = q
        fed = chosen.reshape(-1)
    return TreeProposal(shape, tokens, probs, torch.cat(exact, dim=1), shape.depth)


def draft_dynamic(
    runner: LayerwiseRunner,
    mask: SkipMask,
    cache: object,
    pending: torch.Tensor,
    start: int,
    tree: DynamicTree,
    sampling: Sampling,
    head: DraftHead | None = None,
    kv: KVPattern | None = None,
) -> TreeProposal:
    """Step 1 for a dynamic tree (`tree_shapes.DynamicTree`, EAGLE-2's expand and rerank): pass `d` feeds
    the `top` nodes of depth `d` with the highest cumulative draft probability (the root alone at
    first), each proposing its `top` most likely children; the round's tree is the fed nodes and
    the `tree.leaves` most likely nodes drafted but not fed. Fed nodes sit in cache slots in the
    order they are fed, the chosen leaves after them, so the verify reuses the fed nodes' K/V below
    `s1` as a static tree's. The tree is chosen from the draft's probabilities alone, under the
    sampling temperature and truncation when sampling, so the walk takes its nodes as fixed
    candidates (`tree_sample_walk`). One host read a pass: the tree's mask is built on the host."""
    device, k = runner.device, tree.top
    parents, tokens = [-1], [-1]  # the root's token stays on the device: the first pass feeds `pending`
    scores = [0.0]  # each fed node's cumulative log-probability under the draft
    pool: list[tuple[float, int, int]] = []  # drafted, not fed: (score, parent, token)
    exact: list[torch.Tensor] = []
    rows = range(0, 1)
    for depth in range(tree.depth):
        fed = RoundTree(tuple(parents), 0)
        attend = tree_mask(fed, start, rows, start + rows.stop, device, kv)
        fed_ids = [[tokens[node] for node in rows]]
        ids = pending.view(1, 1) if depth == 0 else torch.tensor(fed_ids, device=device)
        at = torch.full((1, len(rows)), start + depth, device=device)
        hidden, logits = draft_forward(runner, mask, ids, at, cache, head, attend, kv)
        exact.append(hidden)
        logq = logits[0].float().log_softmax(-1) if sampling.greedy else sampling.probs(logits[0]).log()
        top = logq.topk(k, dim=-1)
        chosen = top.indices if head is None else head.token(top.indices)
        values, children = top.values.tolist(), chosen.tolist()
        drafted = [
            (scores[node] + value, node, token)
            for node, row_values, row_children in zip(rows, values, children, strict=True)
            for value, token in zip(row_values, row_children, strict=True)
        ]
        drafted.sort(key=lambda child: -child[0])  # stable: a tie keeps the earlier parent and rank
        if depth + 1 == tree.depth:
            pool += drafted
            break
        rows = range(len(parents), len(parents) + k)
        for score, parent, token in drafted[:k]:
            parents.append(parent)
            tokens.append(token)
            scores.append(score)
        pool += drafted[k:]
    pool.sort(key=lambda child: -child[0])
    leaves = pool[: tree.leaves]
    shape = RoundTree(tuple(parents) + tuple(parent for _, parent, _ in leaves), len(leaves))
    drafted_tokens = torch.tensor(tokens[1:] + [token for _, _, token in leaves], device=device)
    return TreeProposal(shape, drafted_tokens, None, torch.cat(exact, dim=1), tree.depth)


def verify_tree(
    runner: LayerwiseRunner,
    mask: SkipMask,
    cache: object,
    proposal: TreeProposal,
    pending: torch.Tensor,
    start: int,
    kv: KVPattern | None = None,
) -> torch.Tensor:
    """Step 2: full-model logits `[N + 1, V]`, row `i` after node `i`'s token (the root's is
    `pending` `[1, 1]`, fed here only in the `ROOT` round). Expects layers `>= s1` cropped to
    `start` and layers `< s1` holding the fed nodes' K/V (`s1` is 0 under a draft's KV pattern
    `kv`)."""
    shape, device = proposal.shape, runner.device
    fed = shape.verify_rows - shape.leaves
    leaf_ids = proposal.tokens[fed - 1 :].clamp_min(0).view(1, -1) if fed else pending
    block_at = (start + torch.tensor(shape.depths, device=device)).view(1, -1)
    block_mask = tree_mask(shape, start, range(shape.verify_rows), start + shape.verify_rows, device)
    return verify_forward(runner, mask, proposal.exact, leaf_ids, block_at, cache, block_mask, kv)


def tree_greedy_walk(shape: Nodes, tokens: Sequence[int], target: Sequence[int]) -> tuple[list[int], int]:
    """The accepted path (node numbers) and the target's token after it: from the root, to the
    child whose token is the target's argmax after its parent, while there is one."""
    path, node = [], 0
    while True:
        after = target[node]
        child = next((c for c in shape.children[node] if tokens[c - 1] == after), None)
        if child is None:
            return path, after
        path.append(child)
        node = child


def tree_sample_walk(
    shape: Nodes,
    tokens: Sequence[int],
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """The accepted path and the token after it, by recursive rejection sampling: at a node whose
    children were drawn from `q` without replacement, child `x_i` is accepted with probability
    `min(1, p_i(x_i) / q_i(x_i))`, where `q_i` is `q` without the children tried before it and
    `p_i` the residual `norm(max(0, p_{i-1} - q_{i-1}))` after each rejection; past every child,
    the token comes from the last residual. Each step is one speculative sampling step of a
    proposal drawn from `q_i`, so the token that leaves a node follows `p` there exactly
    (Leviathan et al. 2023; Jeon et al. 2024 for draws without replacement). `p` `[N + 1, V]`
    is the target's at every node, `q` `[F, V]` the draft's at every fed node.

    Without `q` the children are fixed candidates, chosen before any coin (a dynamic tree's): each
    is a proposal that puts all its mass on it, so child `x_i` is accepted with probability
    `p_i(x_i)` and the residual is `p_i` without `x_i`, renormalised: exact for any candidates."""
    path, node = [], 0
    while True:
        kids = [c for c in shape.children[node] if tokens[c - 1] >= 0]
        target = p[node]
        if not kids:
            return path, int(sample(target, generator)[0])
        if q is None:
            accepted = None
            for child in kids:
                token = tokens[child - 1]
                if torch.rand((), generator=generator, device=p.device) < target[token]:
                    accepted = child
                    break
                target = target.clone()
                target[token] = 0
                total = target.sum()
                if total <= 0:  # p had no mass left past x_i: p_i(x_i) was 1 up to rounding
                    accepted = child
                    break
                target = target / total
            if accepted is None:
                return path, int(sample(target, generator)[0])
            path.append(accepted)
            node = accepted
            continue
        proposal = q[node].clone()
        accepted = None
        for child in kids:
            token = tokens[child - 1]
            chance = torch.rand((), generator=generator, device=p.device)
            ratio = target[token] / proposal[token]
            if chance < torch.clamp(ratio, max=1.0):
                accepted = child
                break
            target = residual(target, proposal)
            target = target / target.sum()
            proposal[token] = 0
            total = proposal.sum()
            if total <= 0:
                break
            proposal = proposal / total
        if accepted is None:
            return path, int(sample(target, generator)[0])
        path.append(accepted)
        node = accepted


class EagerTreeSteps:
    """A tree's passes on the runner, eagerly (module docstring): `draft_tree` or `draft_dynamic`,
    and `verify_tree`, as the `RoundSteps` of `ssd.run_rounds` (one tier: `mask`)."""

    mode = "eager"

    def __init__(
        self,
        runner: LayerwiseRunner,
        mask: SkipMask,
        shape: Tree,
        head: DraftHead | None = None,
        kv: KVPattern | None = None,
    ) -> None:
        mask.check_fits(runner.num_layers)
        check_tree_pattern(shape, kv)
        if head is not None and shape.widest > len(head.ids):
            raise ConfigError(f"tree {shape} has more children a node than the draft's {len(head.ids)} ids")
        self.runner, self.mask, self.shape, self.head, self.kv = runner, mask, shape, head, kv
        self.s1 = (divergent_layer(mask, kv),)
        runner.prepare(mask)  # a lower-precision draft's weights, refused here if they do not fit

    def prefill(self, prompt: Sequence[int]) -> Any:
        return self.runner.prefill(prompt)

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> TreeProposal:
        """The tree drafted to `at.gamma` depths (the last rounds draft fewer; 0: `ROOT`)."""
        runner, mask, head, kv = self.runner, self.mask, self.head, self.kv
        if at.gamma == 0:
            return TreeProposal.root(runner.device)
        if isinstance(self.shape, DynamicTree):
            tree = self.shape.at_depth(at.gamma)
            return draft_dynamic(runner, mask, at.cache, at.pending, at.start, tree, sampling, head, kv)
        shape = TreeShape(self.shape.widths[: at.gamma])
        return draft_tree(runner, mask, at.cache, at.pending, at.start, shape, sampling, generator, head, kv)

    def verify(self, at: Round, proposal: TreeProposal) -> torch.Tensor:
        return verify_tree(self.runner, self.mask, at.cache, proposal, at.pending, at.start, self.kv)


@torch.no_grad()
def tree_decode(
    runner: LayerwiseRunner,
    prompt: Sequence[int],
    mask: SkipMask,
    shape: Tree,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    generator: torch.Generator | None = None,
    eos_ids: Collection[int] = (),
    head: DraftHead | None = None,
    timed: bool = True,
    kv: KVPattern | None = None,
) -> DecodeTrace:
    """Decode up to `max_new_tokens` after `prompt` with tree rounds of `shape` (module docstring)
    on the runner, eagerly (`EagerTreeSteps`, `ssd.run_rounds`).

    Lossless as the chain is: greedy output equals `autoregressive_decode`'s token for token;
    sampled output follows the target's distribution. `DecodeTrace.gammas` holds each round's
    depth, `accepted` the depth it accepted. `kv`: the draft's KV pattern (a sink and a window
    wider than the tree is deep; not pillars, which the tree's verify does not choose). `timed`
    records each round's phases, at a device sync per phase boundary.
    """
    steps = EagerTreeSteps(runner, mask, shape, head, kv)
    schedule = FixedLength(shape.depth)
    result, _ = run_rounds(
        runner, prompt, max_new_tokens, steps, schedule, sampling, generator, eos_ids, timed
    )
    return result
