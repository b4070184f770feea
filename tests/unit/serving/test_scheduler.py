"""The serving scheduler on the fake backend: several requests share each pass
(continuous batching) and each gets exactly what it would get alone."""
from __future__ import annotations

import threading
import time

import pytest

from edgespec.control import ControlSettings
from edgespec.errors import ContextOverflowError, UnsupportedError
from edgespec.api.events import Control, Finished, Step
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.serving import DONE, QueueFullError, Scheduler
from fakes import Decode, FakeModel, ScriptedProposer, fake_engine, fixed

PROMPTS = ["a", "x", "#", "ab", "a b", "#!"]


def raw(**kw) -> GenerationParams:
    return GenerationParams(chat=False, **kw)


class Collector:
    """on_event for one ticket: gathers events, signals when the request is over."""

    def __init__(self) -> None:
        self.events: list = []
        self.done = threading.Event()
        self.error: BaseException | None = None

    def __call__(self, ev) -> None:
        if ev is DONE:
            self.done.set()
        elif isinstance(ev, BaseException):
            self.error = ev
            self.done.set()
        else:
            self.events.append(ev)

    @property
    def finished(self) -> Finished:
        assert self.done.wait(10), "the request never ended"
        assert self.error is None, self.error
        return next(e for e in self.events if isinstance(e, Finished))


def alone(prompt: str, params: GenerationParams, script=(3,)) -> Finished:
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, list(script))})
    return [e for e in eng.stream(prompt, params) if isinstance(e, Finished)][0]


def serve(eng, prompts, params, parallel=None, max_queue=16, **kw):
    sch = Scheduler(eng, parallel=parallel, max_queue=max_queue)
    cols = [Collector() for _ in prompts]
    for p, c in zip(prompts, cols):
        sch.submit(p, params, on_event=c, **kw)
    fins = [c.finished for c in cols]
    sch.close()
    return sch, fins, cols


@pytest.mark.parametrize("script", [(3,), ((2, 1),), ((0, 2), 1)])
def test_concurrent_requests_each_equal_the_request_alone(script):
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, list(script))}, parallel=4)
    params = raw(max_tokens=12)
    sch, fins, _ = serve(eng, PROMPTS, params)
    for p, fin in zip(PROMPTS, fins):
        ref = alone(p, params, script)
        assert fin.tokens == ref.tokens and fin.text == ref.text, p
        assert fin.stop_reason == ref.stop_reason
    # passes were shared: one llama_decode carried several sequences
    assert "multi" in eng.ctx.calls
    multi = [i for i, c in enumerate(eng.ctx.calls) if c == "multi"]
    seqs = {c.seq_id for i in multi for c in eng.ctx.calls[i + 1:i + 3] if isinstance(c, Decode)}
    assert len(seqs) >= 2
    assert sch.load().running == 0 and sch.load().queued == 0


def test_sampled_requests_are_reproducible_under_batching():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [(2, 1)])}, parallel=3)
    params = raw(max_tokens=10, sampling=SamplingParams(temperature=1.0, seed=7))
    _, fins, _ = serve(eng, ["a", "a", "x"], params)
    assert fins[0].tokens == fins[1].tokens == alone("a", params, [(2, 1)]).tokens


def test_each_sequence_keeps_its_own_kv_and_frees_it_for_reuse():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3])}, parallel=2)
    # an unseeded sample reuses the answer too (a greedy request: only what a prefill
    # wrote, tests/unit/decoding/test_kv_reuse.py); PEAK makes its text greedy's
    params = raw(max_tokens=8, sampling=SamplingParams(temperature=0.05))
    sch = Scheduler(eng)
    c1, c2 = Collector(), Collector()
    sch.submit("#", params, on_event=c1)
    sch.submit("x", params, on_event=c2)
    f1, f2 = c1.finished, c2.finished
    # each sequence holds its prompt and what was evaluated of its answer
    held = {tuple(eng.ctx.tokens(s)) for s in (0, 1)}
    toks_a = eng.target.tokenize("#", add_special=True, parse_special=False)
    toks_x = eng.target.tokenize("x", add_special=True, parse_special=False)
    assert any(h[:len(toks_a)] == tuple(toks_a) for h in held)
    assert any(h[:len(toks_x)] == tuple(toks_x) for h in held)
    # a follow-up of the first conversation lands on its sequence and reuses it
    c3 = Collector()
    sch.submit("#" + f1.text, params, on_event=c3)
    assert c3.finished.stats.prompt_reused > len(toks_a)
    sch.close()


