"""The idle-time KV refresh of exact mode (PrefixCache.refresh, Engine.refresh_kv,
Conversation.settle) on the fake backend, whose KV cache refuses any position written twice
or skipped: the answer's positions are prefilled again from the last row-group boundary, in
chunks that start on boundaries, and the next exact turn reuses them."""
from __future__ import annotations

import pytest

from edgespec.chat.conversation import Conversation
from edgespec.errors import EdgespecError
from edgespec.decoding.kvcache import MIN_PASS, ROW_GROUP, PrefixCache, StateCache, common_prefix
from edgespec.api.params import GenerationParams
from fakes import BOS, Decode, FakeModel, KVMismatch, fake_engine
from fakes.backend import BANG, HASH

# "#" generates "!#!#...": a raw prompt of these keeps its tokenization across turns
PROMPT = [BOS] + [HASH, BANG] * 20 + [HASH]  # 42 tokens: a prefill marks 40 of them


def with_answer(n: int):
    """A cache whose sequence holds PROMPT (prefilled) and an n-token answer written by
    decode steps, as a finished turn leaves it."""
    ctx = FakeModel().new_context(n_ctx=512, n_batch=64)
    kv = PrefixCache(ctx, ram=StateCache(1 << 20))
    kv.prefill(PROMPT)
    answer = [BANG if i % 2 == 0 else HASH for i in range(n)]
    for i, t in enumerate(answer):
        ctx.decode([t], len(PROMPT) + i, 0)
    kv.commit(PROMPT + answer)
    return ctx, kv


def test_refresh_prefills_the_answer_from_the_last_group_boundary_in_aligned_chunks():
    ctx, kv = with_answer(30)  # holds 72 positions; a prefill wrote 40
    assert kv.prefilled == 40
    n_before = len(ctx.decodes)
    held = list(kv.held)
    assert kv.refresh(chunk=16) == 72 - 40
    passes = ctx.decodes[n_before:]
    assert [(d.pos0, len(d.tokens), d.logits) for d in passes] == [
        (40, 16, "none"), (56, 16, "none")]
    assert all(d.pos0 % ROW_GROUP == 0 for d in passes)
    assert ctx.tokens() == held == kv.held and kv.prefilled == 72
    # the next exact turn reuses every refreshed position and computes only its own tokens
    nxt = held + [BANG, HASH] * 4 + [BANG]
    pre = kv.prefill(nxt, prefilled_only=True)
    assert pre.reused == 72 and pre.computed == 9
    # a pass shorter than MIN_PASS takes other kernels: a short suffix starts earlier
    kv.commit(held)
    ctx.trim(0, len(held))
    assert kv.prefill(held + [BANG, HASH, BANG], prefilled_only=True).computed == MIN_PASS + 3
    assert kv.prefilled == 72  # that pass was MIN_PASS rows or more


def test_passes_shorter_than_min_pass_mark_nothing():
    ctx = FakeModel().new_context(n_ctx=512, n_batch=64)
    kv = PrefixCache(ctx)
    kv.prefill(PROMPT[:7])
    assert kv.prefilled == 0
    kv.prefill(PROMPT[:16])  # not exact: reuses the 7, computes 9 from an unaligned start
    assert kv.prefilled == 0
    kv.prefill(PROMPT[:40], reuse=False)
    assert kv.prefilled == 40
    kv.prefill(PROMPT[:40] + [BANG] * 6)  # a 6-row pass at 40 adds nothing
    assert kv.prefilled == 40
    kv.prefill(PROMPT[:40] + [BANG] * 16, prefilled_only=True)  # recomputes from 40: 16 rows
    assert kv.prefilled == 56
    # the context splits a long input into passes of n_batch or less, never a short last
    # one (runtime.kernel.pass_sizes): 68 = 60 + 8, every row marked
    kv.prefill(PROMPT[:8] * 8 + [BANG] * 4, reuse=False)
    assert kv.prefilled == 68


def test_over_an_f16_cache_with_flash_attention_a_pass_counts_from_64_rows():
    """ggml-cpu's tiled flash attention takes passes of 64+ query rows over an F16 cache, a
    one-row loop below (runtime.kernel.FA_TILE_ROWS): the context says so, and prefix reuse
    follows it."""
    ctx = FakeModel().new_context(n_ctx=512, n_batch=128, type_k=1, type_v=1)
    assert ctx.min_pass == 64
    kv = PrefixCache(ctx)
    assert kv.min_pass == 64
    long = (PROMPT[:8] * 12)[:96]
    kv.prefill(long[:40], reuse=False)
    assert kv.prefilled == 0  # one pass of 40 rows
    kv.prefill(long, reuse=False)
    assert kv.prefilled == 96
    again = kv.prefill(long + [BANG] * 8, prefilled_only=True)
    assert (again.reused, again.computed) == (40, 64)  # a suffix of at least 64 rows
    assert kv.prefilled == 104
    assert PrefixCache(FakeModel().new_context(n_ctx=512, n_batch=128)).min_pass == MIN_PASS


