"""The engine loop (prefill, propose -> verify -> trim -> emit, cancel, stop strings) on the
fake backend: no llama.cpp, no pulled model, a deterministic table model whose KV cache
refuses any position the engine gets wrong (see tests/fakes/backend.py).

The fake model's greedy text from "a" is "bcéd abcéd abcéd ..." (é is two tokens); from
"x" it is "yz." and then an end-of-generation token.
"""
from __future__ import annotations

import threading

import pytest

from edgespec.control import ControlSettings
from edgespec.errors import ContextOverflowError, InvalidInputError, UnsupportedError
from edgespec.api.events import Control, Finished, PrefillDone, RequestStarted, Step
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.api.stats import MemorySink
from fakes import (BOS, CALIBRATION, EOG, EOS, Decode, FakeModel, KVMismatch, ScriptedProposer, Trim,
                   fake_engine, fixed)
from fakes.backend import (A, B, C, D, DOT, E1, E2, SPACE, Y, Z)

MIXED = [(1, 2), 3, None, (0, 1), 2, (2, 3), 1]


def greedy_text(n: int, prompt=(BOS, A)) -> str:
    m = FakeModel()
    return m.detokenize(m.greedy(list(prompt), n)).decode("utf-8")


def raw(**kw) -> GenerationParams:
    return GenerationParams(**{"chat": False, **kw})


def run(engine, prompt="a", params=None, **kw) -> tuple[list, Finished]:
    events = list(engine.stream(prompt, params or raw(), **kw))
    assert isinstance(events[-1], Finished) and not any(
        isinstance(e, Finished) for e in events[:-1])
    return events, events[-1]


def plain(prompt="a", params=None, **engine_kw) -> Finished:
    return run(fake_engine(FakeModel(), {}, **engine_kw), prompt, params)[1]


def speculative(script, prompt="a", params=None, k=3, **engine_kw):
    model = FakeModel()
    prop = ScriptedProposer(model, script)
    eng = fake_engine(model, {"scripted": prop}, control=fixed(k), **engine_kw)
    events, fin = run(eng, prompt, params)
    return eng, prop, events, fin


def steps(events) -> list[Step]:
    return [e for e in events if isinstance(e, Step)]


def assert_kv_holds_what_was_emitted(eng, prompt_tokens, fin):
    """Every emitted token but the pending last one sits in the KV cache, in order."""
    kv = eng.ctx.tokens()
    expect = [*prompt_tokens, *fin.tokens[:-1]]
    assert kv[:len(expect)] == expect
    if fin.stop_reason in ("length", "context"):
        assert kv == expect  # nothing rejected or past the end left behind


# --- greedy: speculative output is the plain output -----------------------------------------
@pytest.mark.parametrize("script", [[3], MIXED, [(0, 3)], [None], [6]])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_greedy_output_equals_the_plain_path(script, k):
    ref = plain(params=raw(max_tokens=30))
    eng, prop, events, fin = speculative(script, params=raw(max_tokens=30), k=k)
    assert fin.tokens == ref.tokens and fin.text == ref.text == greedy_text(30)
    assert fin.text == "bcéd abcéd abcéd abcéd abc"
    assert fin.stop_reason == "length" and len(fin.tokens) == 30
    assert "".join(s.text for s in steps(events)) == fin.text
    assert_kv_holds_what_was_emitted(eng, [BOS, A], fin)
    # the stats agree with what the target was actually asked to verify
    verify = [d for d in eng.ctx.decodes[1:] if len(d.tokens) > 1]
    assert fin.stats.drafted == sum(len(d.tokens) - 1 for d in verify)
    assert fin.stats.verify_passes == len(verify)
    assert fin.stats.generated_tokens == 30
    assert fin.stats.accepted == sum(s.accepted for s in steps(events))
    # the session saw every emitted token, and was closed as completed
    (session,) = prop.sessions
    assert session.history == [BOS, A, *fin.tokens] and session.closed is True


def test_all_right_drafts_are_all_accepted_and_all_wrong_ones_all_rejected():
    _, _, _, right = speculative([3], params=raw(max_tokens=13))
    assert right.stats.acceptance_rate == 1.0 and right.stats.plain_steps == 1  # the first token
    assert right.stats.accepted_length_hist == {1: 1, 4: 3}
    _, _, _, wrong = speculative([(0, 3)], params=raw(max_tokens=13))
    # one token a pass; each draft leaves room for the target's own token: 3 while 4 or
    # more remain, then 2, 1, and a plain step for the last
    assert wrong.stats.accepted == 0 and wrong.stats.drafted == 3 * 9 + 2 + 1
    assert wrong.stats.verify_passes == 11 and wrong.stats.plain_steps == 2
    assert wrong.tokens == right.tokens


