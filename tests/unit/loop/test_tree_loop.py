"""Draft trees in the request loop, on the fake backend: the greedy output is the plain
path's whichever branch the target takes, the KV cache holds exactly what was emitted,
the scratch sequences end empty, and the tree metrics count what happened. Trees run
only where the engine set scratch sequences aside and the curve makes them pay."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.control import ControlSettings
from edgespec.api.events import Finished, Step
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.proposers import Draft
from edgespec.decoding.tree import DraftTree
from fakes import BOS, FakeModel, fake_engine
from fakes.backend import A
from fakes.proposers import wrong_token

FLAT = Calibration.linear(0.02, step_seconds=0.02)  # extra positions nearly free
CPU = Calibration.from_costs({1: 1.0, 2: 1.69, 3: 2.17, 4: 2.58, 5: 3.09, 6: 3.92, 7: 4.43,
                              8: 6.17, 12: 7.40, 16: 6.99}, 0.05)


@dataclass
class BranchySession:
    """Every other step its linear draft starts with a wrong token; its tree always holds
    the right continuation, first or second."""

    model: FakeModel
    history: list[int]
    step: int = 0
    trees: list[DraftTree] = field(default_factory=list)

    def _paths(self, k):
        right = self.model.greedy(self.history, k)
        wrong = [wrong_token(right[0]), *self.model.greedy(self.history, k)[1:]]
        return (right, wrong) if self.step % 2 == 0 else (wrong, right)

    def propose(self, k: int) -> Draft:
        first, _ = self._paths(min(k, 3))
        return Draft(tokens=tuple(first), confidence=(0.5,) * len(first), source="branchy")

    def propose_tree(self, k: int, max_children: int) -> DraftTree:
        first, second = self._paths(min(3, k // 2))
        tree = DraftTree.from_paths([first, second], [(0.5,) * len(first), (0.45,) * len(second)])
        self.trees.append(tree)
        return tree

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        self.history.extend(int(t) for t in tokens)
        self.step += 1

    def close(self, completed: bool) -> None:
        pass


class Branchy:
    name, costly = "branchy", False

    def __init__(self, model):
        self.model, self.sessions = model, []

    def open(self, prompt_tokens, sampling):
        s = BranchySession(self.model, list(prompt_tokens))
        self.sessions.append(s)
        return s

    def close(self):
        pass


def engine(cal, tree_seqs=(1, 2), parallel=3):
    model = FakeModel()
    prop = Branchy(model)
    eng = fake_engine(model, {"branchy": prop}, calibration=cal, parallel=parallel,
                      control=ControlSettings(adaptive=True))
    eng.loop.tree_seqs = tree_seqs  # what the engine would set aside for branches
    return eng, prop


def run(eng, params):
    events = list(eng.stream("a", params))
    fin = events[-1]
    assert isinstance(fin, Finished)
    return events, fin


def plain_tokens(n):
    eng = fake_engine(FakeModel(), {})
    return run(eng, GenerationParams(chat=False, max_tokens=n))[1].tokens


def test_greedy_tree_output_is_the_plain_path():
    eng, prop = engine(FLAT)
    events, fin = run(eng, GenerationParams(chat=False, max_tokens=40))
    assert fin.tokens == plain_tokens(40)
    s = fin.stats
    assert s.tree_passes > 3
    assert 0 < s.branch_utilisation < 1  # some paths left the first branch, some did not
    assert s.tree_path_length > 1
    # the KV cache holds the prompt and every emitted token but the pending one; the
    # scratch sequences were released
    assert fin.stop_reason == "length"
    assert eng.ctx.tokens(0) == [BOS, A, *fin.tokens[:-1]]
    assert eng.ctx.tokens(1) == [] and eng.ctx.tokens(2) == []
    assert "tree" in eng.ctx.calls
    # steps report the tree's nodes as drafted
    tree_steps = [e for e in events if isinstance(e, Step) and e.drafted >= 4]
    assert tree_steps


def test_sampling_with_trees_emits_plain_sampling_tokens_for_point_mass_trees():
    """Point-mass trees draw one uniform per emitted token: the same seed gives the plain
    path's sample, token for token (verify.verify_tree_sampling)."""
    params = GenerationParams(chat=False, max_tokens=40,
                              sampling=SamplingParams(temperature=1.0, seed=3))
    eng, prop = engine(FLAT)
    _, fin = run(eng, params)
    ref = run(fake_engine(FakeModel(), {}), params)[1]
    assert fin.tokens == ref.tokens
    assert fin.stats.tree_passes > 0


def test_no_scratch_sequences_no_trees():
    eng, prop = engine(FLAT, tree_seqs=(), parallel=1)
    _, fin = run(eng, GenerationParams(chat=False, max_tokens=30))
    assert fin.tokens == plain_tokens(30)
    assert fin.stats.tree_passes == 0 and "tree" not in eng.ctx.calls


def test_the_cpu_curve_keeps_linear_drafts():
    eng, prop = engine(CPU)
    _, fin = run(eng, GenerationParams(chat=False, max_tokens=30))
    assert fin.tokens == plain_tokens(30)
    assert fin.stats.tree_passes == 0 and "tree" not in eng.ctx.calls


def test_a_prior_curve_sizes_no_trees():
    eng, prop = engine(Calibration.prior_cpu())
    _, fin = run(eng, GenerationParams(chat=False, max_tokens=30))
    assert fin.tokens == plain_tokens(30)
    assert fin.stats.tree_passes == 0


def test_a_failed_tree_pass_releases_the_scratch_sequences():
    eng, prop = engine(FLAT)
    ctx = eng.ctx
    real = ctx.decode_tree

    def failing(*a):
        real(*a)
        raise RuntimeError("decode failed")

    ctx.decode_tree = failing
    with pytest.raises(RuntimeError, match="decode failed"):
        run(eng, GenerationParams(chat=False, max_tokens=40))
    assert ctx.tokens(1) == [] and ctx.tokens(2) == []
    ctx.decode_tree = real
    _, fin = run(eng, GenerationParams(chat=False, max_tokens=40))  # the engine still serves
    assert fin.tokens == plain_tokens(40)
