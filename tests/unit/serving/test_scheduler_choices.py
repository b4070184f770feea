"""``Scheduler.submit_n`` on the fake backend: n choices of one request prefill the prompt
once and copy its KV (seq_cp) into the other choices' sequences; each choice is what the
request alone gives with its seed (seed + i); a first choice that ends before its prompt is
in leaves the others to load it themselves; n beyond the sequences is refused."""
from __future__ import annotations

import threading

import pytest

from edgespec.errors import EdgespecError, UnsupportedError
from edgespec.api.events import Finished, PrefillDone
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.serving import DONE, Scheduler
from fakes import Decode, FakeModel, ScriptedProposer, fake_engine

PROMPT = "a b#a"


def raw(**kw) -> GenerationParams:
    return GenerationParams(chat=False, **kw)


class Choices:
    """on_event(i, ev) for an n-choice request: each choice's events, and when all ended."""

    def __init__(self, n: int) -> None:
        self.events = [[] for _ in range(n)]
        self.errors: list = [None] * n
        self.left = n
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, i: int, ev) -> None:
        if ev is DONE or isinstance(ev, BaseException):
            if isinstance(ev, BaseException):
                self.errors[i] = ev
            with self._lock:
                self.left -= 1
                if not self.left:
                    self.done.set()
        else:
            self.events[i].append(ev)

    def finished(self) -> list[Finished]:
        assert self.done.wait(10), "the choices never ended"
        assert self.errors == [None] * len(self.errors), self.errors
        return [next(e for e in evs if isinstance(e, Finished)) for evs in self.events]


def shared_engine(parallel: int = 3, n_batch: int = 64, script=(2,)):
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, list(script))},
                      parallel=parallel, n_batch=n_batch)
    eng.ctx.unified = True  # the fake's sequences are separate lists: seq_cp copies them
    return eng


def alone(params: GenerationParams, script=(2,)) -> Finished:
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, list(script))})
    return [e for e in eng.stream(PROMPT, params) if isinstance(e, Finished)][0]


def run(eng, params, n, parallel=None):
    sch = Scheduler(eng, parallel=parallel)
    got = Choices(n)
    sch.submit_n(PROMPT, params, n, on_event=got)
    fins = got.finished()
    sch.close()
    return fins, got


def test_the_prompt_is_prefilled_once_and_copied_to_each_choice():
    eng = shared_engine()
    params = raw(max_tokens=10)
    fins, got = run(eng, params, 3)
    ref = alone(params)
    assert [f.tokens for f in fins] == [ref.tokens] * 3  # greedy: every choice is the answer
    prompt = eng.prompt_tokens(PROMPT, params)
    # one prefill decoded the prompt; the other two sequences got it by seq_cp (a greedy
    # request's sequence is prefilled again once the scheduler is idle, without logits)
    prefills = [c for c in eng.ctx.calls
                if isinstance(c, Decode) and c.pos0 == 0 and c.logits != "none"]
    assert len(prefills) == 1 and list(prefills[0].tokens) == prompt
    copies = [c for c in eng.ctx.calls if isinstance(c, str) and c.startswith("seq_cp")]
    src = prefills[0].seq_id
    assert sorted(copies) == sorted(f"seq_cp {src}->{d} 0:{len(prompt)}"
                                    for d in {0, 1, 2} - {src})
    # the copies count as reused prompt, not computed
    assert [f.stats.prompt_reused for f in fins[1:]] == [len(prompt)] * 2
    assert all(any(isinstance(e, PrefillDone) for e in evs) for evs in got.events)


def test_choice_i_samples_with_seed_plus_i():
    eng = shared_engine(script=(0,))
    params = raw(max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=41))
    fins, _ = run(eng, params, 3)
    for i, fin in enumerate(fins):
        ref = alone(raw(max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=41 + i)),
                    script=(0,))
        assert fin.tokens == ref.tokens, i
    assert len({f.tokens for f in fins}) > 1  # the seeds differ, so do the choices


def test_a_first_choice_cancelled_while_its_prompt_loads_leaves_the_others_to_load_it():
    eng = shared_engine(n_batch=4)  # the prompt (6 tokens) loads in two passes
    params = raw(max_tokens=6)
    sch = Scheduler(eng)
    got = Choices(2)
    tickets = {}
    submitted = threading.Event()

    def cancel_first(ctx, tokens, pos0):  # during the first choice's first prompt pass
        if pos0 == 0 and submitted.wait(5) and "t" in tickets:
            tickets.pop("t")[0].cancel()

    eng.ctx.on_decode = cancel_first
    tickets["t"] = sch.submit_n(PROMPT, params, 2, on_event=got)
    submitted.set()
    assert got.done.wait(10)
    sch.close()
    first, second = ([e for e in evs if isinstance(e, Finished)] for evs in got.events)
    assert first[0].stop_reason == "cancelled"
    assert second[0].stop_reason != "cancelled" and second[0].tokens == alone(params).tokens
    assert not any(isinstance(c, str) and c.startswith("seq_cp") for c in eng.ctx.calls)


def test_n_beyond_the_sequences_or_an_unshared_pool_is_refused():
    eng = shared_engine(parallel=2)
    sch = Scheduler(eng)
    with pytest.raises(EdgespecError, match="this server has 2"):
        sch.submit_n(PROMPT, raw(max_tokens=4), 3, on_event=lambda i, ev: None)
    eng.ctx.unified = False
    with pytest.raises(UnsupportedError, match="splits its pool"):
        sch.submit_n(PROMPT, raw(max_tokens=4), 2, on_event=lambda i, ev: None)
    sch.check_choices(1)  # one choice needs nothing shared
    sch.close()