# --- positions: what is decoded, trimmed and emitted, step by step ---------------------------
def test_verify_trim_and_emit_positions_step_by_step():
    eng, prop, events, fin = speculative([(1, 2), 3], params=raw(max_tokens=9), k=3)
    w1, w2 = 11, 12  # the two wrong tokens of the first draft: after "c" comes E1, not these
    assert eng.ctx.calls == [
        Trim(0, 0, ()),  # the request's sequence starts empty (not the whole context)
        Decode((BOS, A), 0, 0, "last"),  # prefill; its logits give the first token, b
        Decode((B, C, w1, w2), 2, 0, "all"),  # pending b + draft c ✓, w1 ✗ (target: E1), w2
        Trim(0, 4, (w1, w2)),  # b, c stay; the rejected drafts go
        Decode((E1, E2, D, SPACE), 4, 0, "all"),  # pending E1 + 3 right drafts; bonus a
        Decode((A, B), 8, 0, "all"),  # 7 emitted, 2 to go: a 1-token draft + its bonus
    ]
    got = [(s.tokens, s.origins, s.drafted, s.accepted, s.text) for s in steps(events)]
    assert got == [
        ((B,), ("target",), 0, 0, "b"),
        ((C, E1), ("draft", "target"), 3, 1, "c"),  # E1 alone is half a character
        ((E2, D, SPACE, A), ("draft",) * 3 + ("target",), 3, 3, "éd a"),
        ((B, C), ("draft", "target"), 1, 1, "bc"),
    ]
    assert fin.text == "bcéd abc" and fin.stop_reason == "length"
    assert [k for k, _ in prop.sessions[0].proposed] == [3, 3, 1]


def test_a_careless_proposer_drafting_past_k_is_cut_to_k():
    model = FakeModel()
    prop = ScriptedProposer(model, [6], ignore_k=True)
    eng = fake_engine(model, {"scripted": prop}, control=fixed(2))
    _, fin = run(eng, params=raw(max_tokens=7))
    assert fin.tokens == plain(params=raw(max_tokens=7)).tokens
    assert all(len(d.tokens) <= 3 for d in eng.ctx.decodes[1:])  # pending + at most k = 2


def test_the_fake_catches_a_trim_that_keeps_a_rejected_token():
    # the fake's strictness is what makes the other tests meaningful: an engine that trims
    # one position too late fails at its next decode
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [(1, 2)])}, control=fixed(3))
    real_trim = eng.ctx.trim
    # (the prefill's emptying of the sequence, at position 0, is left alone)
    eng.ctx.trim = lambda seq, pos: real_trim(seq, pos + 1 if pos else 0)
    with pytest.raises(KVMismatch, match="decoded twice"):
        run(eng, params=raw(max_tokens=10))


def test_the_fake_refuses_skipped_and_repeated_positions_and_trims_really_drop():
    ctx = FakeModel().new_context(n_ctx=8)
    ctx.decode([BOS, A], 0)
    with pytest.raises(KVMismatch, match="decoded twice"):
        ctx.decode([B], 1)
    with pytest.raises(KVMismatch, match="skipped"):
        ctx.decode([B], 3)
    ctx.decode([B, C, D], 2, logits="all")
    ctx.trim(0, 3)
    assert ctx.tokens() == [BOS, A, B]
    with pytest.raises(KVMismatch):
        ctx.trim(0, 4)
    # logits follow what the cache holds after the trim: after "ab" comes c
    assert int(ctx.decode([C], 3)[0].argmax()) == E1
    with pytest.raises(ContextOverflowError):
        ctx.decode([A] * 5, 4)


# --- end of generation ----------------------------------------------------------------------
@pytest.mark.parametrize("script", [[3], [6], MIXED, [None]])
def test_end_of_generation_inside_a_draft_ends_the_request_there(script):
    # greedy from "x": y z . </s>; the right drafts carry the EOG token and run past it
    eng, _, events, fin = speculative(script, prompt="x", params=raw(max_tokens=50), k=4)
    assert fin.tokens == (Y, Z, DOT) and fin.text == "yz." and fin.stop_reason == "eos"
    assert EOS not in [t for s in steps(events) for t in s.tokens]
    assert fin.tokens == plain("x", raw(max_tokens=50)).tokens
    # one decode per step (the prefill gives the first): none after the pass that met EOG
    assert len(eng.ctx.decodes) == len(steps(events))
    assert steps(events)[-1].tokens[-1:] in ((DOT,), ())


