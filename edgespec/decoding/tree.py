"""Draft trees: several candidate continuations that share prefixes, verified in one pass.

A :class:`DraftTree` is flat: node ``i`` holds ``tokens[i]`` and ``parents[i]`` (``-1``:
a child of the *root*, the last emitted token, which the pass evaluates first), in
depth-first order, so every subtree is a contiguous run of indices and the first
root-to-leaf path is nodes ``0 .. d-1``. ``confidence[i]`` is the proposer's chance
that node ``i`` and all its ancestors are right (a path probability).

One target pass evaluates ``[root] + nodes``. llama.cpp lets a token belong to several
KV sequences, and attends from a token only to cached tokens of its own sequences, so
a tree pass gives each branch (root-to-leaf path) a sequence id: a node belongs to the
sequences of the leaves below it, and each row's logits condition on exactly its
ancestors. The first branch is the request's own sequence (``main``); the others are
scratch sequences that first receive the cached prefix (``seq_cp``, which in a unified
KV pool only marks cells, no copy) and are dropped after verification.

    tree = DraftTree.from_paths([(5, 7), (6, 7), (6, 8)])   # tokens (5, 7, 6, 7, 8)
    layout = tree.batch(root=4, pos0=100, seq_ids=(0, 1, 2))  # one decode_tree call
    ...verify (edgespec.decoding.verify.verify_tree_greedy / _sampling) -> path (2, 4)
    commit(ctx, tree, path, pos0=100, seq_ids=(0, 1, 2))    # KV of seq 0 == root 6 8

After :func:`commit` the main sequence holds the root and the accepted path at
positions ``pos0 ..``, the same cells, holding the same K/V rows, that a linear pass
over that path would have left (tests/integration/test_tree_kv.py checks the cells'
bytes on a real model). When the accepted branch is not the first, its cells sit after
the first branch's freed ones; later passes read the same values in another cell
order, which llama.cpp's kernels may sum in another order (near-tie logits can differ
in the last bits; docs/trees.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, NamedTuple, Sequence

import numpy as np

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from ..runtime.context import Context

__all__ = ["DraftTree", "TreeBatch", "commit", "prepare", "release"]


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    confidence: tuple[float, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n:
            raise InvalidInputError(f"a draft tree needs one parent per token "
                                    f"({n} tokens, {len(self.parents)} parents)")
        if self.confidence is not None and len(self.confidence) != n:
            raise InvalidInputError(f"a draft tree needs one confidence per token "
                                    f"({n} tokens, {len(self.confidence)} confidences)")
        if any(int(t) < 0 for t in self.tokens):
            raise InvalidInputError("draft tree tokens must be non-negative token ids")
        # depth-first order: each parent is the previous node or one of its ancestors
        chain: list[int] = []  # ancestors of the previous node, root side first, itself last
        for i, p in enumerate(self.parents):
            while chain and chain[-1] != p:
                chain.pop()
            if p != -1 and not chain:
                raise InvalidInputError(
                    f"draft tree node {i} has parent {p}, which is not on the path to node "
                    f"{i - 1}: nodes must be in depth-first order (build with from_paths)")
            chain.append(i)

    # --- constructors ------------------------------------------------------------------
    @classmethod
    def chain(cls, tokens: Sequence[int], confidence: Sequence[float] | None = None,
              source: str = "") -> "DraftTree":
        """A linear draft as a one-branch tree."""
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)),
                   None if confidence is None else tuple(float(c) for c in confidence), source)

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]],
                   confidences: Iterable[Sequence[float]] | None = None,
                   source: str = "", max_nodes: int | None = None) -> "DraftTree":
        """Merges candidate continuations into a trie; the first path becomes the first
        branch. A shared prefix keeps its highest confidence. With ``max_nodes`` a path
        is cut where the tree is full (earlier paths win)."""
        paths = [tuple(int(t) for t in p) for p in paths]
        confs = ([tuple(float(c) for c in cs) for cs in confidences]
                 if confidences is not None else None)
        # trie in insertion order: node -> ordered children, so depth-first order keeps the
        # first path first and siblings in the order their paths came
        kids: dict[int, dict[int, int]] = {-1: {}}
        tok: list[int] = []
        conf: list[float] = []
        for j, path in enumerate(paths):
            v = -1
            for d, t in enumerate(path):
                c = confs[j][d] if confs is not None and d < len(confs[j]) else 0.0
                if t in kids[v]:
                    v = kids[v][t]
                    conf[v] = max(conf[v], c)
                    continue
                if max_nodes is not None and len(tok) >= max_nodes:
                    break
                tok.append(t)
                conf.append(c)
                kids[v][t] = len(tok) - 1
                kids[len(tok) - 1] = {}
                v = len(tok) - 1
        order: list[int] = []
        parent_of: dict[int, int] = {}

        def visit(v: int) -> None:  # iterative would do; depth is bounded by the draft length
            for child in kids[v].values():
                parent_of[child] = v
                order.append(child)
                visit(child)

        visit(-1)
        new = {old: i for i, old in enumerate(order)}
        return cls(tuple(tok[o] for o in order),
                   tuple(new[parent_of[o]] if parent_of[o] != -1 else -1 for o in order),
                   tuple(conf[o] for o in order) if confs is not None else None, source)

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int],
                     confidence: Sequence[float] | None = None, source: str = "") -> "DraftTree":
        """Any parents-before-children order (a best-first expansion's, say) put in
        depth-first order; siblings keep their relative order, so each node's first child
        stays first."""
        n = len(tokens)
        if len(parents) != n:
            raise InvalidInputError(f"a draft tree needs one parent per token "
                                    f"({n} tokens, {len(parents)} parents)")
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for i, p in enumerate(parents):
            if not -1 <= int(p) < i:
                raise InvalidInputError(f"draft tree node {i} has parent {p}: parents must "
                                        "come before their children")
            kids[int(p) + 1].append(i)
        order: list[int] = []
        stack = list(reversed(kids[0]))
        while stack:
            v = stack.pop()
            order.append(v)
            stack.extend(reversed(kids[v + 1]))
        new = {old: i for i, old in enumerate(order)}
        return cls(tuple(int(tokens[o]) for o in order),
                   tuple(-1 if int(parents[o]) == -1 else new[int(parents[o])] for o in order),
                   None if confidence is None else tuple(float(confidence[o]) for o in order),
                   source)

    # --- shape ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        """Tokens from the root: 1 for the root's children."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p == -1 else d[p] + 1)
        return tuple(d)

    @property
    def leaves(self) -> tuple[int, ...]:
        """Nodes without children, in order: one per branch."""
        has_child = {p for p in self.parents}
        return tuple(i for i in range(len(self)) if i not in has_child)

    @property
    def width(self) -> int:
        """Branches (root-to-leaf paths); 1 for a chain, 0 for an empty tree."""
        return len(self.leaves)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def path(self, node: int) -> tuple[int, ...]:
        """Node indices from the root's child down to ``node``."""
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))

    def path_tokens(self, path: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.tokens[i] for i in path)

    def branch_of(self) -> tuple[int, ...]:
        """For each node, the index of the first branch (leaf, in order) through it."""
        leaf_index = {leaf: j for j, leaf in enumerate(self.leaves)}
        first = [len(self)] * len(self)
        for i in reversed(range(len(self))):
            if i in leaf_index:
                first[i] = leaf_index[i]
            p = self.parents[i]
            if p != -1:
                first[p] = min(first[p], first[i])
        return tuple(first)

    def batch(self, root: int, pos0: int, seq_ids: Sequence[int]) -> "TreeBatch":
        """The one-pass layout: ``[root] + nodes`` at positions ``pos0 + depth``; branch j
        (the j-th leaf's path) is sequence ``seq_ids[j]``; every row has logits."""
        leaves = self.leaves
        if len(seq_ids) < max(len(leaves), 1):
            raise InvalidInputError(f"a tree of {len(leaves)} branches needs as many "
                                    f"sequence ids (got {len(seq_ids)})")
        members: list[set[int]] = [set() for _ in range(len(self))]
        for j, leaf in enumerate(leaves):
            v = leaf
            while v != -1:
                members[v].add(int(seq_ids[j]))
                v = self.parents[v]
        used = tuple(int(s) for s in seq_ids[:max(len(leaves), 1)])
        seqs = (used,) + tuple(tuple(s for s in used if s in m) for m in members)
        return TreeBatch(tokens=(int(root),) + self.tokens,
                         positions=(pos0,) + tuple(pos0 + d for d in self.depths),
                         seq_ids=seqs, logits=(True,) * (len(self) + 1))


