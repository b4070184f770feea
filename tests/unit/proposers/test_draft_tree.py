"""The draft model's tree: its linear draft as the first branch and, at every position,
its runners-up as leaves (no extra draft decode), verified in one pass by the loop."""
from __future__ import annotations

import numpy as np

from edgespec.calibration.curve import Calibration
from edgespec.control import ControlSettings
from edgespec.api.params import GenerationParams, SamplingParams as SP
from edgespec.proposers.draft import DraftModelProposer, _runners_up
from fakes import FakeModel, fake_engine

FLAT = Calibration.linear(0.02, step_seconds=0.02)  # extra positions nearly free: trees pay


def test_runners_up_are_the_next_most_probable_tokens():
    logits = np.array([0.0, 3.0, 2.0, 1.0, -5.0])
    ups = _runners_up(logits, None, 1, 2)
    assert [t for t, _ in ups] == [2, 3]
    p = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose([q for _, q in ups], p[[2, 3]])


def test_the_tree_extends_the_linear_draft_without_decoding_again():
    dm = FakeModel()
    prop = DraftModelProposer(dm, n_ctx=256, n_batch=64)
    sess = prop.open(dm.tokenize("a", add_special=True, parse_special=False), SP())
    linear = sess.propose(4)
    n_decodes = len(prop.ctx.decodes)
    tree = sess.propose_tree(4, max_children=3)
    assert len(prop.ctx.decodes) == n_decodes  # the leaves came from the kept rows
    chain = [0]
    while True:  # the first branch is the linear draft
        kids = [i for i, p in enumerate(tree.parents) if p == chain[-1]]
        if not kids:
            break
        chain.append(kids[0])
    assert tuple(tree.tokens[i] for i in chain) == linear.tokens
    assert len(tree) == 4 + 4 * 2  # two runners-up beside each draft token
    conf = tree.confidence
    assert all(conf[i] <= (conf[p] if p >= 0 else 1.0) + 1e-12
               for i, p in enumerate(tree.parents))
    prop.close()


def _run(sampling):
    dm = FakeModel()
    prop = DraftModelProposer(dm, n_ctx=256, n_batch=64)
    prop.seconds_per_token = 1e-6  # the fake draft costs nothing: the controller drafts
    eng = fake_engine(FakeModel(), {"draft": prop}, control=ControlSettings(), calibration=FLAT)
    eng.loop.tree_seqs = (1, 2, 3)  # what --tree-width 3 sets aside
    eng.ctx.n_seq_max = 4
    params = GenerationParams(max_tokens=24, chat=False, sampling=sampling)
    return eng.generate("a", params, proposer="draft"), eng.generate("a", params, proposer="none")


def test_greedy_output_with_draft_trees_is_the_plain_paths():
    spec, plain = _run(SP())
    assert spec.tokens == plain.tokens
    assert spec.stats.tree_passes > 0


def test_sampled_requests_with_draft_trees_keep_the_kv_in_step():
    # a draft model's sampled draft is verified with its distributions (equal to plain
    # sampling in law, not seed for seed: tests/unit/decoding/test_verify*.py and the tree sampling
    # tests check the law); here the strict fake KV checks every tree pass's bookkeeping
    trees = 0
    for seed in range(8):
        spec, _ = _run(SP(temperature=1.0, seed=seed))
        assert spec.stop_reason in ("length", "eos")
        trees += spec.stats.tree_passes
    assert trees > 0