@pytest.mark.parametrize("parallel", [1, 2])
def test_an_idle_scheduler_prefills_a_greedy_answer_again_for_the_next_turn(parallel):
    """A greedy request reuses only KV a prefill wrote (edgespec.decoding.kvcache): once the
    scheduler is idle, the answer's positions are prefilled again, so the next turn reuses
    the whole conversation and still gives the fresh prefill's answer."""
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3])}, parallel=parallel)
    params = raw(max_tokens=24)
    sch = Scheduler(eng)
    first = Collector()
    prompt = "#!" * 6
    sch.submit(prompt, params, on_event=first, reuse=True)
    f1 = first.finished
    slot = eng.kv_cache
    for _ in range(200):  # the refresh runs on the scheduler thread once it is idle
        if slot.prefilled >= len(slot.held) - 4:
            break
        time.sleep(0.01)
    assert slot.prefilled >= len(slot.held) - 4 > 12
    refreshes = [c for c in eng.ctx.calls if isinstance(c, Decode) and c.logits == "none"]
    assert refreshes, "nothing was prefilled again"
    held = len(slot.held)  # the prompt and the answer but its pending last token
    nxt = Collector()
    turn2 = prompt + f1.text + "#!" * 5
    sch.submit(turn2, params, on_event=nxt, reuse=True)
    f2 = nxt.finished
    sch.close()
    assert f2.stats.prompt_reused >= held - 4  # to the last row group boundary
    assert f2.tokens == alone(turn2, params).tokens


def test_a_full_queue_is_refused_with_a_retry_time_and_cancel_frees_places():
    model = FakeModel()
    eng = fake_engine(model, {}, parallel=1)
    gate = threading.Event()
    eng.ctx.on_decode = lambda ctx, toks, pos: gate.wait(10)
    sch = Scheduler(eng, max_queue=1)
    running, queued = Collector(), Collector()
    t1 = sch.submit("a", raw(max_tokens=50), on_event=running)
    for _ in range(100):
        if sch.load().running == 1:
            break
        time.sleep(0.01)
    t2 = sch.submit("x", raw(max_tokens=5), on_event=queued)
    with pytest.raises(QueueFullError) as e:
        sch.submit("#", raw(max_tokens=5), on_event=Collector())
    assert e.value.retry_after >= 1
    t2.cancel()  # a queued request leaves at once
    assert queued.done.wait(2) and not queued.events
    t1.cancel()
    gate.set()
    assert running.finished.stop_reason == "cancelled"
    sch.close()
    assert sch.load().running == 0


def test_bad_requests_are_refused_at_submit_and_the_scheduler_keeps_serving():
    eng = fake_engine(FakeModel(), {}, n_ctx=32, parallel=2)
    sch = Scheduler(eng)
    with pytest.raises(ContextOverflowError):
        sch.submit("a" * 100, raw(max_tokens=4), on_event=Collector())
    ok = Collector()
    sch.submit("a", raw(max_tokens=4), on_event=ok)
    assert ok.finished.stop_reason == "length"
    sch.close()


def test_exact_mode_bounds_every_pass_to_the_invariant_size():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3])}, parallel=4,
                      control=fixed(1), exact=True)
    eng.upkeep.exact_cap = 2  # probed: passes of up to 3 rows are bitwise invariant here
    rows: list[int] = []
    real = eng.ctx.decode_multi
    eng.ctx.decode_multi = lambda segs: rows.append(sum(len(t) for t, *_ in segs)) or real(segs)
    params = raw(max_tokens=10)
    _, fins, _ = serve(eng, ["a", "x", "#", "ab"], params)
    assert rows and max(rows) <= 3
    for p, fin in zip(["a", "x", "#", "ab"], fins):
        ref = alone(p, params, [3])
        assert fin.tokens == ref.tokens


