"""Prefix reuse across requests on the fake backend, whose KV cache refuses any position the
engine gets wrong: a reused prefix, a trimmed tail and the decoded suffix must line up
exactly, through cancellation, stops inside accepted drafts and abandoned streams.

Raw prompts built from "#" keep tokenization stable ("#" generates "!#!#..."); prompts with
"a" show a retokenized answer ("a" + "b" becomes the one token "ab") limiting the reuse.

Most requests here are unseeded samples, which reuse every held position; a greedy or seeded
request reuses only what a prefill wrote (the tests at the end).
"""
from __future__ import annotations


import pytest

from edgespec.api.events import Finished, Step
from edgespec.decoding.kvcache import StateCache, common_prefix
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.proposers.draft import DraftModelProposer
from fakes import BOS, Decode, FakeModel, ScriptedProposer, fake_engine, fixed
from fakes.backend import A, AB, BANG, HASH, Trim
from fakes.stateful import StatefulModel


#: an unseeded sample promises no text, so it reuses every held position, the answers' too
#: (edgespec.decoding.kvcache); at this temperature the fake's PEAK (a margin over 1 logit)
#: makes its text greedy's, all but e^-20 of the time
ANY_TEXT = SamplingParams(temperature=0.05)


def raw(**kw) -> GenerationParams:
    return GenerationParams(**{"chat": False, "sampling": ANY_TEXT, **kw})


def fresh(prompt, params, model_cls=FakeModel, **kw):
    return fake_engine(model_cls(), {}, **kw).generate(prompt, params)


def test_common_prefix():
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 9, 3], [1, 2, 3]) == 1


def test_a_continued_conversation_prefills_only_the_new_suffix():
    eng = fake_engine(FakeModel(), {})
    p = raw(max_tokens=6)
    r1 = eng.generate("#", p, reuse=True)
    assert r1.text == "!#!#!#" and r1.stats.prompt_reused == 0
    n_before = len(eng.ctx.decodes)
    prompt2 = "#" + r1.text + "#!"
    r2 = eng.generate(prompt2, p, reuse=True)
    # held: BOS # and the first five generated tokens (the sixth was pending, never decoded)
    assert r2.stats.prompt_reused == 7 and r2.stats.prompt_computed == 3
    assert r2.stats.prompt_tokens == 10
    # the pending "#" of request 1 and the new "#!"
    assert eng.ctx.decodes[n_before] == Decode((HASH, HASH, BANG), 7, 0, "last")
    assert Trim(0, 0, ()) not in eng.ctx.calls[eng.ctx.calls.index(eng.ctx.decodes[n_before]) - 1:]
    assert r2.tokens == fresh(prompt2, p).tokens
    assert "prompt_reused" in r2.stats.to_dict() and "7 reused" in r2.stats.summary()


def test_the_last_prompt_token_is_always_decoded():
    eng = fake_engine(FakeModel(), {})
    p = raw(max_tokens=4)
    r1 = eng.generate("#!#!#", p, reuse=True)
    r2 = eng.generate("#!#!#", p, reuse=True)  # every prompt token is held
    assert r2.stats.prompt_reused == 5 and r2.stats.prompt_computed == 1
    assert r2.tokens == r1.tokens
    # a prompt that is a strict prefix of what is held: the tail is trimmed
    r3 = eng.generate("#!#", p, reuse=True)
    assert r3.stats.prompt_reused == 3 and r3.tokens == fresh("#!#", p).tokens


def test_reuse_stops_at_the_first_retokenized_token():
    eng = fake_engine(FakeModel(), {})
    p = raw(max_tokens=5)
    r1 = eng.generate("a", p, reuse=True)  # "bcéd " after "a": held BOS a b c é é
    r2 = eng.generate("a" + r1.text + "x", p, reuse=True)  # tokenizes as BOS ab c ...
    assert eng.target.tokenize("a" + r1.text + "x")[1] == AB
    assert r2.stats.prompt_reused == 1
    assert r2.tokens == fresh("a" + r1.text + "x", p).tokens


def test_without_reuse_every_prompt_is_prefilled_from_an_empty_sequence():
    eng = fake_engine(FakeModel(), {})
    p = raw(max_tokens=4)
    eng.generate("#!", p)
    eng.generate("#!", p)
    # the sequence is emptied, not the whole context (other sequences may be serving)
    assert "clear" not in eng.ctx.calls
    assert [c.from_pos for c in eng.ctx.trims if c.from_pos == 0] == [0, 0]
    assert [d.pos0 for d in eng.ctx.decodes if len(d.tokens) == 3] == [0, 0]


