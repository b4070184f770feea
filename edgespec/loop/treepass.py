"""A draft tree in the request loop: built where the controller chose to draft, verified
in one pass, committed to the request's KV sequence (edgespec.loop.request calls these three).

    plan(loop, ps, limit)           the chosen proposer's tree, sized on the cost curve;
                                    sets ps.tree only where it beats the linear draft
    decode(loop, ps) -> rows        scratch sequences get the prefix; one decode_tree
    complete(loop, ps, rows, secs)  walk the tree (greedy argmax / rejection sampling over
                                    siblings), keep the accepted path's KV, emit a Step

Trees need scratch KV sequences: ``loop.tree_seqs`` names the context's sequences the
engine sets aside for branches (none: trees are off). A tree never runs in a shared
(multi-request) pass, under a grammar, or without the controller's calibration. In exact
mode its nodes stay within the probed exact pass size, like a linear draft.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..api.arrays import FloatArray
from ..api.events import Step
from ..api.params import SamplingParams
from ..control import Outcome
from ..control.tree_sizing import size_tree
from ..decoding import sampling, verify
from ..decoding.kvcache import common_prefix
from ..decoding.tree import DraftTree, commit, prepare, release
from ..proposers.base import ProposerSession
from .state import Pass, Request

if TYPE_CHECKING:
    from ..calibration.curve import Calibration
    from ..runtime.context import Context

__all__ = ["plan", "decode", "complete", "MAX_CHILDREN"]

#: children per branching node a proposer may offer (the sizing keeps what pays)
MAX_CHILDREN = 4


@runtime_checkable
class TreeSession(ProposerSession, Protocol):
    """A proposer session that can also offer a draft tree (suffix, n-gram, draft)."""

    def propose_tree(self, k: int, max_children: int = 4) -> DraftTree: ...


class TreeHost(Protocol):
    """What a tree pass needs of the loop (edgespec.loop.request.Loop): the target's
    context, the sequences set aside for branches, and the loop's emit, so the arrow runs
    from the loop to its tree pass only."""

    @property
    def ctx(self) -> Context: ...

    @property
    def tree_seqs(self) -> tuple[int, ...]: ...

    def emit(self, req: Request, new: list[int], rows: FloatArray, *, n_acc: int,
             proposer: str | None, drafted: int, draft_s: float, verify_s: float) -> Step: ...


@runtime_checkable
class _Calibrated(Protocol):
    """A controller with the target's cost curve (the adaptive one), which sizes trees."""

    cal: Calibration


def _seqs(loop: TreeHost, req: Request) -> tuple[int, ...]:
    spare = tuple(s for s in loop.tree_seqs if s != req.seq_id)
    return (req.seq_id, *spare) if spare else ()


def branch(loop: TreeHost, ps: Pass, limit: int) -> None:
    """Sets ``ps.tree`` when a tree of the chosen proposer beats its linear draft."""
    req, draft = ps.req, ps.draft
    seqs = _seqs(loop, req)
    session = req.sessions.get(ps.used) if ps.used else None
    if len(seqs) < 2 or not isinstance(req.controller, _Calibrated) \
            or not isinstance(session, TreeSession):
        return
    cal = req.controller.cal
    if cal.source == "prior":
        # a prior's flat stretches are assumptions; on them trees lost to linear drafts in
        # the recorded replay (docs/trees.md): size trees on a measured curve only
        return
    max_nodes = min(limit, loop.ctx.n_batch - 1)
    if req.exact and cal.exact_max_drafts is not None:
        max_nodes = min(max_nodes, cal.exact_max_drafts)
    if max_nodes < 2:
        return
    t0 = time.perf_counter()
    tree = session.propose_tree(max_nodes, MAX_CHILDREN)
    choice = size_tree(tree, cal, max_nodes=max_nodes, linear_k=len(draft.tokens),
                       max_width=len(seqs))
    ps.draft_seconds += time.perf_counter() - t0
    if choice.is_tree and choice.linear.tokens == draft.tokens:
        ps.tree = choice.tree
        ps.batch_rows = len(choice.tree) + 1  # the controller times the whole pass