# --- max_tokens -----------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8])
def test_max_tokens_is_exact_and_no_pass_drafts_past_it(max_tokens):
    eng, _, events, fin = speculative([6], params=raw(max_tokens=max_tokens), k=4)
    assert len(fin.tokens) == max_tokens and fin.stop_reason == "length"
    assert fin.tokens == plain(params=raw(max_tokens=max_tokens)).tokens
    if max_tokens == 1:
        assert eng.ctx.decodes == [Decode((BOS, A), 0, 0, "last")]  # the prefill's token only
    emitted = 0
    for d, s in zip(eng.ctx.decodes, steps(events)):
        if d.pos0 > 0:  # a pass: pending + drafts, always leaving room for the target's token
            assert len(d.tokens) - 1 == min(4, max_tokens - emitted - 1)
        emitted += len(s.tokens)


def test_a_stop_inside_an_accepted_draft_cuts_the_step_there():
    # all drafts right; the stop "d a" completes on the third token of an accepted run
    eng, _, events, fin = speculative([4], params=raw(max_tokens=40, stop=("d a",)), k=4)
    assert fin.text == "bcé" and fin.stop_reason == "stop"
    assert fin.tokens == (B, C, E1, E2, D, SPACE, A)
    cut = steps(events)[-1]
    assert cut.tokens[-1] == A and cut.accepted == 4 and len(cut.tokens) < cut.accepted + 1


# --- stop strings across draft boundaries -----------------------------------------------------
STOPS = [("é",), ("cé",), ("d a",), ("bcéd abc",), ("zz", "d ab"), ("\xa9",)]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("script, k", [([3], 3), ([(1, 2)], 3), ([(2, 1), 1], 2), ([None], 1),
                                       ([5], 5)])
def test_stop_strings_across_draft_boundaries_never_leak(stop, script, k):
    greedy = greedy_text(23)
    cut = min(i for i in (greedy.find(s) for s in stop) if i >= 0) if any(
        s in greedy for s in stop) else None
    eng, _, events, fin = speculative(script, params=raw(max_tokens=23, stop=stop), k=k)
    ref = plain(params=raw(max_tokens=23, stop=stop))
    assert (fin.text, fin.tokens, fin.stop_reason) == (ref.text, ref.tokens, ref.stop_reason)
    if cut is None:
        assert fin.stop_reason == "length" and fin.text == greedy
    else:
        assert fin.stop_reason == "stop" and fin.text == greedy[:cut]
    streamed = ""
    for s in steps(events):
        streamed += s.text
        assert fin.text.startswith(streamed), f"{streamed!r} leaked past {fin.text!r}"
        assert not any(x in streamed for x in stop)
    assert streamed == fin.text


# --- the context window -----------------------------------------------------------------------
@pytest.mark.parametrize("script", [[3], MIXED, [None]])
def test_a_full_context_ends_the_request_with_every_position_used(script):
    eng, _, events, fin = speculative(script, params=raw(max_tokens=500), k=3, n_ctx=20)
    assert fin.stop_reason == "context"
    # every evaluated token holds a KV slot; the last emitted one never needed one
    assert 2 + len(fin.tokens) - 1 == 20
    assert eng.ctx.tokens() == [BOS, A, *fin.tokens[:-1]]
    assert fin.tokens == plain(params=raw(max_tokens=500), n_ctx=20).tokens


def test_a_prompt_that_leaves_no_room_is_refused_before_decoding():
    eng = fake_engine(FakeModel(), {}, n_ctx=4)
    with pytest.raises(ContextOverflowError, match="raise --ctx"):
        eng.stream("abcd", raw())
    assert eng.ctx.calls == []


# --- cancel ---------------------------------------------------------------------------------
def test_cancel_from_another_thread_ends_at_the_next_step_boundary():
    model = FakeModel()
    prop = ScriptedProposer(model, [3])
    eng = fake_engine(model, {"scripted": prop})
    it = eng.stream("a", raw(max_tokens=200))
    seen = []
    for ev in it:
        seen.append(ev)
        if isinstance(ev, Step):
            break
    n_decodes = len(eng.ctx.decodes)
    t = threading.Thread(target=eng.cancel)
    t.start()
    t.join()
    rest = list(it)
    assert len(rest) == 1 and isinstance(rest[0], Finished)
    assert rest[0].stop_reason == "cancelled" and rest[0].tokens == (B,)
    assert len(eng.ctx.decodes) == n_decodes  # nothing decoded after the cancel
    assert prop.sessions[0].closed is False  # closed, as not completed
    # the next request starts clean
    assert eng.generate("a", raw(max_tokens=4)).stop_reason == "length"