@pytest.mark.parametrize("script", [[3], [(1, 2)], [(0, 3), 2]])
def test_speculative_turns_with_reuse_equal_fresh_prefills(script):
    model = FakeModel()
    eng = fake_engine(model, {"s": ScriptedProposer(model, script)}, control=fixed(3))
    p = raw(max_tokens=11)
    prompt = "#"
    for _ in range(4):
        r = eng.generate(prompt, p, reuse=True)
        assert r.tokens == fresh(prompt, p).tokens
        prompt = prompt + r.text + "#"
    assert r.stats.prompt_reused > 30


def test_a_stop_inside_an_accepted_draft_leaves_no_drafted_position_behind():
    model = FakeModel()
    eng = fake_engine(model, {"s": ScriptedProposer(model, [3])}, control=fixed(3))
    p = raw(max_tokens=20, stop=("#!#!#",))
    r1 = eng.generate("#", p, reuse=True)
    assert r1.stop_reason == "stop"
    held = eng.ctx.tokens()
    assert held == eng.kv_cache.held  # what the engine believes is what the cache holds
    r2 = eng.generate("#" + r1.text + "!", raw(max_tokens=5), reuse=True)
    assert r2.tokens == fresh("#" + r1.text + "!", raw(max_tokens=5)).tokens


def test_a_cancelled_turn_leaves_a_state_the_next_turn_continues_correctly():
    model = FakeModel()
    eng = fake_engine(model, {"s": ScriptedProposer(model, [(2, 1)])}, control=fixed(3))
    p = raw(max_tokens=40)
    seen = []
    for ev in eng.stream("#", p, reuse=True):
        if isinstance(ev, Step) and ev.tokens:
            seen.append(ev)
            if len(seen) == 3:
                eng.cancel()
        if isinstance(ev, Finished):
            assert ev.stop_reason == "cancelled"
            text = ev.text
    assert eng.ctx.tokens() == eng.kv_cache.held
    r = eng.generate("#" + text + "#", raw(max_tokens=8), reuse=True)
    assert r.stats.prompt_reused >= len(text)
    assert r.tokens == fresh("#" + text + "#", raw(max_tokens=8)).tokens


def test_an_abandoned_stream_leaves_a_consistent_cache():
    eng = fake_engine(FakeModel(), {})
    it = eng.stream("#", raw(max_tokens=30), reuse=True)
    for ev in it:
        if isinstance(ev, Step) and len(eng.ctx.tokens()) > 6:
            break
    it.close()
    assert eng.ctx.tokens() == eng.kv_cache.held
    r = eng.generate("#!#!#!", raw(max_tokens=4), reuse=True)
    assert r.stats.prompt_reused >= 5 and r.tokens == fresh("#!#!#!", raw(max_tokens=4)).tokens


def test_a_failed_decode_forgets_what_the_cache_held():
    eng = fake_engine(FakeModel(), {})
    eng.generate("#!#!", raw(max_tokens=4), reuse=True)

    def boom(ctx, toks, pos0):
        raise RuntimeError("device lost")

    eng.ctx.on_decode = boom
    with pytest.raises(RuntimeError):
        eng.generate("#!#!#", raw(max_tokens=4), reuse=True)
    eng.ctx.on_decode = None
    assert eng.kv_cache.held == eng.ctx.tokens()
    r = eng.generate("#!#!#", raw(max_tokens=4), reuse=True)
    assert r.tokens == fresh("#!#!#", raw(max_tokens=4)).tokens


# --- the RAM state cache ---------------------------------------------------------------------
def conversation(seed: str, turns: int) -> list[str]:
    return [seed * (i + 12) for i in range(turns)]


def test_switching_conversations_restores_the_earlier_one_from_ram():
    eng = fake_engine(StatefulModel(), {}, n_ctx=512)
    p = raw(max_tokens=8)
    a = "#!" * 20
    ra = eng.generate(a, p, reuse=True)
    b = "." + "#!" * 20  # shares only BOS with a
    eng.generate(b, p, reuse=True)
    assert len(eng.kv_cache.ram) == 1  # a's state was saved before b replaced it
    a2 = a + ra.text + "#"
    r = eng.generate(a2, p, reuse=True)
    assert "restore" in eng.ctx.calls
    assert r.stats.prompt_reused == len(eng.target.tokenize(a)) + 7
    assert r.tokens == fresh(a2, p).tokens
    assert eng.ctx.tokens() == eng.kv_cache.held


