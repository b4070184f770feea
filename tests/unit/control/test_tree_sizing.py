"""control.tree_sizing.size_tree: trees where extra positions are cheap, linear drafts where not."""
from __future__ import annotations

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.control.tree_sizing import node_probabilities, size_tree
from edgespec.decoding.tree import DraftTree

#: this 2-core CPU, Qwen2.5-1.5B, 2 threads (calibration cache)
CPU = Calibration.from_costs({1: 1.0, 2: 1.69, 3: 2.17, 4: 2.58, 5: 3.09, 6: 3.92, 7: 4.43,
                              8: 6.17, 12: 7.40, 16: 6.99}, 0.05)
FLAT = Calibration.linear(0.02)  # GPU-like: a position costs 2% of a step

# the first token is a coin toss between two continuations, each then near certain
COIN = DraftTree.from_paths([(1, 2, 3, 4), (5, 6, 7, 8)],
                            [(0.5, 0.48, 0.46, 0.44), (0.45, 0.43, 0.41, 0.39)])


def test_flat_curve_verifies_both_branches():
    plan = size_tree(COIN, FLAT, max_nodes=15)
    assert plan.is_tree and plan.tree == COIN
    assert plan.expected == pytest.approx(1 + sum(COIN.confidence))
    assert plan.goodput > 1.05 * plan.linear_goodput


def test_the_measured_cpu_curve_keeps_the_linear_draft():
    # the controller chose 4 tokens of the first branch: the tree does not beat that here
    plan = size_tree(COIN, CPU, max_nodes=15, linear_k=4)
    assert not plan.is_tree
    assert plan.tree == plan.linear and plan.tree.tokens == (1, 2, 3, 4)
    # left to itself the sizing would not even draft: 1.5 tokens for 1.69 steps
    plain = size_tree(COIN, CPU, max_nodes=15)
    assert plain.tree.width == 0 and plain.expected == 1.0 and plain.cost == 1.0


@pytest.mark.parametrize("p1, p2", [(0.55, 0.44), (0.8, 0.15), (0.5, 0.5)])
def test_two_single_token_branches_are_priced_by_the_curve(p1, p2):
    t = DraftTree.from_paths([(1,), (2,)], [(p1,), (p2,)])
    plan = size_tree(t, CPU, max_nodes=15, linear_k=1)
    tree_g = (1 + p1 + p2) / CPU.cost(3)
    lin_g = (1 + p1) / CPU.cost(2)
    assert plan.is_tree == (tree_g > 1.05 * lin_g)
    assert plan.goodput == pytest.approx(tree_g if plan.is_tree else lin_g)


def test_linear_k_and_max_nodes_are_respected():
    plan = size_tree(COIN, FLAT, max_nodes=3, linear_k=2)
    assert len(plan.tree) <= 3
    assert plan.linear.tokens == (1, 2)
    assert size_tree(COIN, FLAT, max_nodes=0).tree.width == 0


def test_chains_never_become_trees():
    chain = DraftTree.chain([1, 2, 3], [0.9, 0.8, 0.7])
    assert not size_tree(chain, FLAT, max_nodes=15).is_tree


def test_node_probabilities_never_rise_along_a_path():
    t = DraftTree.from_paths([(1, 2), (3,)], [(0.4, 0.9), (1.7,)])
    assert node_probabilities(t) == (0.4, 0.4, 1.0)
    assert node_probabilities(DraftTree.chain([1, 2])) == (0.0, 0.0)


def test_subtrees_keep_the_most_probable_nodes_prefix_closed():
    t = DraftTree.from_paths([(1, 2, 3), (4, 5), (6,)], [(0.9, 0.85, 0.1), (0.5, 0.45), (0.05,)])
    plan = size_tree(t, Calibration.linear(0.0), max_nodes=4, min_gain=0.0)
    assert sorted(plan.tree.tokens) == [1, 2, 4, 5]


def test_max_width_bounds_the_branches():
    t = DraftTree.from_paths([(1, 2), (3, 4), (5, 6), (7,)],
                             [(0.3, 0.3), (0.25, 0.25), (0.2, 0.2), (0.2,)])
    for w in (1, 2, 3, 4):
        plan = size_tree(t, Calibration.linear(0.0), max_nodes=15, min_gain=0.0, max_width=w)
        assert plan.tree.width <= w
    assert size_tree(t, Calibration.linear(0.0), max_nodes=15, min_gain=0.0,
                     max_width=2).tree.tokens == (1, 2, 3, 4)
