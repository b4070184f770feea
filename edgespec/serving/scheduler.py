"""The scheduler: requests from many clients, one engine, one thread that owns the context.

One idea, kept in one module over 500 lines: continuous batching, i.e. admitting queued
requests into the context's sequences and running all of them in one shared pass per
step (their prompts, drafts and choices). What a client holds (tickets, the queue's load,
the refusals) is edgespec.serving.tickets.

    submit(prompt, params, on_event)   validates at once (an EdgespecError is the client's
                                       fault: a 400), queues the request (QueueFullError
                                       when the queue is full: a 429)
    the scheduler thread               admits queued requests into free sequences, then
                                       runs every active request's next pass in ONE
                                       llama_decode (continuous batching), calling
                                       on_event(event) for each engine event and
                                       on_event(DONE) after the last; or on_event(exc)
                                       once if the request failed
    ticket.cancel()                    a queued request is dropped, a running one ends at
                                       its next step with stop_reason "cancelled"
    close(drain=True)                  refuses new requests, finishes the admitted ones
    submit_n(prompt, params, n, ...)   n choices of one request (OpenAI's ``n``): the
                                       prompt is prefilled once and its KV copied
                                       (seq_cp) into the other choices' sequences; see
                                       "Several choices" below

A step. Each active request plans its part of the pass in turn (edgespec.loop.request.Loop.plan):
its controller sees the rows the requests before it already put in the pass and the tokens
they expect from it (edgespec.loop.state.Load), so on a compute-bound device drafts shrink and
stop as the batch grows, and come back as it empties; a request whose controller declines
a draft because of the load gets a ``load_yield`` Control event (``load_resume`` when it
drafts again). New requests join at step boundaries; their prompt loads in chunks of at
most PREFILL_CHUNK positions that ride along in the passes the others decode in (so a long
prompt does not stop everyone's stream), and finished requests free their sequence at once.

Exact mode. Several sequences in a pass are rows of one matrix product, exactly as drafts
are: when any active request is exact, the whole pass holds at most the probed invariant
number of rows (Engine.exact_max_draft() + 1), so a request may wait a step for its turn
(round robin), and a prompt loads alone. That bounds exact throughput; the default mode
is not bounded.

Several choices. ``submit_n`` queues one request whose n choices are admitted together,
when n sequences are free (so n is at most the number of sequences, and the KV pool must
be unified: a copy marks the prompt's cells for each choice, it moves no data). The first
choice prefills the prompt (reusing any cached prefix as usual); when its last chunk is in,
every other choice's sequence gets the prompt's cells (``Context.seq_cp``) and samples its
first token from the same last-prompt-token logits; from then on the choices are ordinary
sequences of the batch. Choice i samples with its own generator, seeded ``seed + i`` (mod
2**64) when the request has a seed: choice 0 is the request's n = 1 answer (on the plain
path; under speculation the draws a request consumes depend on its drafts, which depend on
what the proposers learned before). Greedy choices are equal. If the first choice
ends before its prompt is in (cancelled, failed), the others prefill it themselves.

``on_event`` runs on the scheduler thread: it must not block (the server hands events to
its asyncio loop with ``call_soon_threadsafe``).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import EdgespecError, UnsupportedError
from ..api.arrays import FloatArray
from ..api.events import Control, Event
from ..api.labels import ControlKind
from ..decoding.kvcache import Prefill, PrefillStart, PrefixCache, common_prefix
from ..api.params import GenerationParams
from ..loop.state import Load as StepLoad
from ..loop.state import Request
from ..loop.treepass import decode as decode_tree
from .tickets import (DONE, Choices, Delivery, QueueLoad, QueueFullError, ShuttingDownError,
                      Ticket)

if TYPE_CHECKING:
    from ..loop.state import Pass
    from ..control.guard import Route
    from ..engine.engine import Engine, Prepared

#: prompt positions a loading request adds to a pass that others decode in: small enough
#: that their next token waits ~one long pass, large enough for the batched kernels
PREFILL_CHUNK = 128


@dataclass
class _Slot:
    seq_id: int
    kv: PrefixCache
    used: float = 0.0  # when it last served: ties go to the least recently used
    #: its last request promised its text (Request.prefilled_only): while the scheduler is
    #: idle, the answer's positions are prefilled again so the next turn reuses them
    refresh: bool = False


@dataclass
class _Active:
    ticket: Ticket
    req: Request
    route: Route  # the engine's route for it (open_request), handed back to its canary
    slot: _Slot
    yielding: bool = False  # its drafts are held back by the load (a load_yield was sent)
    prefill: PrefillStart | None = None  # while its prompt loads
    pos: int = 0  # the next prompt position to decode, while prefilling
    # another choice of the same request still loads the prompt this one will copy
    leader: "_Active | None" = None
    followers: list[_Active] = field(default_factory=list)  # the choices waiting on this one


@dataclass(frozen=True)
class SlotState:
    """One sequence as :meth:`Scheduler.slots` reports it (a snapshot)."""

    id: int
    processing: bool
    request_id: int | None = None
    prompt_tokens: int = 0
    generated: int = 0
    params: GenerationParams | None = None
    prefilling: bool = False  # its prompt is still loading


class Scheduler:
    """Runs requests on one engine from a single thread, several sequences per pass."""

    def __init__(self, engine: Engine, *, parallel: int | None = None,
                 max_queue: int = 16) -> None:
        parallel = engine.ctx.n_seq_max if parallel is None else parallel
        if parallel < 1:
            raise EdgespecError(f"--parallel must be at least 1 (got {parallel})")
        if parallel > getattr(engine.ctx, "n_seq_max", 1):
            raise EdgespecError(
                f"--parallel {parallel} needs an engine built with parallel={parallel} "
                f"(its context holds {engine.ctx.n_seq_max} sequences)")
        if max_queue < 0:
            raise EdgespecError(f"the queue length must be >= 0 (got {max_queue})")
        costly = [n for n, p in engine.proposers.items() if getattr(p, "costly", False)]
        if parallel > 1 and costly:
            raise UnsupportedError(
                f"the {costly[0]} proposer runs a draft model with one sequence: serve it with "
                "--parallel 1, or use the free proposers (ngram, suffix) with --parallel N")
        self.engine = engine
        self.loop = engine.loop
        self.parallel = parallel
        self.max_queue = max_queue
        # sequences 0..parallel-1 serve requests; draft trees use scratch sequences past them
        busy = set(getattr(self.loop, "tree_seqs", ())) & set(range(parallel))
        if busy:
            raise EdgespecError(f"sequences {sorted(busy)} are both request slots and draft-tree "
                                "scratch sequences; build the engine with parallel set")
        self._slots = [_Slot(0, engine.kv_cache)] + [
            _Slot(i, PrefixCache(engine.ctx, seq_id=i, ram=engine.kv_cache.ram))
            for i in range(1, parallel)]
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[Ticket] = deque()
        self._active: list[_Active] = []
        self._closing = False
        self._abort: EdgespecError | None = None  # close(drain=False, error=...): how runs end
        self._rr = 0  # round-robin start, for steps that cannot hold every request
        self._seconds: deque[float] = deque(maxlen=32)  # recent request durations, for Retry-After
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="edgespec-scheduler", daemon=True)
        self._thread.start()

    # --- clients -------------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[dict[str, Any]], params: GenerationParams, *,
               on_event: Callable[[Delivery], None], proposer: str | None = None,
               exact: bool | None = None, reuse: bool = True,
               traffic: str = "default") -> Ticket:
        self._admissible()
        # validation and tokenization happen here, on the caller's thread: a bad request
        # is refused before it takes a place in the queue
        prepared = self.engine.prepare(prompt, params, proposer=proposer, exact=exact,
                                       reuse=reuse, traffic=traffic)
        if prepared.exact and self.parallel > 1 and getattr(self.engine.ctx, "unified", False):
            prepared.close()
            raise UnsupportedError(
                "this server shares one KV pool between its sequences, where a sequence's "
                "logits can move by rounding when others' drafts are trimmed; exact requests "
                "need a server started with --exact (or --parallel 1)")
        ticket = Ticket(next(self._ids), on_event, self._cancelled, prepared)
        with self._lock:
            try:
                self._admissible_locked()
            except EdgespecError:
                prepared.close()
                raise
            self._queue.append(ticket)
            self._wake.notify()
        return ticket

    def submit_n(self, prompt: str | Sequence[dict[str, Any]], params: GenerationParams, n: int, *,
                 on_event: Callable[[int, Delivery], None], proposer: str | None = None,
                 exact: bool | None = None, reuse: bool = True,
                 traffic: str = "default") -> Choices:
        """``n`` choices of one request: ``on_event(i, event)`` for choice i, as ``submit``'s
        ``on_event`` is called for its request. Refused (an EdgespecError) when n is more
        than the sequences or the KV pool is not shared (see "Several choices")."""
        self.check_choices(n)
        if n == 1:
            return Choices([self.submit(prompt, params, on_event=lambda ev: on_event(0, ev),
                                        proposer=proposer, exact=exact, reuse=reuse,
                                        traffic=traffic)])
        self._admissible()
        seed = params.sampling.seed
        prepared: list[Prepared] = []
        try:
            for i in range(n):
                choice = params if seed is None or i == 0 else replace(
                    params, sampling=replace(params.sampling, seed=(seed + i) % 2 ** 64))
                prepared.append(self.engine.prepare(prompt, choice, proposer=proposer, exact=exact,
                                                    reuse=reuse, traffic=traffic))
            if any(p.exact for p in prepared):
                raise UnsupportedError(
                    "n > 1 copies the prompt's KV between sequences of a shared pool, where "
                    "exact requests cannot run; send n = 1 for an exact request")
        except BaseException:
            for p in prepared:
                p.close()
            raise
        tickets = [Ticket(next(self._ids), (lambda i: lambda ev: on_event(i, ev))(i),
                          self._cancelled, p)
                   for i, p in enumerate(prepared)]
        leader = tickets[0]
        leader.followers = tickets[1:]
        for t in leader.followers:
            t.leader = leader
        with self._lock:
            try:
                self._admissible_locked()
            except EdgespecError:
                for p in prepared:
                    p.close()
                raise
            self._queue.append(leader)
            self._wake.notify()
        return Choices(tickets)

    def check_choices(self, n: int) -> None:
        """Whether this scheduler can serve n choices of one request."""
        if n < 1:
            raise EdgespecError(f"n must be at least 1 (got {n})")
        if n == 1:
            return
        if n > self.parallel:
            raise EdgespecError(
                f"n = {n} choices need {n} sequences at once; this server has {self.parallel} "
                f"(--parallel): send n <= {self.parallel}, or several requests")
        if not getattr(self.engine.ctx, "unified", False):
            raise UnsupportedError(
                "n > 1 shares the prompt's KV between sequences of one pool; this server "
                "splits its pool per sequence (--exact with --parallel): send n = 1")

    def load(self) -> QueueLoad:
        with self._lock:
            return QueueLoad(len(self._queue), len(self._active), self.parallel, self.max_queue)

    def slots(self) -> list["SlotState"]:
        """Each sequence's state now (llama-server's /slots): idle, or the request on it
        with its prompt, the tokens generated so far and its parameters."""
        with self._lock:
            by_seq = {a.slot.seq_id: a for a in self._active}
            out = []
            for slot in self._slots:
                a = by_seq.get(slot.seq_id)
                if a is None:
                    out.append(SlotState(slot.seq_id, False))
                    continue
                r = a.req
                out.append(SlotState(slot.seq_id, True, a.ticket.id, r.n_prompt,
                                     len(r.generated), r.params, a.prefill is not None))
            return out

    def close(self, drain: bool = True, timeout: float | None = None,
              error: EdgespecError | None = None) -> None:
        """Refuse new requests; ``drain``: finish the admitted ones; else drop the queued ones
        (each gets a ShuttingDownError) and cancel the running ones at their next step, with
        stop_reason "cancelled", or, given ``error``, ending each with ``error`` at once (a
        server shutting down: its clients see an error, not an answer that looks complete,
        and without waiting for a pass, which can take seconds on a busy machine)."""
        running: list[Ticket] = []
        with self._lock:
            self._closing = True
            dropped = [] if drain else list(self._queue)
            if not drain:
                self._abort = error
                self._queue.clear()
                for a in self._active:
                    a.ticket.cancelled.set()
                if error is not None:
                    running = list(dict.fromkeys(
                        t for a in self._active for t in (a.ticket, *a.ticket.followers)))
            self._wake.notify()
        for t in [x for t in dropped for x in (t, *t.followers)]:
            t.prepared.close()
            t.on_event(ShuttingDownError("the server shut down before this request ran"))
        if error is not None:  # (running is empty otherwise)
            for t in running:  # their last event; _finish sends them nothing more
                t.cancelled.set()
                self._fail(t, error)
        self._thread.join(timeout)

    def _admissible(self) -> None:
        with self._lock:
            self._admissible_locked()

    def _admissible_locked(self) -> None:
        if self._closing:
            raise ShuttingDownError("the server is shutting down; retry on another instance")
        free = self.parallel - len(self._active)
        if len(self._queue) >= self.max_queue + max(0, free):
            raise QueueFullError(f"{len(self._queue)} requests are queued (limit "
                                 f"{self.max_queue}); retry shortly", self._retry_after())

    def _retry_after(self) -> float:
        """Seconds until a place is likely free: the queue ahead, served `parallel` at a
        time, at the recent mean request duration."""
        mean = sum(self._seconds) / len(self._seconds) if self._seconds else 5.0
        return max(1.0, round(mean * (len(self._queue) + 1) / self.parallel, 1))

    def _cancelled(self, ticket: Ticket) -> None:
        with self._lock:
            queued = ticket in self._queue
            if queued:
                self._queue.remove(ticket)
        if queued:  # never ran: nothing to report but its end (its choices' neither)
            for t in (ticket, *ticket.followers):
                t.cancelled.set()
                t.prepared.close()
                t.on_event(DONE)

    # --- the scheduler thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            idle: _Slot | None = None
            with self._lock:
                while not self._queue and not self._active and not self._closing:
                    idle = next((s for s in self._slots if s.refresh), None)
                    if idle is not None:
                        break
                    self._wake.wait()
                if not self._queue and not self._active and idle is None:
                    return  # closing, and nothing left to finish
                joining = self._take_joining() if idle is None else []
            if idle is not None:
                self._refresh(idle)
                continue
            with self.engine.exclusive():  # a direct Engine.stream() call waits for the step
                for t, slot in joining:
                    self._start(t, slot)
                if self._active:
                    self._step()

    def _refresh(self, slot: _Slot) -> None:
        """Idle time: prefill the slot's last answer again (PrefixCache.refresh), until a
        request arrives or the scheduler closes; the next turn prefills what is left."""
        slot.refresh = False
        try:
            with self.engine.exclusive():
                slot.kv.refresh(lambda: bool(self._queue) or self._closing)
        except Exception:
            pass  # the cache invalidated itself: the next request prefills from scratch

    def _take_joining(self) -> list[tuple[Ticket, _Slot]]:
        """Queued requests that get a free sequence now (the one holding the longest
        prefix of their prompt, so a conversation's next turn finds its KV)."""
        busy = {a.slot.seq_id for a in self._active}
        free = [s for s in self._slots if s.seq_id not in busy]
        out = []
        while self._queue and free:
            t = self._queue[0]
            if len(t.followers) >= len(free):
                break  # an n-choice request waits for n free sequences (first come first)
            self._queue.popleft()
            toks = t.prepared.tokens
            for c in (t, *t.followers):  # the leader first: it prefills, the rest copy
                slot = max(free, key=lambda s: (common_prefix(s.kv.held, toks), -s.used))
                free.remove(slot)
                out.append((c, slot))
        return out

    def _start(self, ticket: Ticket, slot: _Slot) -> None:
        eng, loop = self.engine, self.loop
        try:
            req, route = eng.open_request(ticket.prepared)
        except BaseException as e:
            ticket.prepared.close()
            self._fail(ticket, e)
            return
        req.seq_id, req.kv, req.cancel = slot.seq_id, slot.kv, ticket.cancelled
        a = _Active(ticket, req, route, slot)
        lead = next((x for x in self._active if x.ticket is ticket.leader), None)
        with self._lock:
            self._active.append(a)
        try:
            self._send(a, loop.started(req))
            if lead is not None and lead.prefill is not None:
                a.leader = lead  # it starts from the KV the first choice is prefilling
                lead.followers.append(a)
                return
            if self.parallel > 1 and not req.exact:
                # the prompt loads in chunks that share the next passes with the sequences
                # already decoding, so they keep emitting while it loads
                a.prefill = slot.kv.start(req.tokens, reuse=req.reuse,
                                          prefilled_only=req.prefilled_only)
                a.pos = req.n_past = a.prefill.reused
                return
            for ev in loop.begin(req):  # alone: exact mode, or nobody else to wait
                self._send(a, ev)
        except BaseException as e:
            self._finish(a, error=e)
            return
        if req.stop_reason:
            self._finish(a)

    def _step(self) -> None:
        """One pass: every active request's part of it (its next draft to verify, or a chunk
        of its prompt) in one decode, then each request's events."""
        n = len(self._active)
        order = self._active[self._rr % n:] + self._active[:self._rr % n]
        self._rr += 1
        exact = any(a.req.exact for a in order)
        budget = max(1, self.engine.exact_max_draft() + 1 if exact else self.loop.ctx.n_batch)
        for a in [a for a in order if a.leader is not None and a.ticket.cancelled.is_set()]:
            a.req.stop_reason = "cancelled"  # a choice cancelled while its prompt loads
            self._finish(a)
            order.remove(a)
        decoding = [a for a in order if a.prefill is None and a.leader is None]
        chunks = self._prefill_chunks([a for a in order if a.prefill is not None], decoding,
                                      budget, exact)
        passes, rows = self._plan(decoding, chunks, budget, exact)
        if not passes and not chunks:
            return
        done = self._decode(passes, chunks, rows)
        if done is None:
            return
        outs, seconds = done
        self.steps += 1
        self._complete(passes, chunks, outs, seconds)

    def _plan(self, decoding: list[_Active], chunks: list[tuple[_Active, int]], budget: int,
              exact: bool) -> tuple[list[tuple[_Active, Pass]], int]:
        """Each decoding request plans its part of the pass in turn, seeing the rows and
        expected tokens of those before it; in exact mode a request that finds no room
        waits for its turn. Returns the planned passes and the pass's rows."""
        passes: list[tuple[_Active, Pass]] = []
        rows, tokens = sum(c for _, c in chunks), 0.0
        for i, a in enumerate(decoding):
            left = len(decoding) - i - 1  # requests still to plan, a row each at least
            room = budget - rows - (left if not exact else 0)
            if room < 1:
                break  # exact mode: this request waits for its turn
            try:
                shared = len(decoding) > 1 or chunks
                ps = self.loop.next_pass(a.req, StepLoad(rows=rows, tokens=tokens, max_rows=room)
                                    if shared else None)
            except BaseException as e:
                self._finish(a, error=e)
                continue
            if ps is None:
                self._finish(a)
                continue
            for ev in ps.events:
                self._send(a, ev)
            self._load_events(a, ps, rows)
            passes.append((a, ps))
            rows += len(ps.tokens)
            tokens += ps.expected
        return passes, rows

    def _decode(self, passes: list[tuple[_Active, Pass]], chunks: list[tuple[_Active, int]],
                rows: int) -> tuple[list[FloatArray], float] | None:
        """Run the pass: each part's logits rows and the seconds it took, or None when it
        failed (then for everyone in it, each finished with the error)."""
        loop = self.loop
        for a, ps in passes:
            a.req.in_flight = True
            ps.batch_rows = rows if len(passes) + len(chunks) > 1 else 0
        for a, _ in chunks:
            a.req.in_flight = True
        t0 = time.perf_counter()
        try:
            if len(passes) == 1 and not chunks:
                a, ps = passes[0]
                if ps.tree is not None:  # alone in the pass: the loop may verify a draft tree
                    outs = [decode_tree(loop, ps)]
                else:
                    outs = [loop.ctx.decode(ps.tokens, a.req.n_past, a.req.seq_id,
                                            logits=ps.logits)]
            else:
                segs = [(ps.tokens, a.req.n_past, a.req.seq_id, ps.logits) for a, ps in passes]
                segs += [(a.req.tokens[a.pos:a.pos + c], a.pos, a.req.seq_id,
                          "last" if a.pos + c == len(a.req.tokens) else "none")
                         for a, c in chunks]
                outs = loop.ctx.decode_multi(segs)
        except BaseException as e:  # the pass failed for everyone in it
            for a, _ in [*passes, *chunks]:
                self._finish(a, error=e)
            return None
        return outs, time.perf_counter() - t0

    def _complete(self, passes: list[tuple[_Active, Pass]], chunks: list[tuple[_Active, int]],
                  outs: list[FloatArray], seconds: float) -> None:
        """Each part's result: a decoding request verifies and emits, a loading one moves
        past its chunk (and starts decoding when its prompt is in)."""
        for (a, ps), out in zip(passes, outs):
            try:
                self._send(a, self.loop.complete(ps, out, seconds))
            except BaseException as e:
                self._finish(a, error=e)
                continue
            if a.req.stop_reason:
                self._finish(a)
        for (a, c), out in zip(chunks, outs[len(passes):]):
            a.pos += c
            a.req.n_past, a.req.in_flight = a.pos, False
            if a.pos == len(a.req.tokens):
                self._prefilled(a, out, whole=False)

    def _prefill_chunks(self, prefilling: list[_Active], decoding: list[_Active], budget: int,
                        exact: bool) -> list[tuple[_Active, int]]:
        """How many prompt positions each loading request decodes in this pass. While
        others decode, a pass takes at most PREFILL_CHUNK of them (the others' next token
        waits for the whole pass); alone, a whole batch. When an exact request is active,
        shared passes must stay within its invariant rows: a prompt then loads alone."""
        out: list[tuple[_Active, int]] = []
        room = budget - len(decoding)
        per = PREFILL_CHUNK if decoding else budget
        for a in prefilling:
            if a.ticket.cancelled.is_set():
                a.req.stop_reason = "cancelled"
                self._finish(a)
                continue
            if exact:
                self._prefill_alone(a)
                continue
            c = min(len(a.req.tokens) - a.pos, room, per)
            if c <= 0:
                continue  # waits for the next pass
            out.append((a, c))
            room -= c
        return out

    def _prefill_alone(self, a: _Active) -> None:
        req = a.req
        assert a.prefill is not None  # only a request whose prompt still loads comes here
        # a prompt that loads in one go, as kvcache's own prefill does, counts as prefilled
        whole = a.pos == a.prefill.reused
        try:
            req.in_flight = True
            logits = self.loop.ctx.decode(req.tokens[a.pos:], a.pos, req.seq_id, logits="last")
            req.in_flight = False
            a.pos = req.n_past = len(req.tokens)
        except BaseException as e:
            self._finish(a, error=e)
            return
        self._prefilled(a, logits, whole=whole)

    def _prefilled(self, a: _Active, logits: FloatArray, whole: bool) -> None:
        assert a.prefill is not None  # its prompt was loading until now
        try:
            pre = a.slot.kv.finish(a.prefill, logits, whole=whole)
            a.prefill = None
            followers, a.followers = a.followers, []
            for f in followers:  # before the first choice's own first token is decoded
                self._copy_prompt(a, f, pre)
            for ev in self.loop.prefilled(a.req, pre):
                self._send(a, ev)
        except BaseException as e:
            self._finish(a, error=e)
            return
        if a.req.stop_reason:
            self._finish(a)

    def _copy_prompt(self, lead: _Active, f: _Active, pre: Prefill) -> None:
        """Choice ``f`` takes the prompt's KV from ``lead``'s sequence (seq_cp: the same
        cells, nothing recomputed) and samples its own first token from the same logits."""

        f.leader = None
        n = len(lead.req.tokens)
        try:
            start = f.slot.kv.start(f.req.tokens, reuse=False)  # empties f's sequence
            self.loop.ctx.seq_cp(lead.req.seq_id, f.req.seq_id, 0, n)
            f.slot.kv.finish(start, pre.logits, whole=False)
            f.req.n_past = n
            # the prompt was reused, not computed, by this choice (its usage says so)
            for ev in self.loop.prefilled(f.req, Prefill(pre.logits.copy(), n, 0, False)):
                self._send(f, ev)
        except BaseException as e:
            self._finish(f, error=e)
            return
        if f.req.stop_reason:
            self._finish(f)

    def _orphan(self, lead: _Active) -> None:
        """``lead`` ended before its prompt was in: its waiting choices load it themselves."""
        followers, lead.followers = lead.followers, []
        for f in followers:
            f.leader = None
            try:
                f.prefill = f.slot.kv.start(f.req.tokens, reuse=f.req.reuse,
                                            prefilled_only=f.req.prefilled_only)
                f.pos = f.req.n_past = f.prefill.reused
            except BaseException as e:
                self._finish(f, error=e)

    def _load_events(self, a: _Active, ps: Pass, rows: int) -> None:
        """A load_yield when the controller declines a draft it has because the pass is
        shared, a load_resume when that request drafts again."""
        if not a.yielding and ps.declined and rows > 0:
            a.yielding = True
            self._control(a, "load_yield", f"drafting held back: {rows} rows of other "
                          "sequences already share this pass")
        elif a.yielding and ps.draft.tokens:
            a.yielding = False
            self._control(a, "load_resume", f"drafting again ({len(ps.draft.tokens)} tokens) "
                          f"with {rows} rows of other sequences in the pass")

    def _control(self, a: _Active, kind: ControlKind, reason: str) -> None:
        a.req.stats.observe_control(kind)
        self._send(a, Control(a.req.id, kind, reason, proposer=a.req.proposer_label))

    def _send(self, a: _Active, ev: Event) -> None:
        for out in self.engine.canary(ev, a.req, a.route, a.ticket.prepared.traffic):
            try:
                a.ticket.on_event(out)
            except Exception:
                a.ticket.cancelled.set()  # a consumer that cannot take events is gone

    def _finish(self, a: _Active, error: BaseException | None = None) -> None:
        """End a request: its last events (or its error), its sequence freed and kept
        for prefix reuse."""
        loop = self.loop
        if a.followers:
            self._orphan(a)
        if a.leader is not None and a in a.leader.followers:
            a.leader.followers.remove(a)  # ended while waiting for the prompt: copy nothing
            a.leader = None
        # ended by close(drain=False, error=...), which told its client
        aborted = self._abort is not None and a.ticket.cancelled.is_set()
        try:
            if error is None and not aborted:
                for ev in loop.end(a.req):
                    self._send(a, ev)
        except BaseException as e:
            error = e
        finally:
            loop.release(a.req)
            a.req.close()
            a.slot.used = time.monotonic()
            # one choice of an n-choice request is enough to continue a conversation from
            a.slot.refresh = a.req.prefilled_only and a.ticket.leader is None
            with self._lock:
                if a in self._active:
                    self._active.remove(a)
                self._seconds.append(time.monotonic() - a.ticket.submitted)
        if error is not None:
            self._fail(a.ticket, error)
        else:
            try:
                a.ticket.on_event(DONE)
            except Exception:
                pass

    def _fail(self, ticket: Ticket, error: BaseException) -> None:
        try:
            ticket.on_event(error)
        except Exception:
            pass