def test_cancel_while_a_pass_is_running_on_a_worker_thread():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, MIXED)}, n_ctx=4096)
    reached, go = threading.Event(), threading.Event()

    def hold(ctx, tokens, pos0):
        if len(ctx.decodes) == 3:  # the fourth decode: prefill and two passes done
            reached.set()
            assert go.wait(10)

    eng.ctx.on_decode = hold
    out: list = []
    worker = threading.Thread(target=lambda: out.append(eng.generate("a", raw(max_tokens=3000))))
    worker.start()
    assert reached.wait(10)
    eng.cancel()
    go.set()
    worker.join(10)
    assert not worker.is_alive()
    (r,) = out
    assert r.stop_reason == "cancelled"
    assert len(eng.ctx.decodes) == 4  # the running pass finished; no other began
    assert 1 < len(r.tokens) < 3000


# --- API defaults -----------------------------------------------------------------------------
def test_stream_with_params_omitted_uses_the_defaults(fake_model):
    eng = fake_engine(fake_model, {}, n_ctx=512)
    events = list(eng.stream("a"))  # chat template on, max_tokens 256
    assert isinstance(events[0], RequestStarted) and isinstance(events[1], PrefillDone)
    fin = events[-1]
    assert isinstance(fin, Finished) and fin.stop_reason == "length"
    assert len(fin.tokens) == GenerationParams().max_tokens
    # the chat template wrapped the prompt: "<s>a\n\n" and greedy after "\n" is "a"
    assert fin.text.startswith("abcéd ")
    assert eng.generate("a").tokens == fin.tokens


def test_a_grammar_that_does_not_parse_is_refused_before_anything_is_decoded(fake_model):
    # constrained decoding itself: tests/unit/grammar/test_grammar_loop.py
    eng = fake_engine(fake_model, {})
    with pytest.raises(InvalidInputError, match="grammar"):
        eng.stream("a", raw(grammar='root ::= "a'))
    assert eng.ctx.calls == []


# --- sampling ---------------------------------------------------------------------------------
#: the fake model ends a sampled text after ~20 tokens on average; banning its EOG tokens
#: keeps every sampled request 40 tokens long
NO_EOG = tuple((t, float("-inf")) for t in sorted(EOG))


def sampled(seed, script=None, max_tokens=40, logit_bias=NO_EOG):
    p = raw(max_tokens=max_tokens, sampling=SamplingParams(temperature=1.0, seed=seed,
                                                           logit_bias=logit_bias))
    if script is None:
        return plain(params=p)
    return speculative(script, params=p, k=3)[3]


def test_sampling_with_a_seed_is_reproducible():
    a, b, other = sampled(7), sampled(7), sampled(8)
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != other.tokens
    assert len(a.tokens) == 40 and a.text != greedy_text(40)  # really sampled
    assert sampled(7, MIXED).tokens == sampled(7, MIXED).tokens


@pytest.mark.parametrize("seed", [1, 7, 11])
def test_point_mass_drafts_sample_exactly_the_plain_path_tokens(seed):
    # drafts without a distribution are verified by drawing y ~ p and accepting iff y == x,
    # one uniform per emitted token as in plain sampling: the same seed gives the same text
    assert sampled(seed, MIXED).tokens == sampled(seed).tokens
    assert sampled(seed, [3]).tokens == sampled(seed).tokens
    # with EOG allowed too: the same early end on both paths
    free = sampled(seed, MIXED, logit_bias=())
    assert free.tokens == sampled(seed, logit_bias=()).tokens


# --- several proposers, adaptive control, sinks, logprobs -----------------------------------
def test_every_free_session_sees_every_step_and_only_the_chosen_one_gets_credit():
    model = FakeModel()
    first = ScriptedProposer(model, [(1, 1)], name="first")
    second = ScriptedProposer(model, [3], name="second")
    eng = fake_engine(model, {"first": first, "second": second}, control=fixed(2))
    _, fin = run(eng, params=raw(max_tokens=12))
    assert fin.tokens == plain(params=raw(max_tokens=12)).tokens
    s1, s2 = first.sessions[0], second.sessions[0]
    assert s1.history == s2.history == [BOS, A, *fin.tokens]
    assert len(s1.proposed) == len(s2.proposed) > 0  # both consulted every step
    # the fixed controller drafts with the first; the second's candidates are never credited
    assert all(n == 0 for _, n in s2.accepted) and any(n > 0 for _, n in s1.accepted)