class TreeBatch(NamedTuple):
    """What :meth:`edgespec.runtime.context.Context.decode_tree` takes, in its argument order."""

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    seq_ids: tuple[tuple[int, ...], ...]
    logits: tuple[bool, ...]


# --- the KV cache around a tree pass -----------------------------------------------------

def prepare(ctx: Context, pos0: int, seq_ids: Sequence[int]) -> None:
    """Before a tree pass: every scratch branch sequence holds the main sequence's cached
    positions ``0 .. pos0 - 1`` (llama.cpp requires sequences that share a token in a
    batch to agree before it)."""
    main = int(seq_ids[0])
    for s in seq_ids[1:]:
        ctx.trim(int(s), 0)
        if pos0 > 0:
            ctx.seq_cp(main, int(s), 0, pos0)


def release(ctx: Context, seq_ids: Sequence[int]) -> None:
    """Drops the scratch branch sequences (every position of each)."""
    for s in seq_ids[1:]:
        ctx.trim(int(s), 0)


def commit(ctx: Context, tree: DraftTree, path: Sequence[int], pos0: int, seq_ids: Sequence[int]) -> None:
    """After verification: the main sequence keeps the root (``pos0``) and the accepted
    ``path``, nothing past them, and the scratch sequences are dropped. Only sequence
    operations: no token is decoded again.

    Branches through the path's last node all hold it; the first of them is taken. The
    main sequence (branch 0) holds it already when that is branch 0, else the path's
    cells are added to the main sequence from that branch."""
    n_kept = len(path)
    main = int(seq_ids[0])
    if n_kept:
        want = np.asarray(tree.path(path[-1]))
        if want.shape[0] != n_kept or np.any(want != np.asarray(path)):
            raise InvalidInputError(f"{tuple(path)} is not a root-to-node path of the tree")
    branch = tree.branch_of()[path[-1]] if n_kept else 0
    end = pos0 + 1 + n_kept  # first position past the kept tokens
    if branch == 0:
        ctx.trim(main, end)
    else:
        src = int(seq_ids[branch])
        ctx.trim(main, pos0 + 1)
        ctx.seq_cp(src, main, pos0 + 1, end)
    release(ctx, seq_ids)