def test_a_refused_state_is_dropped_and_the_prompt_prefilled():
    eng = fake_engine(StatefulModel(), {}, n_ctx=512)
    p = raw(max_tokens=4)
    a = "#!" * 20
    eng.generate(a, p, reuse=True)
    eng.generate("." + a, p, reuse=True)

    def refuse(state, seq_id=0):
        from edgespec.errors import EdgespecError
        raise EdgespecError("refused")

    eng.ctx.state_set = refuse
    r = eng.generate(a + "#", p, reuse=True)
    # the working sequence was given up for the restore: nothing is reused, a's entry is gone
    assert r.stats.prompt_reused == 0 and len(eng.kv_cache.ram) == 1
    assert eng.kv_cache.ram.entries()[0].tokens[1] == eng.target.tokenize(".")[1]
    assert r.tokens == fresh(a + "#", p).tokens


def test_the_state_cache_stays_within_its_budget_under_a_long_conversation():
    budget = 1200
    eng = fake_engine(StatefulModel(), {}, n_ctx=4096, n_batch=512, kv_cache_ram=budget)
    assert eng.kv_cache.ram.budget_bytes == budget
    p = raw(max_tokens=6)
    prompts = {c: c + "#!" * 10 for c in ".#!"}
    for turn in range(12):
        for c in ".#!":  # three conversations interleaved, each growing every turn
            r = eng.generate(prompts[c], p, reuse=True)
            assert r.tokens == fresh(prompts[c], p, n_ctx=4096, n_batch=512).tokens
            prompts[c] = prompts[c] + r.text + "#!"
            assert eng.kv_cache.ram.nbytes <= budget
            assert eng.kv_cache.ram.nbytes == sum(e.nbytes for e in eng.kv_cache.ram.entries())
    assert eng.kv_cache.ram.evictions > 0


def test_state_cache_lru_and_dominated_entries():
    c = StateCache(budget_bytes=100)
    t = list(range(20))
    assert c.put(t, b"x" * 40)
    assert c.put(t + [99, 98], b"y" * 40)  # the same conversation, one turn later
    assert len(c) == 1 and c.nbytes == 40
    assert not c.put(t, b"z" * 40)  # an older turn of a kept conversation adds nothing
    assert c.put([7] * 20, b"w" * 40)
    c.best(t + [99])  # touches the first conversation
    assert c.put([8] * 20, b"v" * 40)  # evicts [7]*20, the least recently used
    assert [e.tokens[0] for e in c.entries()] == [0, 8]
    assert not c.put([9] * 20, b"u" * 101)  # larger than the whole budget
    assert c.best([5, 5])[0] is None
    e, n = c.best(t + [99, 1])
    assert n == 21 and e.tokens[-1] == 98


# --- the draft model's KV cache ---------------------------------------------------------------
def test_the_draft_model_reuses_its_prefix_too():
    target, dm = FakeModel(), FakeModel(name="draft.gguf")
    draft = DraftModelProposer(dm, n_ctx=256, n_batch=64)
    eng = fake_engine(target, {"draft": draft}, control=fixed(3))
    p = raw(max_tokens=9)
    r1 = eng.generate("#!#", p, reuse=True)
    dctx = dm.contexts[0]
    assert dctx.tokens() == draft._held
    n = len(dctx.decodes)
    prompt2 = "#!#" + r1.text + "!"
    r2 = eng.generate(prompt2, p, reuse=True)
    assert draft.last_reused >= 3 + len(r1.tokens) - 2
    assert dctx.decodes[n].pos0 == draft.last_reused
    ref = fake_engine(FakeModel(), {"draft": DraftModelProposer(FakeModel(), n_ctx=256, n_batch=64)},
                      control=fixed(3)).generate(prompt2, p)
    assert r2.tokens == ref.tokens
    # a request without reuse clears the draft's cache as before
    eng.generate(prompt2, p)
    assert "clear" in dctx.calls[n + 1:] and draft.last_reused == 0


