"""Draft trees on a real model (SmolLM2-135M): one decode_tree pass gives every node the
logits a linear pass over its branch gives, and after committing ANY accepted path the
KV cache is the one a linear decode of that path leaves: the sequence's state bytes are
equal and so are the next token's logits, bitwise (same context configuration)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.runtime.model import load_model
from edgespec.decoding.tree import DraftTree, commit, prepare

SEQS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def model(model_path):
    m = load_model(model_path("smollm2-135m"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def setup(model):
    prompt = model.tokenize("The quick brown fox jumps over the lazy dog. The quick brown")
    w = lambda s: model.tokenize(s, add_special=False)  # noqa: E731
    tree = DraftTree.from_paths([w(" fox jumps over"), w(" fox leaps"), w(" dog sleeps"),
                                 w(" cat")])
    assert tree.width == 4 and len(tree) >= 7  # shared prefixes, several depths
    return prompt[:-1], prompt[-1], tree, w(" the")[0]


def _context(model, cached):
    ctx = model.new_context(n_ctx=256, n_batch=64, n_threads=1, n_seq_max=len(SEQS))
    ctx.decode(cached, 0, 0, logits="none")
    return ctx


@pytest.mark.parametrize("end", [None, 0, 1, 2, 3, 4, 5, 6, 7])
def test_kv_after_any_accepted_path_equals_a_linear_decode(model, setup, end):
    cached, root, tree, probe = setup
    if end is not None and end >= len(tree):
        pytest.fail(f"the test tree has only {len(tree)} nodes")
    pos0 = len(cached)
    path = () if end is None else tree.path(end)
    kept = [root, *tree.path_tokens(path)]

    ctx = _context(model, cached)
    prepare(ctx, pos0, SEQS)
    rows = ctx.decode_tree(*tree.batch(root, pos0, SEQS))
    commit(ctx, tree, path, pos0, SEQS)

    ref = _context(model, cached)
    linear = ref.decode(kept, pos0, 0, logits="all")
    try:
        # the tree's rows along the path are the linear pass's rows
        assert np.array_equal(rows[[0, *(i + 1 for i in path)]], linear)
        # only the main sequence is left, ending at the last kept token
        assert [ctx.seq_pos_max(s) for s in SEQS] == [pos0 + len(path), -1, -1, -1]
        assert ctx.state_get(0) == ref.state_get(0)
        nxt = pos0 + len(kept)
        assert np.array_equal(ctx.decode([probe], nxt, 0)[0], ref.decode([probe], nxt, 0)[0])
    finally:
        ctx.close()
        ref.close()