def test_adaptive_control_on_a_fixed_calibration_keeps_the_plain_output():
    model = FakeModel()
    prop = ScriptedProposer(model, MIXED)
    eng = fake_engine(model, {"scripted": prop}, control=ControlSettings(max_draft=6))
    events, fin = run(eng, params=raw(max_tokens=60))
    assert eng.calibration() is CALIBRATION  # nothing measured
    assert fin.tokens == plain(params=raw(max_tokens=60)).tokens
    assert fin.stats.drafted > 0
    assert all(e.request_id == fin.request_id for e in events if isinstance(e, Control))


def test_sinks_receive_the_finished_stats_and_logprobs_match_the_plain_path():
    sink = MemorySink()
    eng, _, _, fin = speculative(MIXED, params=raw(max_tokens=10, logprobs=2), sinks=[sink])
    assert sink.records == [fin.stats]
    ref = plain(params=raw(max_tokens=10, logprobs=2))
    assert [lp.token for lp in fin.logprobs] == list(fin.tokens)
    assert [(lp.token, lp.top[0][0]) for lp in fin.logprobs] == \
        [(lp.token, lp.top[0][0]) for lp in ref.logprobs]
    assert [lp.logprob for lp in fin.logprobs] == pytest.approx([lp.logprob for lp in ref.logprobs])


# --- exact mode: verify passes stay within the probed cap -------------------------------------
@pytest.fixture
def probed_cap(monkeypatch):
    """Stand in for the device probe (calibration.exact_cap measures a real model)."""
    from edgespec.calibration import cache as calibration

    def set_cap(cap: int) -> None:
        monkeypatch.setattr(calibration, "exact_cap", lambda model, kernel, n_threads: cap)
    return set_cap


def test_exact_mode_refuses_a_fixed_draft_longer_than_the_cap(probed_cap):
    probed_cap(2)
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3])}, control=fixed(3),
                      exact=True)
    with pytest.raises(UnsupportedError, match="--max-draft 2 or less"):
        eng.stream("a", raw())
    assert eng.ctx.calls == []
    # the same engine without exactness for this request runs the 3-token drafts
    _, fin = run(eng, params=raw(max_tokens=9), exact=False)
    assert max(len(d.tokens) for d in eng.ctx.decodes[1:]) == 4


def test_exact_mode_keeps_adaptive_passes_within_the_cap(probed_cap):
    probed_cap(2)
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [6])},
                      control=ControlSettings(max_draft=6), exact=True)
    _, fin = run(eng, params=raw(max_tokens=40))
    assert fin.tokens == plain(params=raw(max_tokens=40)).tokens
    passes = [d for d in eng.ctx.decodes[1:]]
    assert max(len(d.tokens) for d in passes) <= 3  # pending + at most 2 drafts
    assert fin.stats.drafted > 0


@pytest.mark.parametrize("control", [ControlSettings(max_draft=6), fixed(3)])
def test_exact_mode_without_an_exact_batch_only_runs_the_plain_path(probed_cap, control):
    probed_cap(0)
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3])}, control=control,
                      exact=True)
    with pytest.raises(UnsupportedError, match="cannot speculate"):
        eng.stream("a", raw())
    _, fin = run(eng, params=raw(max_tokens=5), proposer="none")
    assert fin.tokens == plain(params=raw(max_tokens=5)).tokens


# --- fresh proposer instances for benchmarks (issue 12: no cross-configuration learning) ---
def test_a_cloned_proposer_is_a_fresh_instance_with_the_engine_options():
    from edgespec.proposers import free_proposer

    model = FakeModel()
    eng = fake_engine(model, {"suffix": free_proposer("suffix", factor=3.0)},
                      control=ControlSettings(max_draft=6))
    eng.proposer_options["suffix"] = {"factor": 3.0}
    name = eng.clone_proposer("suffix", "cfg/suffix", min_token_prob=0.2)
    clone = eng.proposers[name]
    assert clone is not eng.proposers["suffix"]
    assert (clone.factor, clone.min_token_prob) == (3.0, 0.2)
    # what the original learnt across requests is not in the clone
    eng.generate("a b a b", raw(max_tokens=6), proposer="suffix")
    assert eng.proposers["suffix"].global_tree.num_sequences >= 1
    assert clone.global_tree.num_sequences == 0
    with pytest.raises(InvalidInputError, match="not loaded"):
        eng.clone_proposer("ngram", "x")
    with pytest.raises(InvalidInputError, match="already loaded"):
        eng.clone_proposer("suffix", "cfg/suffix")