# --- exact mode: only what a prefill wrote is reused -------------------------------------------
def test_exact_reuse_stops_where_decode_passes_wrote_the_kv():
    from edgespec.decoding.kvcache import ROW_GROUP, PrefixCache
    model = StatefulModel()
    ctx = model.new_context(n_ctx=256, n_batch=64)
    kv = PrefixCache(ctx, ram=StateCache(1 << 20))
    prompt = [BOS] + [HASH, BANG] * 20 + [HASH, BANG, HASH]  # 44 tokens: whole row groups
    kv.prefill(prompt)
    ctx.decode([HASH, BANG, HASH], len(prompt), 0)  # an answer, written by decode steps
    kv.commit(ctx.tokens())
    nxt = ctx.tokens() + [BANG] * 8  # a new message of at least kvcache.MIN_PASS tokens
    assert kv.prefill(nxt, prefilled_only=True).reused == len(prompt)
    assert kv.prefill(nxt, prefilled_only=False).reused == len(nxt) - 1
    # a prefix that ends inside a row group is reused up to the group's start
    kv.invalidate()
    kv.prefill(prompt[:42])
    p2 = prompt + [BANG, HASH, BANG, HASH]  # 48 tokens
    assert kv.prefilled == 40 and kv.prefill(p2, prefilled_only=True).reused == 40
    assert kv.prefilled == 48  # that prefill started on a group boundary
    assert ROW_GROUP == 4
    # a RAM entry remembers how much of it a prefill wrote
    ctx.decode([BANG, HASH, BANG], len(p2), 0)
    kv.commit(ctx.tokens())
    long_a = ctx.tokens()
    kv.prefill([BOS] + [A] * 40)  # another conversation: a's state goes to RAM
    (entry,) = kv.ram.entries()
    assert entry.prefilled == 48
    assert kv.prefill(long_a + [BANG] * 8, prefilled_only=True).reused == 48
    assert kv.prefill(long_a + [BANG], prefilled_only=False).reused == len(long_a)


def test_only_a_conversation_is_copied_to_ram_when_a_one_off_request_takes_the_sequence():
    eng = fake_engine(StatefulModel(), {}, n_ctx=512)
    p = raw(max_tokens=4)
    a = "#!" * 20
    eng.generate(a, p)  # one-off requests (reuse off): nobody comes back to them
    eng.generate("." + a, p)
    assert len(eng.kv_cache.ram) == 0 and "save" not in eng.ctx.calls
    eng.generate(a, p, reuse=True)  # a conversation...
    eng.generate("." + a, p)  # ...stays findable when a one-off request replaces it
    assert len(eng.kv_cache.ram) == 1


def test_the_state_cache_budget_is_engine_configuration():
    from edgespec.config import EngineConfig
    from edgespec.errors import InvalidInputError
    with pytest.raises(InvalidInputError, match="KV state cache's RAM must be >= 0"):
        EngineConfig(target="t", kv_cache_ram=-1).validate()
    # 0 keeps nothing in RAM: a conversation that comes back is prefilled again (all but
    # the BOS it shares with what the KV cache holds)
    p = raw(max_tokens=8)
    a, b = "#!" * 20, "." + "#!" * 20
    reused = {}
    for ram in (None, 0):
        eng = fake_engine(StatefulModel(), {}, n_ctx=512, kv_cache_ram=ram)
        eng.generate(a, p, reuse=True)
        eng.generate(b, p, reuse=True)
        reused[ram] = (len(eng.kv_cache.ram), eng.generate(a, p, reuse=True).stats.prompt_reused)
    assert reused[None][0] == 1 and reused[None][1] > 10
    assert reused[0] == (0, 1)


# --- a request that promises its text reuses only what a prefill wrote ------------------------
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.05, seed=7)],
                         ids=["greedy", "seeded"])
def test_a_request_sent_again_computes_its_first_token_as_a_cold_prefill(sampling):
    from edgespec.decoding.kvcache import MIN_PASS
    eng = fake_engine(FakeModel(), {})
    p = raw(max_tokens=6, sampling=sampling)
    prompt = "#!" * 10  # BOS + 20 tokens
    r1 = eng.generate(prompt, p, reuse=True)
    r2 = eng.generate(prompt, p, reuse=True)
    # not all but the last token: the last row group boundary MIN_PASS tokens back
    assert r2.stats.prompt_computed == MIN_PASS + 1 and r2.stats.prompt_reused == 13 - 1
    assert r2.tokens == r1.tokens
    # the next turn does not reuse the answer a decode wrote, only the prompt before it
    prompt3 = prompt + r1.text + "#!" * 4
    r3 = eng.generate(prompt3, p, reuse=True)
    assert r3.stats.prompt_reused <= 21 and r3.tokens == fresh(prompt3, p).tokens
    # an unseeded sample reuses it all
    r4 = eng.generate(prompt3, raw(max_tokens=6), reuse=True)
    assert r4.stats.prompt_reused == r4.stats.prompt_tokens - 1
