"""Tree sizing: whether verifying a draft tree beats verifying the linear draft, here.

A pass over the root and ``n`` drafted nodes costs ``cal.cost(n + 1)`` plain steps
and is expected to emit ``1 + sum of the nodes' path probabilities`` tokens (a node
is emitted iff the target's choices follow its whole path; siblings exclude each
other, so the sum counts each emitted token once, and the target's own token comes
on top). Expected tokens per cost is the pass's goodput, the quantity the adaptive
controller maximises for linear drafts.

For node probabilities that never rise along a path, the best tree of ``n`` nodes
holds the ``n`` most probable nodes (a prefix-closed set: each node's stem is at
least as probable), so one best-first sweep prices every size and
:func:`size_tree` keeps the size with the best goodput. The linear alternative is
the first branch, cut where its own goodput is best (or where the controller cut
it). A tree is chosen only when its goodput beats the linear draft's by
``min_gain``; otherwise the plan is the linear draft, unchanged.

On a device where extra positions are nearly free (a GPU, or a CPU curve with flat
stretches) the sweep grows wide trees; on this 2-core CPU, where 2, 4, 8 and 16
tokens cost 1.69, 2.58, 6.17 and 6.99 steps, an extra branch must carry more
probability than the tokens it displaces would, which the free proposers' second
choices rarely do (docs/trees.md).

    plan = size_tree(tree, cal, max_nodes=15, linear_k=len(draft))
    plan.is_tree, plan.tree, plan.goodput, plan.linear_goodput
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..calibration.curve import Calibration
from ..decoding.tree import DraftTree

__all__ = ["TreePlan", "size_tree", "node_probabilities"]


@dataclass(frozen=True)
class TreePlan:
    tree: DraftTree  # what to verify: a tree (width > 1) or the linear draft (a chain)
    expected: float  # tokens the pass is expected to emit
    cost: float  # its cost in plain steps
    linear: DraftTree  # the best linear cut of the first branch
    linear_expected: float
    linear_cost: float

    @property
    def is_tree(self) -> bool:
        return self.tree.width > 1

    @property
    def goodput(self) -> float:
        return self.expected / self.cost

    @property
    def linear_goodput(self) -> float:
        return self.linear_expected / self.linear_cost


def node_probabilities(tree: DraftTree) -> tuple[float, ...]:
    """Each node's path probability, never above its parent's (a proposer's figures may
    rise along a path through rounding or a per-token share; the chance that a whole
    path is right cannot). Nodes without a figure count 0."""
    conf = tree.confidence or (0.0,) * len(tree)
    out: list[float] = []
    for c, p in zip(conf, tree.parents):
        c = min(max(float(c), 0.0), 1.0)
        out.append(c if p == -1 else min(c, out[p]))
    return tuple(out)


def size_tree(tree: DraftTree, cal: Calibration, *, max_nodes: int,
              linear_k: int | None = None, min_gain: float = 1.05,
              max_width: int | None = None) -> TreePlan:
    """The pass to verify: the best-goodput subtree of ``tree`` (at most ``max_nodes``
    nodes and ``max_width`` branches: a branch is a KV sequence), or its first branch cut
    to ``linear_k`` (default: its best cut) when the tree does not beat that by
    ``min_gain``."""
    probs = node_probabilities(tree)
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, p in enumerate(tree.parents):
        kids[p + 1].append(i)

    # linear: the first branch (nodes 0, 1, ... while each is its predecessor's child)
    chain = [0] if len(tree) else []
    while chain and kids[chain[-1] + 1]:
        chain.append(kids[chain[-1] + 1][0])
    if linear_k is None:
        best_k, best_g, acc = 0, 1.0, 1.0
        for k, node in enumerate(chain[:max_nodes], start=1):
            acc += probs[node]
            g = acc / cal.cost(k + 1)
            if g > best_g:
                best_k, best_g = k, g
        linear_k = best_k
    linear_k = max(0, min(linear_k, len(chain), max_nodes))
    lin_nodes = chain[:linear_k]
    lin_expected = 1.0 + sum(probs[i] for i in lin_nodes)
    lin_cost = cal.cost(linear_k + 1)
    linear = _subtree(tree, set(lin_nodes))

    # the tree: most probable node first among those whose stem is taken
    taken: list[int] = []
    frontier = [(-probs[c], c) for c in kids[0]]
    heapq.heapify(frontier)
    best_n, best_g, acc = 0, 0.0, 1.0
    has_child = [False] * (len(tree) + 1)  # index v + 1: whether node v (-1: root) has one
    width = 0
    while frontier and len(taken) < max_nodes:
        neg, node = heapq.heappop(frontier)
        parent = tree.parents[node]
        grows = has_child[parent + 1]  # a second child of a node is a new branch
        if max_width is not None and grows and width >= max_width:
            continue  # and none of its descendants: they are never pushed
        width += grows or parent == -1 and not has_child[0]
        has_child[parent + 1] = True
        taken.append(node)
        acc -= neg
        g = acc / cal.cost(len(taken) + 1)
        if g > best_g:
            best_n, best_g = len(taken), g
        for c in kids[node + 1]:
            heapq.heappush(frontier, (-probs[c], c))
    chosen = _subtree(tree, set(taken[:best_n]))
    expected = 1.0 + sum(probs[i] for i in taken[:best_n])
    cost = cal.cost(best_n + 1)
    if chosen.width > 1 and expected / cost > min_gain * lin_expected / lin_cost:
        return TreePlan(chosen, expected, cost, linear, lin_expected, lin_cost)
    return TreePlan(linear, lin_expected, lin_cost, linear, lin_expected, lin_cost)


def _subtree(tree: DraftTree, keep: set[int]) -> DraftTree:
    """The nodes in ``keep`` (closed under parents), in their depth-first order."""
    order = [i for i in range(len(tree)) if i in keep]
    new = {old: i for i, old in enumerate(order)}
    return DraftTree(tuple(tree.tokens[i] for i in order),
                     tuple(-1 if tree.parents[i] == -1 else new[tree.parents[i]] for i in order),
                     None if tree.confidence is None else tuple(tree.confidence[i] for i in order),
                     tree.source)
