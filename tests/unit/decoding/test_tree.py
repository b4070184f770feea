"""edgespec.decoding.tree: the flat depth-first draft tree, its one-pass batch layout, and the KV
sequence operations around a tree pass (checked on the strict fake backend)."""
from __future__ import annotations


import numpy as np
import pytest

from edgespec.runtime.context import check_tree
from edgespec.errors import EdgespecError, InvalidInputError
from edgespec.decoding.tree import DraftTree, commit, prepare
from edgespec.decoding.verify import verify_tree_greedy
from tests.fakes.backend import A, B, C, D, E1, E2, SPACE, X, Y, FakeModel, KVMismatch

PATHS = [(5, 7), (6, 7), (6, 8)]


def test_from_paths_merges_prefixes_depth_first():
    t = DraftTree.from_paths(PATHS, [(0.9, 0.5), (0.4, 0.3), (0.2, 0.1)])
    assert t.tokens == (5, 7, 6, 7, 8)
    assert t.parents == (-1, 0, -1, 2, 2)
    assert t.confidence == (0.9, 0.5, 0.4, 0.3, 0.1)  # the shared 6 keeps its best figure
    assert t.depths == (1, 2, 1, 2, 2)
    assert t.leaves == (1, 3, 4) and t.width == 3 and t.depth == 2
    assert t.path(4) == (2, 4) and t.path_tokens(t.path(4)) == (6, 8)
    assert t.branch_of() == (0, 0, 1, 1, 2)


def test_from_paths_keeps_the_first_path_first_and_caps_nodes():
    t = DraftTree.from_paths([(1, 2, 3), (1, 4), (5,)], max_nodes=4)
    assert t.tokens == (1, 2, 3, 4) and t.parents == (-1, 0, 1, 0)  # (5,) did not fit
    assert DraftTree.from_paths([(1, 2, 3)]) == DraftTree.chain([1, 2, 3])
    assert DraftTree.from_paths([]).width == 0


@pytest.mark.parametrize("tokens, parents, match", [
    ((1, 2), (-1,), "one parent per token"),
    ((1, 2, 3), (-1, 0, 5), "depth-first"),
    ((1, 2, 3, 4), (-1, 0, -1, 1), "depth-first"),   # node 3 under node 1 after leaving it
    ((1, -2), (-1, 0), "non-negative"),
])
def test_malformed_trees_are_refused(tokens, parents, match):
    with pytest.raises(InvalidInputError, match=match):
        DraftTree(tokens, parents)


def test_batch_layout_gives_each_node_the_sequences_of_its_branches():
    t = DraftTree.from_paths(PATHS)
    b = t.batch(root=4, pos0=100, seq_ids=(0, 3, 5, 7))
    assert b.tokens == (4, 5, 7, 6, 7, 8)
    assert b.positions == (100, 101, 102, 101, 102, 102)
    assert b.seq_ids == ((0, 3, 5), (0,), (0,), (3, 5), (3,), (5,))
    assert all(b.logits)
    with pytest.raises(InvalidInputError, match="3 branches"):
        t.batch(root=4, pos0=0, seq_ids=(0, 1))


def test_check_tree_guards():
    ok = dict(tokens=[1, 2], positions=[0, 1], seq_ids_per_token=[[0, 1], [1]],
              logits_mask=[True, True], n_ctx=8, n_batch=8, n_seq_max=2)
    check_tree(**ok)
    for bad, match in [(dict(positions=[0]), "one position"),
                       (dict(seq_ids_per_token=[[0, 0], [1]]), "distinct"),
                       (dict(seq_ids_per_token=[[0, 2], [1]]), "0..1"),
                       (dict(seq_ids_per_token=[[], [1]]), "distinct"),
                       (dict(n_seq_max=1), "n_seq_max > 1"),
                       (dict(n_batch=1), "n_batch"),
                       (dict(positions=[7, 8]), "exceeds the context"),
                       (dict(tokens=[], positions=[], seq_ids_per_token=[], logits_mask=[]),
                        "no tokens")]:
        with pytest.raises(EdgespecError, match=match):
            check_tree(**{**ok, **bad})


# --- one pass on the fake: rows, greedy walk, commit of every possible path ---------------

