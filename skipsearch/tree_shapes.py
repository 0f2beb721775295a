"""Token-tree drafts: the shape of a tree and what it accepts (docs/theory.md, "Token trees").

A chain draft of γ tokens loses the rest of its round at the first rejection. A tree drafts several
candidates where the draft is unsure and the verify judges them all in one pass. A static shape
gives the children of every node by depth: `2x2x1` drafts the draft's top 2 tokens after the
pending one, the top 2 after each of those, then the top 1 after each of the 4: 2 + 4 + 4 = 10
nodes over 3 draft passes of 1, 2 and 4 rows, and a verify of 11 rows. The chain of γ tokens is the
shape `1x1x...x1` (γ ones), and drafts, verifies and accepts exactly as the chain does.

Nodes are numbered in the order they are drafted, depth by depth, children of one parent in the
draft's rank order; node 0 is the root (the pending token). So the parents precede their
children, and the leaves (the last depth) come last: what the engine's cache layout and the
verify's reuse of the draft's exact K/V rely on (`engine.tree_rounds`).

Pure: no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from skipsearch.errors import ConfigError

MAX_NODES = 31  # the most nodes a tree may have: a verify of 32 rows, the most a LatencyProfile measures
MAX_WIDTH = 8  # the most children of a node: the ranks the estimator records (`RANK_CAP`)
RANK_CAP = MAX_WIDTH  # ranks at or past it are stored as it: no shape reaches them
CHAIN = "chain"  # a chain of γ tokens as files and command lines write it (`tree_label`, `as_tree`)
SHAPE_FORM = re.compile(r"^[1-9]\d*(x[1-9]\d*)*$")


class Nodes:
    """A tree given by its nodes' parents (node 0, the root, has -1), numbered so that parents
    precede their children and the `leaves` (the nodes the draft never feeds) come last."""

    parents: tuple[int, ...]
    leaves: int

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """The depth of every node (the root 0)."""
        depths = [0]
        for node in range(1, len(self.parents)):
            depths.append(depths[self.parents[node]] + 1)
        return tuple(depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Every node's children, in rank order."""
        found: list[list[int]] = [[] for _ in self.parents]
        for node, parent in enumerate(self.parents[1:], start=1):
            found[parent].append(node)
        return tuple(tuple(kids) for kids in found)

    def ancestors(self, node: int) -> tuple[int, ...]:
        """`node` and its ancestors up to the root, root first."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return tuple(reversed(path))


@dataclass(frozen=True)
class RoundTree(Nodes):
    """The tree one round of a dynamic tree drafted (`DynamicTree`): its nodes' parents, the fed
    nodes (the root first) before the `leaves`."""

    parents: tuple[int, ...]
    leaves: int

    @property
    def nodes(self) -> int:
        return len(self.parents) - 1

    @property
    def verify_rows(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return max(self.depths)


@dataclass(frozen=True)
class TreeShape(Nodes):
    """Children per node at each depth (`widths[d]`: at depth `d + 1`)."""

    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.widths:
            raise ConfigError("a tree needs at least one depth: e.g. 2x1 (or 1 for a chain of one token)")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in self.widths):
            raise ConfigError(f"tree widths must be positive integers, got {list(self.widths)}")
        if max(self.widths) > MAX_WIDTH:
            raise ConfigError(
                f"tree {self}: at most {MAX_WIDTH} children a node (the draft's ranks recorded): "
                f"use widths <= {MAX_WIDTH}"
            )
        if self.nodes > MAX_NODES:
            raise ConfigError(
                f"tree {self} has {self.nodes} nodes, over the {MAX_NODES} a verify may hold: narrow a depth"
            )

    @classmethod
    def parse(cls, text: str | int) -> TreeShape:
        """`2x2x1`, or a number `γ` for the chain of γ tokens (`chain`, `1x1x1` alike)."""
        text = str(text).strip().lower()
        if text.isdigit():
            return cls.chain(int(text))
        if not SHAPE_FORM.match(text):
            raise ConfigError(
                f"bad tree shape {text!r}: give the children per depth as NxNx..., e.g. 2x2x1 "
                "(or a number for a chain)"
            )
        return cls(tuple(int(part) for part in text.split("x")))

    @classmethod
    def chain(cls, gamma: int) -> TreeShape:
        if gamma < 1:
            raise ConfigError(f"a chain drafts at least one token, got {gamma}")
        if gamma > MAX_NODES:  # before the tuple is built: a huge number would not fit in memory
            raise ConfigError(
                f"a chain of {gamma} tokens is over the {MAX_NODES} nodes a verify may hold: pass "
                f"{MAX_NODES} or fewer"
            )
        return cls((1,) * gamma)

    def __str__(self) -> str:
        return "x".join(str(width) for width in self.widths)

    @property
    def depth(self) -> int:
        """Draft passes a round runs, and the most draft tokens it can accept."""
        return len(self.widths)

    @property
    def widest(self) -> int:
        """The most children a node has: the draft vocabulary must hold as many ids."""
        return max(self.widths)

    @cached_property
    def per_depth(self) -> tuple[int, ...]:
        """Nodes at depths 1..D (`n_d = n_{d-1} c_d`, the root alone at depth 0)."""
        return tuple(math.prod(self.widths[: d + 1]) for d in range(self.depth))

    @property
    def nodes(self) -> int:
        """Draft tokens a round proposes (the root excluded)."""
        return sum(self.per_depth)

    @property
    def draft_rows(self) -> tuple[int, ...]:
        """Rows of each draft pass: the root, then the nodes of each depth but the last."""
        return (1, *self.per_depth[:-1])

    @property
    def verify_rows(self) -> int:
        """Rows of the verify pass: the root and every node."""
        return self.nodes + 1

    @property
    def leaves(self) -> int:
        """Nodes the draft never feeds (the last depth): the verify runs every layer for them."""
        return self.per_depth[-1]

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """The parent of every node (node 0, the root, has -1), in draft order."""
        parents, level = [-1], [0]
        for width in self.widths:
            next_level = []
            for parent in level:
                for _ in range(width):
                    parents.append(parent)
                    next_level.append(len(parents) - 1)
            level = next_level
        return tuple(parents)

    def accepted_depth(self, ranks: Sequence[int], probs: Sequence[Sequence[float]] = ()) -> int:
        """Draft tokens a round accepts when the target's token at draft depth `d + 1` has rank
        `ranks[d]` under the draft (0: the draft's argmax) along the target's own path: a greedy
        round goes one depth further while the target's token is among the node's children, the
        draft's top `c_d` (docs/theory.md, "Token trees"). A static shape's nodes do not depend on
        the draft's probabilities `probs`."""
        accepted = 0
        for width, rank in zip(self.widths, ranks, strict=False):
            if rank >= width:
                break
            accepted += 1
        return accepted


def parse_trees(values: Sequence[str | int] | None) -> tuple[Tree, ...]:
    """A space file's or a command line's trees, static or dynamic, each once; `chain`, a number
    or `1x1x1` are the chain every draft is scored as anyway, so they add none."""
    shapes: list[Tree] = []
    for value in values or ():
        shape = as_tree(value)
        if shape is not None and shape not in shapes:
            shapes.append(shape)
    return tuple(shapes)


DYNAMIC_FORM = re.compile(r"^n([1-9]\d*)(?:d([1-9]\d*))?(?:k([1-9]\d*))?$")
MAX_TOP = 4  # the most children a dynamic tree's fed node proposes: the draft probabilities recorded


@dataclass(frozen=True)
class DynamicTree:
    """A tree grown each round from the draft's own probabilities (EAGLE-2's expand and rerank,
    docs/theory.md, "Dynamic trees"): `depth` draft passes, each over the `top` nodes of the
    deepest depth with the highest cumulative draft probability (the root alone at first), each
    of which proposes its `top` most likely children; the verify then takes the `nodes` most
    likely of every node drafted, the fed ones always (their K/V below `s1` is already exact).
    So the rows are fixed (`draft_rows`, `verify_rows`) and only which tokens fill them changes:
    `n16d5k2`, or `--tree-nodes 16` with the default depth and `top` 2."""

    nodes: int
    depth: int
    top: int = 2

    def __post_init__(self) -> None:
        for name in ("nodes", "depth", "top"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"a dynamic tree's {name} must be a positive integer, got {value!r}")
        if self.top > MAX_TOP:
            raise ConfigError(f"dynamic tree {self}: at most {MAX_TOP} children a node: use k <= {MAX_TOP}")
        if self.nodes > MAX_NODES:
            raise ConfigError(
                f"dynamic tree {self} has {self.nodes} nodes, over the {MAX_NODES} a verify may hold: "
                f"use {MAX_NODES} or fewer"
            )
        fed, drafted = self.top * (self.depth - 1), self.top + (self.depth - 1) * self.top**2
        if not fed < self.nodes <= drafted:
            raise ConfigError(
                f"dynamic tree {self}: {self.depth} draft passes feeding {self.top} nodes a depth verify "
                f"between "
                f"{fed + 1} and {drafted} nodes, not {self.nodes}: change the node budget or the depth"
            )

    @classmethod
    def for_budget(cls, nodes: int, top: int = 2) -> DynamicTree:
        """The tree of `nodes` nodes at the default depth: about half of them fed, the rest leaves."""
        if not isinstance(nodes, int) or nodes < 1:
            raise ConfigError(f"--tree-nodes takes a positive node budget, got {nodes!r}")
        depth = max(1 + nodes // (2 * top), 1 + -(-(nodes - top) // top**2))
        return cls(nodes, depth, top)

    @classmethod
    def parse(cls, text: str) -> DynamicTree:
        """`n16`, `n16d5` or `n16d5k2` (nodes, depth, top)."""
        found = DYNAMIC_FORM.match(str(text).strip().lower())
        if found is None:
            raise ConfigError(
                f"bad dynamic tree {text!r}: give nN[dD][kK], e.g. n16 or n16d5k2 (a node budget, "
                "draft passes, children a node)"
            )
        nodes, depth, top = found.groups()
        if depth is None:
            return cls.for_budget(int(nodes), int(top or 2))
        return cls(int(nodes), int(depth), int(top or 2))

    def __str__(self) -> str:
        return f"n{self.nodes}d{self.depth}k{self.top}"

    @property
    def widest(self) -> int:
        """The most children a node has: the draft vocabulary must hold as many ids."""
        return self.top

    @property
    def draft_rows(self) -> tuple[int, ...]:
        """Rows of each draft pass: the root, then `top` nodes a depth."""
        return (1, *(self.top,) * (self.depth - 1))

    @property
    def verify_rows(self) -> int:
        return self.nodes + 1

    @property
    def leaves(self) -> int:
        """Verified nodes the draft never fed."""
        return self.nodes - self.top * (self.depth - 1)

    def at_depth(self, depth: int) -> DynamicTree:
        """The tree a round drafts when only `depth` more tokens are wanted (the last rounds)."""
        if depth >= self.depth:
            return self
        return DynamicTree(min(self.nodes, self.top + (depth - 1) * self.top**2), depth, self.top)

    def accepted_depth(self, ranks: Sequence[int], probs: Sequence[Sequence[float]]) -> int:
        """Draft tokens a greedy round accepts along the target's own path, where the target's token
        at depth `d + 1` ranks `ranks[d]` under the draft and `probs[d]` holds the draft's `top`
        largest probabilities there. The nodes off the path are unseen: each is taken to propose
        children as likely as the path's node of its depth does (below the path's deepest fed node,
        as that node does), which fixes every candidate's cumulative probability and so which nodes
        the round feeds and verifies (docs/theory.md, "Dynamic trees")."""
        k = self.top
        frontier = [(0.0, True)]  # the fed nodes of the deepest depth: (log-probability, on the path)
        pool: list[tuple[float, bool, int]] = []  # drafted, unfed: (log-probability, on path, depth)
        reached = 0  # the deepest depth whose path node was drafted
        fed_path = 0  # the deepest depth whose path node was fed
        for depth in range(self.depth):
            if depth >= len(ranks):
                break
            # Below the path's deepest fed node the draft reads no position of the path: that node's
            # probabilities stand in, so a round depends only on the positions it drafts from.
            logs = [math.log(max(p, 1e-30)) for p in probs[min(depth, fed_path)][:k]]
            rank = ranks[depth] if fed_path == depth else k
            candidates = []
            for cum, on_path in frontier:
                for j, value in enumerate(logs):
                    candidates.append((cum + value, on_path and j == rank))
            if rank < k:
                reached = depth + 1
            candidates.sort(key=lambda c: (-c[0], not c[1]))
            if depth + 1 < self.depth:
                frontier = candidates[:k]
                if any(on_path for _, on_path in frontier):
                    fed_path = depth + 1
                pool += [(c, p, depth + 1) for c, p in candidates[k:]]
            else:
                pool += [(c, p, depth + 1) for c, p in candidates]
        pool.sort(key=lambda c: (-c[0], c[2]))
        chosen = {d for _, on_path, d in pool[: self.leaves] if on_path}
        accepted = 0
        for depth in range(1, reached + 1):
            if depth > fed_path and depth not in chosen:
                break
            accepted = depth
        return accepted


Tree = TreeShape | DynamicTree
"""A round's tree: a static shape, or a node budget filled from the draft's probabilities."""


def parse_tree(text: str | int) -> Tree:
    """`2x2x1` (static), `n16d5k2` (dynamic) or a number (the chain of that many tokens)."""
    if str(text).strip().lower().startswith("n"):
        return DynamicTree.parse(str(text))
    return TreeShape.parse(text)


def as_tree(value: Tree | str | int | None) -> Tree | None:
    """The one reading of a round's shape: None for a chain of γ tokens — None itself, `chain`, a
    number or a chain-shaped `1x1x1` — else the token tree. Code holds None for the chain; the
    label `chain` exists only in files and on command lines (`tree_label` writes it)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == CHAIN):
        return None
    tree = parse_tree(value) if isinstance(value, str | int) else value
    if isinstance(tree, TreeShape) and all(width == 1 for width in tree.widths):
        return None
    return tree


def tree_label(tree: Tree | None) -> str:
    """How files label a round's shape: `chain`, or the tree's own form (`as_tree` reads it back)."""
    return CHAIN if tree is None else str(tree)