def test_drafts_yield_to_load_on_a_compute_bound_device_and_resume():
    from edgespec.calibration.curve import Calibration

    model = FakeModel()
    # every extra row costs a whole step: a draft can only pay alone, never in a shared pass
    steep = Calibration.linear(1.0, step_seconds=0.02)
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [(1, 1)])}, parallel=2,
                      control=ControlSettings(), calibration=steep)
    params = raw(max_tokens=30)
    _, fins, cols = serve(eng, ["a", "x b"], params)
    kinds = [e.kind for c in cols for e in c.events if isinstance(e, Control)]
    assert "load_yield" in kinds
    assert fins[0].stats.control_events.get("load_yield", 0) >= 1


def test_a_draft_model_is_refused_with_parallel_sequences():
    model = FakeModel()
    eng = fake_engine(model, {"draft": ScriptedProposer(model, [3], costly=True)}, parallel=2)
    with pytest.raises(UnsupportedError, match="--parallel 1"):
        Scheduler(eng)


def test_a_long_prompt_loads_in_chunks_while_others_keep_decoding():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [2])}, parallel=2,
                      n_batch=32, n_ctx=256)
    sch = Scheduler(eng)
    params = raw(max_tokens=40)
    first, second = Collector(), Collector()
    steps_before: list[int] = []

    def on_first(ev):
        first(ev)
        if isinstance(ev, Step) and len(steps_before) == 0 and len(first.events) > 4:
            steps_before.append(1)
            sch.submit("#" * 90, raw(max_tokens=6), on_event=second)  # 91 prompt tokens
    sch.submit("a", params, on_event=on_first)
    f1, f2 = first.finished, second.finished
    sch.close()
    assert f1.tokens == alone("a", params, [2]).tokens
    assert f2.tokens == alone("#" * 90, raw(max_tokens=6), [2]).tokens
    # the prompt went in pieces of at most n_batch - 1 rows, each sharing a pass with the
    # decoding request (one llama_decode holding both sequences)
    calls = eng.ctx.calls
    multi = [i for i, c in enumerate(calls) if c == "multi"]
    shared = [(calls[i + 1], calls[i + 2]) for i in multi
              if isinstance(calls[i + 2], Decode) and calls[i + 2].logits in ("none", "last")
              and calls[i + 1].seq_id != calls[i + 2].seq_id and len(calls[i + 2].tokens) > 4]
    assert len(shared) >= 2
    assert all(len(p.tokens) <= 31 for _, p in shared)
    assert f2.stats.prompt_tokens == 91


def test_exact_requests_need_sequences_with_their_own_cells():
    eng = fake_engine(FakeModel(), {}, parallel=2)
    eng.ctx.unified = True  # a default-mode engine: one shared KV pool
    eng.upkeep.exact_cap = 2
    sch = Scheduler(eng)
    with pytest.raises(UnsupportedError, match="--exact"):
        sch.submit("a", raw(max_tokens=4), on_event=Collector(), exact=True)
    ok = Collector()
    sch.submit("a", raw(max_tokens=4), on_event=ok)  # the default mode is served
    assert ok.finished.stop_reason == "length"
    sch.close()


def test_a_request_runs_in_its_traffic_slice():
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [2])}, parallel=2)
    seen = []
    real = eng.guard.route
    eng.guard.route = lambda traffic, label: seen.append(traffic) or real(traffic, label)
    sch = Scheduler(eng)
    c = Collector()
    t = sch.submit("a", raw(max_tokens=4), on_event=c, traffic="/v1/chat/completions/json")
    assert c.finished.stop_reason == "length"
    sch.close()
    assert t.prepared.traffic == "/v1/chat/completions/json" and seen == [t.prepared.traffic]