def test_the_tail_past_the_last_boundary_is_prefilled_but_not_marked():
    ctx, kv = with_answer(31)  # 73 positions
    assert kv.refresh(chunk=64) == 72 - 40
    assert ctx.decodes[-1] == Decode(tuple(kv.held[40:]), 40, 0, "none")
    assert len(kv.held) == 73 and kv.prefilled == 72
    assert kv.prefill(kv.held + [BANG] * 8, prefilled_only=True).reused == 72


def test_a_stopped_refresh_keeps_what_it_refreshed_and_the_next_turn_prefills_the_rest():
    ctx, kv = with_answer(30)
    held = list(kv.held)
    asked = []

    def stop():
        asked.append(1)
        return len(asked) > 1  # after the first chunk

    assert kv.refresh(stop, chunk=8) == 8
    assert kv.held == held[:48] == ctx.tokens() and kv.prefilled == 48
    pre = kv.prefill(held + [BANG], prefilled_only=True)  # the fake refuses a skipped position
    assert pre.reused == 48 and ctx.tokens() == held + [BANG]


def test_nothing_to_refresh_costs_nothing():
    ctx, kv = with_answer(1)  # 43 positions: no whole row group past the prefilled 40
    n = len(ctx.calls)
    assert kv.refresh() == 0 and len(ctx.calls) == n
    with pytest.raises(EdgespecError, match="multiple of 4"):
        kv.refresh(chunk=6)


def test_a_failed_refresh_forgets_the_sequence():
    ctx, kv = with_answer(30)

    def fail(ctx_, toks, pos0):
        raise KVMismatch("injected")

    ctx.on_decode = fail
    with pytest.raises(KVMismatch):
        kv.refresh()
    assert kv.held == [] and kv.prefilled == 0 and ctx.tokens() == []


# --- through the engine and a Conversation -----------------------------------------------------
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}!{{ m['content'] }}"
            "\n{% else %}#{{ m['content'] }}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}!{% endif %}")


@pytest.fixture(autouse=True)
def probed_cap(monkeypatch):
    """Stand in for the device probe (calibration.exact_cap measures a real model)."""
    from edgespec.calibration import cache as calibration
    monkeypatch.setattr(calibration, "exact_cap", lambda model, kernel, n_threads: 3)


def test_settle_in_exact_mode_makes_the_next_turn_reuse_the_answer_and_match_a_fresh_prefill():
    eng = fake_engine(FakeModel(chat_template=TEMPLATE), {}, n_ctx=512, exact=True)
    params = GenerationParams(max_tokens=24)
    conv = Conversation(eng, params=params)
    conv.ask("x")
    held, before = list(eng.kv_cache.held), eng.kv_cache.prefilled
    end = len(held) - len(held) % ROW_GROUP
    assert conv.settle() == end - before == conv.turns[-1].refreshed > 0
    assert eng.kv_cache.prefilled == end
    prompt2 = eng.prompt_tokens([*conv.history(), {"role": "user", "content": "ab"}], params)
    t2 = conv.ask("ab")
    # everything held, but for the last MIN_PASS positions (a pass that long is recomputed)
    shared = min(common_prefix(held, prompt2), len(prompt2) - MIN_PASS)
    assert t2.stats.prompt_reused == shared - shared % ROW_GROUP > before
    ref = fake_engine(FakeModel(chat_template=TEMPLATE), {}, n_ctx=512, exact=True).generate(
        conv.history()[:-1], params)
    assert ref.text == t2.text


def test_settle_is_free_for_unseeded_sampling_and_before_any_turn():
    from edgespec.api.params import SamplingParams
    eng = fake_engine(FakeModel(chat_template=TEMPLATE), {}, n_ctx=512)
    sampled = GenerationParams(max_tokens=24, sampling=SamplingParams(temperature=0.05))
    conv = Conversation(eng, params=sampled)
    assert conv.settle() == 0
    conv.ask("x")
    n = len(eng.ctx.calls)
    assert conv.settle() == 0 and len(eng.ctx.calls) == n  # it reuses the answer as it is
    exact = Conversation(eng, params=GenerationParams(max_tokens=24), exact=True)
    assert exact.settle() == 0  # no turn of its own yet
    # greedy outside --exact promises its text too: its answer is prefilled again
    greedy = Conversation(eng, params=GenerationParams(max_tokens=24))
    greedy.ask("x")
    assert greedy.settle() > 0
    t2 = greedy.ask("ab")
    assert t2.stats.prompt_reused >= t2.stats.prompt_tokens - 8 - 4  # MIN_PASS, ROW_GROUP


def test_cancel_stops_a_refresh_between_chunks():
    eng = fake_engine(FakeModel(chat_template=TEMPLATE), {}, n_ctx=512, exact=True)
    conv = Conversation(eng, params=GenerationParams(max_tokens=200))
    conv.ask("x")
    passes = []

    def cancel_after_first(ctx, toks, pos0):
        passes.append(pos0)
        eng.cancel()  # what another thread does when the next message arrives

    eng.ctx.on_decode = cancel_after_first
    n = conv.settle()
    eng.ctx.on_decode = None
    assert len(passes) == 1 and 0 < n <= 64
    t2 = conv.ask("ab")  # the cancel does not leak into the next turn
    assert t2.stop_reason != "cancelled" and t2.stats.prompt_reused >= n