def _tree(ps: Pass) -> DraftTree:
    if ps.tree is None:
        raise ValueError("a tree pass without a tree (plan() sets ps.tree)")
    return ps.tree


def decode(loop: TreeHost, ps: Pass) -> FloatArray:
    """One pass over the pending token and every node; rows in the tree's node order."""
    req, tree = ps.req, _tree(ps)
    seqs = _seqs(loop, req)[:tree.width]
    prepare(loop.ctx, req.n_past, seqs)
    try:
        return loop.ctx.decode_tree(*tree.batch(req.tokens[-1], req.n_past, seqs))
    except BaseException:
        release(loop.ctx, seqs)  # the request's own sequence is the loop's to trim
        raise


class _Rows:
    """Row i + 1 of a tree pass (i = -1: the pending token) with the history that node's
    path gives (penalties see it); the subclasses compute the target's greedy token or
    distribution only when verification reads it."""

    def __init__(self, rows: FloatArray, history: list[int], tree: DraftTree,
                 params: SamplingParams) -> None:
        self.rows, self.history, self.tree, self.params = rows, history, tree, params

    def __len__(self) -> int:
        return len(self.tree) + 1

    def _history(self, i: int) -> list[int]:
        node = i - 1
        return self.history if node < 0 else \
            [*self.history, *self.tree.path_tokens(self.tree.path(node))]


class _GreedyRows(_Rows):
    def __getitem__(self, i: int) -> int:
        return sampling.greedy_token(self.rows[i], self._history(i), self.params)


class _DistributionRows(_Rows):
    def __getitem__(self, i: int) -> FloatArray:
        return sampling.distribution(self.rows[i], self._history(i), self.params)


def complete(loop: TreeHost, ps: Pass, rows: FloatArray, verify_seconds: float) -> Step:
    """Verify a tree pass, keep the accepted path's KV, and emit it: the tree counterpart
    of ``Loop.complete``."""
    req, tree, used = ps.req, _tree(ps), ps.used
    s = req.params.sampling
    if s.greedy:
        path, nxt = verify.verify_tree_greedy(tree.tokens, tree.parents,
                                              _GreedyRows(rows, req.tokens, tree, s))
    else:
        path, nxt = verify.verify_tree_sampling(tree.tokens, tree.parents, None,
                                                _DistributionRows(rows, req.tokens, tree, s),
                                                req.generator)
    commit(loop.ctx, tree, path, req.n_past, _seqs(loop, req)[:tree.width])
    n_acc = len(path)
    req.n_past += 1 + n_acc
    req.in_flight = False
    new = [*tree.path_tokens(path), nxt]
    lin = ps.draft.tokens
    lin_acc = common_prefix(lin, new)  # what verifying the linear draft would have kept
    for n, sess in req.sessions.items():
        # the protocol's count: accepted tokens that came from the session's last draft
        sess.accept(new, min(lin_acc, n_acc) if n == used else 0)
    if req.controller is not None:
        # the evidence about the proposer is what its linear draft would have kept
        req.controller.observe(Outcome(
            proposer=used, drafted=len(lin), accepted=lin_acc, draft_seconds=ps.draft_seconds,
            verify_seconds=verify_seconds, tokens=tuple(new), confidence=ps.draft.confidence,
            match_length=ps.draft.match_length, batch_rows=ps.batch_rows))
    req.stats.observe_tree(nodes=len(tree), branches=tree.width, accepted=n_acc,
                           off_first=bool(path) and tree.branch_of()[path[-1]] != 0)
    return loop.emit(req, new, rows[[0, *(i + 1 for i in path)]], n_acc=n_acc, proposer=used,
                      drafted=len(tree), draft_s=ps.draft_seconds, verify_s=verify_seconds)