PROMPT = [0, X, Y]  # greedy continues z . </s>; we draft around "a b c"


def _prefilled(n_seq_max=4):
    model = FakeModel()
    ctx = model.new_context(n_ctx=64, n_batch=32, n_seq_max=n_seq_max)
    ctx.decode(PROMPT, 0, 0, logits="none")
    return model, ctx


def _pass(model, ctx, tree, root, seqs=(0, 1, 2)):
    pos0 = len(PROMPT)
    prepare(ctx, pos0, seqs)
    b = tree.batch(root, pos0, seqs)
    rows = ctx.decode_tree(*b)
    return pos0, rows


def test_tree_rows_are_the_linear_rows_of_each_branch():
    model, ctx = _prefilled()
    tree = DraftTree.from_paths([(B, C), (B, D), (SPACE, A)])
    pos0, rows = _pass(model, ctx, tree, root=A)
    assert rows.shape == (len(tree) + 1, model.n_vocab)
    assert np.array_equal(rows[0], model.row(PROMPT + [A]))
    for node in range(len(tree)):
        history = PROMPT + [A, *tree.path_tokens(tree.path(node))]
        assert np.array_equal(rows[node + 1], model.row(history)), node


@pytest.mark.parametrize("end", [None, 0, 1, 2, 3, 4])
def test_commit_leaves_exactly_the_accepted_path(end):
    """Any accepted path (or none): the main sequence then holds prompt + root + path,
    scratch sequences are empty, and the next decode continues at the right position."""
    model, ctx = _prefilled()
    tree = DraftTree.from_paths([(B, C), (B, D), (SPACE, A)])  # nodes B C D SPACE A
    pos0, _ = _pass(model, ctx, tree, root=A)
    path = () if end is None else tree.path(end)
    commit(ctx, tree, path, pos0, (0, 1, 2))
    kept = PROMPT + [A, *tree.path_tokens(path)]
    assert ctx.tokens(0) == kept
    assert ctx.tokens(1) == [] and ctx.tokens(2) == []
    out = ctx.decode([X], len(kept), 0, logits="last")  # strict: fails on a wrong position
    assert np.array_equal(out[0], model.row(kept + [X]))


def test_greedy_tree_step_matches_the_greedy_continuation():
    model, ctx = _prefilled()
    # the target's greedy after "x y a" is b c é...: the second branch holds b c
    tree = DraftTree.from_paths([(B, D), (B, C, E1), (C,)])
    pos0, rows = _pass(model, ctx, tree, root=A)
    verdict = verify_tree_greedy(tree.tokens, tree.parents, rows.argmax(axis=1))
    assert tree.path_tokens(verdict.path) == (B, C, E1)
    assert verdict.next_token == E2 == model.greedy(PROMPT + [A, B, C, E1], 1)[0]
    commit(ctx, tree, verdict.path, pos0, (0, 1, 2))
    assert ctx.tokens(0) == PROMPT + [A, B, C, E1]


def test_a_commit_refuses_a_path_that_is_not_in_the_tree():
    model, ctx = _prefilled()
    tree = DraftTree.from_paths([(B, C), (D,)])
    pos0, _ = _pass(model, ctx, tree, root=A, seqs=(0, 1))
    with pytest.raises(InvalidInputError, match="not a root-to-node path"):
        commit(ctx, tree, (0, 2), pos0, (0, 1))


def test_the_fake_refuses_a_tree_over_diverged_sequences():
    model, ctx = _prefilled()
    tree = DraftTree.from_paths([(B,), (C,)])
    with pytest.raises(KVMismatch):  # no prepare(): sequence 1 lacks the prompt
        ctx.decode_tree(*tree.batch(A, len(PROMPT), (0, 1)))


def test_single_sequence_contexts_refuse_coupled_tokens():
    model, ctx = _prefilled(n_seq_max=1)
    tree = DraftTree.from_paths([(B,), (C,)])
    with pytest.raises(EdgespecError, match="n_seq_max"):
        ctx.decode_tree(*tree.batch(A, len(PROMPT), (0, 1)))
    with pytest.raises(EdgespecError, match="n_seq_max"):
        ctx.seq_cp(0, 1, 0, 3)
