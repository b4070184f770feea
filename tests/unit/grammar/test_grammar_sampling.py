"""Sampling under a grammar with a draft that carries its distributions (a draft model):
the emitted token is distributed as the grammar-masked target, even when the draft
proposes a token the grammar forbids. Cutting such a token away instead of rejecting it
is a measurable bias; this test shows the check catches it."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.grammar import state as grammar
from edgespec.control import truncate
from edgespec.grammar.constraint import Constraint
from edgespec.grammar.state import GrammarState
from edgespec.api.params import SamplingParams
from edgespec.proposers import Draft
from edgespec.lab.analysis.stattests import goodness_of_fit
from fakes import BOS, FakeModel
from fakes.backend import A, AB, B, C, N_VOCAB, X
from fakes.grammar import constrain

ADMISSIBLE = (A, B, C, AB)
PARAMS = SamplingParams(temperature=1.0)


def setup():
    model = constrain(FakeModel(), b"a", b"b", b"c", b"ab")
    state = GrammarState.open(Constraint(kind="grammar", gbnf='root ::= "a"'), model)
    row = model.row([BOS])
    masked = np.full(N_VOCAB, -np.inf)
    masked[list(ADMISSIBLE)] = row[list(ADMISSIBLE)]
    p = np.exp(masked - masked.max())
    p /= p.sum()
    # the draft's own distribution: mostly a token the grammar forbids
    q = np.zeros(N_VOCAB)
    q[X], q[B], q[C] = 0.6, 0.2, 0.2
    return model, state, p, q


def emitted(cutter, n: int, seed: int) -> np.ndarray:
    model, state, p, q = setup()
    rng = np.random.default_rng(seed)
    counts = np.zeros(N_VOCAB, dtype=int)
    for _ in range(n):
        d = int(rng.choice(N_VOCAB, p=q))  # the draft samples its token from q
        draft = cutter(state, Draft(tokens=(d,), probs=q[None, :].copy()))
        rows = np.stack([model.row([BOS]), model.row([BOS, d])])
        k, nxt, after = grammar.verify(state, draft, rows, [BOS], PARAMS, rng)
        after.close()
        counts[d if k == 1 else nxt] += 1
    return counts


def test_a_sampled_draft_keeps_its_inadmissible_token_and_the_output_follows_the_masked_target():
    _, state, p, _ = setup()
    counts = emitted(lambda st, dr: grammar.cut(st, dr, greedy=False), 3000, seed=1)
    assert counts[X] == 0 and counts.sum() == 3000
    fit = goodness_of_fit(counts[list(ADMISSIBLE)], p[list(ADMISSIBLE)])
    assert fit.p_value > 1e-3, fit


def test_cutting_the_inadmissible_token_away_is_caught_as_a_bias():
    _, _, p, _ = setup()
    naive = lambda st, dr: truncate(dr, st.admissible_prefix(dr.tokens))  # noqa: E731
    counts = emitted(naive, 3000, seed=2)
    fit = goodness_of_fit(counts[list(ADMISSIBLE)], p[list(ADMISSIBLE)])
    assert fit.p_value < 1e-6, fit


@pytest.mark.parametrize("greedy,probs,kept", [(True, True, 0), (False, False, 0),
                                               (False, True, 1)])
def test_cut_keeps_the_first_forbidden_token_only_for_sampled_drafts(greedy, probs, kept):
    _, state, _, q = setup()
    d = Draft(tokens=(X, A), probs=np.stack([q, q]) if probs else None)
    assert len(grammar.cut(state, d, greedy)) == kept
    ok = Draft(tokens=(A,), probs=q[None, :] if probs else None)
    assert len(grammar.cut(state, ok, greedy)) == 1
