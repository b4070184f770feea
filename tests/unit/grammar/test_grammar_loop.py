"""Constrained decoding in the engine loop, on the fake backend with a fake grammar (a finite
language; tests/fakes/grammar.py): the speculative path emits what the plain path emits, drafts
the grammar forbids never reach the target, forced literals are drafted at no proposer cost,
and a grammar that admits nothing ends the request or is refused, never ignored."""
from __future__ import annotations

import pytest

from edgespec.errors import InvalidInputError
from edgespec.api.params import GenerationParams, SamplingParams
from fakes import Decode, FakeModel, ScriptedProposer, fake_engine, fixed
from fakes.backend import E1
from fakes.grammar import constrain

#: any GBNF that parses: validation reads it, the fake grammar ignores it
GBNF = 'root ::= [a-z. !#]+'
WORDS = (b"bcd abc.", b"bcd ab!", b"bcd #!#!")


def params(**kw) -> GenerationParams:
    return GenerationParams(**{"chat": False, "max_tokens": 30, "grammar": GBNF, **kw})


def run(words, script=None, k=3, p=None, **kw):
    model = constrain(FakeModel(), *words)
    props = {} if script is None else {"scripted": ScriptedProposer(model, script)}
    eng = fake_engine(model, props, control=fixed(k), **kw)
    return eng, eng.generate("a", p or params())


def test_greedy_output_is_in_the_language_and_equal_on_both_paths():
    _, plain = run(WORDS)
    assert plain.text.encode() in WORDS and plain.stop_reason == "eos"
    # the model's own greedy text ("bcéd abcéd") leaves the language at "é": the grammar
    # chose the best admissible token there
    assert plain.text != FakeModel().detokenize(FakeModel().greedy([0, 3], 8)).decode()
    for script in ([3], [(1, 2)], [None, 2, (0, 3)], [8]):
        eng, spec = run(WORDS, script)
        assert (spec.text, spec.tokens, spec.stop_reason) == (plain.text, plain.tokens, "eos")


def test_drafts_the_grammar_forbids_never_reach_the_target():
    eng, fin = run(WORDS, [4])  # the unconstrained greedy draft runs into "é"
    verified = [t for c in eng.ctx.calls if isinstance(c, Decode) and c.pos0 > 2
                for t in c.tokens[1:]]
    assert verified and E1 not in verified
    drafted = [t for s in eng.proposers["scripted"].sessions for _, d in s.proposed for t in d]
    assert E1 in drafted  # the proposer did draft it: the cut happened before verification


def test_a_forced_literal_is_drafted_without_any_proposer_and_counted():
    words = (b"bcd abcd abcd.",)  # one word: everything after the first token is forced
    _, plain = run(words)
    eng, spec = run(words, [None])  # the proposer never drafts
    assert spec.text == plain.text == "bcd abcd abcd." and spec.stop_reason == "eos"
    st = spec.stats
    assert st.proposer_tokens["grammar"] > 0 and st.proposer_tokens.get("scripted", 0) == 0
    # fewer target passes than tokens: the plain path needs one per token
    assert st.verify_passes > 0
    assert st.verify_passes + st.plain_steps < plain.stats.plain_steps


def test_forced_drafting_respects_the_draft_limit():
    words = (b"bcd abcd abcd.",)
    eng, spec = run(words, [None], k=2)
    passes = [c for c in eng.ctx.calls if isinstance(c, Decode) and c.pos0 > 2]
    assert max(len(c.tokens) for c in passes) <= 3  # pending + at most 2 drafts


def test_sampling_with_point_mass_drafts_emits_the_plain_paths_tokens_for_a_seed():
    # point-mass verification draws one uniform per emitted token from the same masked
    # distribution as plain sampling (edgespec.decoding.verify), so one seed gives one text
    for seed in range(6):
        p = params(sampling=SamplingParams(temperature=1.0, seed=seed))
        _, plain = run(WORDS, p=p)
        _, spec = run(WORDS, [2, (1, 1)], p=p)
        assert plain.text.encode() in WORDS
        assert spec.tokens == plain.tokens


def test_nothing_admissible_ends_the_request_with_a_clear_stop_reason():
    # "~" is in no token of the fake vocabulary: after "b" nothing can follow
    for script in (None, [2]):
        _, fin = run((b"b~",), script)
        assert fin.text == "b" and fin.stop_reason == "grammar"


def test_a_grammar_with_no_admissible_first_token_is_refused_before_decoding():
    model = constrain(FakeModel(), b"~")
    eng = fake_engine(model, {})
    with pytest.raises(InvalidInputError, match="admits no token"):
        eng.stream("a", params())
    assert eng.ctx.calls == []


def test_max_tokens_before_the_grammar_completes_stops_at_length():
    _, fin = run((b"bcd abcd abcd.",), [None], p=params(max_tokens=4))
    assert fin.stop_reason == "length" and len(fin.tokens) == 4
