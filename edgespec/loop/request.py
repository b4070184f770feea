"""One request through the speculative loop: prefill, then propose -> verify -> accept.

    prefill the prompt once -> the target's first token is *pending*
    repeat:
        every free proposer drafts a candidate (microseconds each)
        the controller picks a proposer (or none) and a draft length k
        the chosen candidate is cut to k (a costly proposer drafts k only now)
        ONE target pass over [pending, d1..dk] with logits at every position
        verification accepts a prefix d1..dn and yields the target's own token y
        rejected positions are trimmed from the target's KV cache (and the draft's)
        the controller observes the outcome; d1..dn, y are emitted; y becomes pending

With k = 0 this is exactly the plain path, so ``--proposer none`` and the
speculative modes share every line except the proposal.

Everything a request owns lives in :class:`~edgespec.loop.state.Request`, so that several
share one llama.cpp context as separate sequences.
"""
from __future__ import annotations

import time
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from ..grammar import state as grammar
from ..grammar.state import FORCED
from ..api.events import Control, Event, Finished, PrefillDone, RequestStarted, Step, TokenLogprob
from ..api.arrays import FloatArray
from ..api.params import SamplingParams
from ..api.stats import StatsSink
from ..control import Controller, Outcome, StepView, reproducible
from ..control.limit import draft_limit
from ..decoding import sampling, verify
from ..decoding.kvcache import Prefill, PrefixCache
from ..proposers import EMPTY_DRAFT, Draft
from ..proposers.base import Remembers, ReusesPrefix
from . import treepass
from .state import Load, Pass, Request

if TYPE_CHECKING:
    from ..proposers.bridged_draft import BridgeTimes
    from ..runtime.context import Context
    from ..runtime.model import Model


class Loop:
    """Runs requests against one target context. The engine owns it; it owns no resources.

    A request goes through phases that a scheduler can interleave with other requests'
    (:mod:`edgespec.serving.scheduler` runs several in one ``llama_decode`` per step):

        begin(req)        prefill, open proposer sessions, the first token   (events)
                          (or the prefill in chunks by the scheduler, then prefilled(req, pre))
        plan(req, load)   propose, decide, cut the draft: a Pass, or None when it ended
        complete(pass, rows, seconds)   verify, trim, accept, observe, emit  (a Step)
        end(req)          flush the text, finish the stats                   (events)
        release(req)      leave the KV cache holding what the request evaluated

    :meth:`serve` runs one request through them alone.
    """

    def __init__(self, target: Model, ctx: Context, *, target_name: str,
                 draft_name: str | None, sinks: Sequence[StatsSink],
                 cancelled: threading.Event, kv: PrefixCache | None = None) -> None:

        self.target, self.ctx = target, ctx
        self.kv = kv if kv is not None else PrefixCache(ctx)  # what the target's KV holds
        self.target_name, self.draft_name = target_name, draft_name
        self.sinks = sinks
        self.cancelled = cancelled  # a threading.Event set by Engine.cancel()
        #: the context's sequences set aside for draft-tree branches (the engine sets them;
        #: none: trees are off; edgespec.loop.treepass)
        self.tree_seqs: tuple[int, ...] = ()

    def started(self, req: Request) -> RequestStarted:
        req.t0 = time.perf_counter()
        return RequestStarted(req.id, req.n_prompt, req.proposer_label, self.target_name,
                              self.draft_name if any(n in req.costly for n in req.sessions)
                              or any(n in req.costly for n in req.proposers) else None)

    def serve(self, req: Request) -> Iterator[Event]:
        yield self.started(req)
        try:
            yield from self.begin(req)
            while not req.stop_reason:
                ps = self.next_pass(req)
                yield from ps.events if ps is not None else ()
                if ps is None:
                    break
                t_c = time.perf_counter()
                req.in_flight = True
                rows = (treepass.decode(self, ps) if ps.tree is not None else
                        self.ctx.decode(ps.tokens, req.n_past, req.seq_id, logits=ps.logits))
                yield self.complete(ps, rows, time.perf_counter() - t_c)
            yield from self.end(req)
        finally:
            self.release(req)

    def release(self, req: Request) -> None:
        """Whatever ended the request (finished, cancelled, the consumer stopped reading,
        an error between a pass and its trim), the KV cache keeps exactly what it
        evaluated of the request's tokens, for the next request to reuse (a stop inside an
        accepted draft leaves drafted positions past the last token)."""
        kv = req.kv if req.kv is not None else self.kv
        keep = min(req.n_past, len(req.tokens))
        try:
            if req.in_flight or keep < req.n_past:
                self.ctx.trim(req.seq_id, keep)
            req.in_flight = False
            kv.commit(req.tokens[:keep])
        except Exception:
            kv.invalidate()

    def begin(self, req: Request) -> Iterator[Event]:
        kv = req.kv if req.kv is not None else self.kv
        pre = kv.prefill(req.tokens, reuse=req.reuse, prefilled_only=req.prefilled_only)
        yield from self.prefilled(req, pre)

    def prefilled(self, req: Request, pre: Prefill) -> Iterator[Event]:
        """After the prompt is in the KV cache (``pre``: an edgespec.decoding.kvcache.Prefill, whose
        logits are the last prompt token's): open the proposer sessions, emit the first token."""
        p = req.params
        logits = pre.logits
        req.n_past = len(req.tokens)
        opened = p.sampling
        if not opened.greedy:
            # a draft model couples to the request's uniforms: it needs the seed they are
            # keyed by, the fresh one included (sampling's RNG policy)
            opened = replace(opened, seed=req.uniforms().seed)
        # what other requests taught a proposer must not shape a reproducible request's
        # passes (base.Remembers); --exact's text is the plain path's whatever they are
        recall = not reproducible(p.sampling.greedy, p.sampling.seed, req.exact)
        # Opening a session indexes the prompt (a draft model prefills it): part of TTFT.
        for n, prop in req.proposers.items():
            if isinstance(prop, ReusesPrefix):
                prop.reuse_prefix = req.reuse
            if isinstance(prop, Remembers):
                prop.recall = recall
            req.sessions[n] = prop.open(req.tokens, opened)
        t_prefill = time.perf_counter() - req.t0
        req.stats.observe_prefill(req.n_prompt, t_prefill, reused=pre.reused)
        yield PrefillDone(req.id, req.n_prompt, t_prefill)

        first = self._choose_plain(req, logits[0])
        step = self.emit(req, [first] if first is not None else [], logits[:1], n_acc=0,
                          proposer=None, drafted=0, draft_s=0.0, verify_s=0.0)
        if first is None:
            req.stop_reason = req.stop_reason or "grammar"
        if first is not None:
            for s in req.sessions.values():
                s.accept([first], 0)
        yield step

    def next_pass(self, req: Request, load: Load | None = None) -> Pass | None:
        """The request's part of the next pass, or None when it ends here (cancelled, out
        of context). ``load`` describes the rest of the step when other sequences share it."""
        if req.stop_reason:
            return None
        if self.cancelled.is_set() or (req.cancel is not None and req.cancel.is_set()):
            req.stop_reason = "cancelled"
            return None
        p = req.params
        remaining = p.max_tokens - len(req.generated)
        room = self.ctx.n_ctx - req.n_past - 1  # positions left after the pending token
        if room < 0:
            req.stop_reason = "context"
            return None
        limit = draft_limit(req.max_draft, remaining, room)
        if load is not None:
            limit = min(limit, max(0, load.max_rows - 1))
        ps = Pass(req, EMPTY_DRAFT, None, 0.0, [])
        if req.controller is not None:
            # what can still be emitted: the max_tokens budget, or the context's room
            # (the pending token plus `room` drafts)
            self._choose_draft(ps, req.controller, limit, min(remaining, room + 1), load)
        if not ps.draft.tokens:
            ps.used = None
        if load is None and ps.draft.tokens and req.grammar is None:
            treepass.branch(self, ps, limit)  # alone in its pass: a tree where one pays
        return ps

    def _choose_draft(self, ps: Pass, controller: Controller, limit: int, remaining: int,
                      load: Load | None) -> None:
        """Fill ``ps`` with the controller's choice: every free proposer drafts a candidate,
        the controller decides, the chosen one is cut to its length (a costly proposer
        drafts only now); failing that, a literal the grammar forces."""
        req = ps.req
        greedy = req.params.sampling.greedy
        t_a = time.perf_counter()
        cands = {n: s.propose(limit) for n, s in req.sessions.items()
                 if n not in req.costly and limit > 0}
        if req.grammar is not None:  # the controller sees only what the grammar admits
            cands = {n: grammar.cut(req.grammar, c, greedy) for n, c in cands.items()}
        ps.draft_seconds = time.perf_counter() - t_a
        view = StepView(generated=len(req.generated), remaining=remaining, candidates=cands)
        if load is not None:
            view = replace(view, batch_rows=load.rows, batch_tokens=load.tokens)
        d = controller.decide(view)
        for rec in controller.drain_events():
            req.stats.observe_control(rec.kind)
            ps.events.append(Control(req.id, rec.kind, rec.reason,
                                     k=rec.k if rec.k is not None else d.k,
                                     proposer=rec.proposer or d.proposer))
        k = max(0, min(d.k, limit))
        ps.declined = d.plain and any(len(c) for c in cands.values())
        if d.proposer is not None and not d.plain and k > 0:
            if d.expected_tokens:
                ps.expected = float(d.expected_tokens)
            ps.used = d.proposer
            if d.proposer in cands:
                ps.draft = cands[d.proposer].head(k)
            else:
                t_b = time.perf_counter()
                ps.draft = req.sessions[d.proposer].propose(k)
                if req.grammar is not None:
                    ps.draft = grammar.cut(req.grammar, ps.draft, greedy)
                ps.draft_seconds += time.perf_counter() - t_b
        if req.grammar is not None and not ps.draft.tokens and limit > 0:
            # a literal the grammar forces costs no proposer: draft it
            t_b = time.perf_counter()
            forced = req.grammar.forced(limit)
            ps.draft_seconds += time.perf_counter() - t_b
            if forced:
                ps.draft, ps.used = Draft(tokens=forced, source=FORCED), FORCED

    def complete(self, ps: Pass, rows: FloatArray, verify_seconds: float) -> Step:
        """Verify a pass's rows (the target's logits at the pending token and each draft
        position), trim the rejected positions, and emit what was accepted."""
        if ps.tree is not None:
            return treepass.complete(self, ps, rows, verify_seconds)
        req, draft, used, t_draft = ps.req, ps.draft, ps.used, ps.draft_seconds
        n_acc, nxt = self._verify(req, draft, rows)
        req.n_past += 1 + n_acc
        if n_acc < len(draft.tokens):
            self.ctx.trim(req.seq_id, req.n_past)
        req.in_flight = False
        new = [*draft.tokens[:n_acc], *([] if nxt is None else [nxt])]
        if new:  # empty only where the grammar admits nothing more
            for s in req.sessions.values():  # a lookahead session's Jacobi rows
                if isinstance(s, _ObservesPasses):
                    s.observe_pass(ps.tokens, rows)
            for n, s in req.sessions.items():
                s.accept(new, n_acc if n == used else 0)
        if req.controller is not None:
            # a forced literal is no proposer's draft: the controller sees a step
            # without timing evidence, so neither its cost curve nor a proposer's
            # acceptance is skewed
            mine = used != FORCED
            req.controller.observe(Outcome(
                proposer=used if mine else None, drafted=len(draft.tokens) if mine else 0,
                accepted=n_acc if mine else 0, draft_seconds=t_draft,
                verify_seconds=verify_seconds if mine else 0.0, tokens=tuple(new),
                confidence=draft.confidence if used and mine else None,
                match_length=draft.match_length if used and mine else 0,
                batch_rows=ps.batch_rows))
        step = self.emit(req, new, rows[: n_acc + 1], n_acc=n_acc, proposer=used,
                          drafted=len(draft.tokens), draft_s=t_draft, verify_s=verify_seconds)
        if nxt is None and not req.stop_reason:
            req.stop_reason = "grammar"  # nothing the grammar admits can come next
        return step

    def end(self, req: Request) -> Iterator[Event]:
        for sess in req.sessions.values():  # a bridged draft's own alignment work
            if isinstance(sess, _Bridged):
                req.stats.bridge_seconds += sess.times.bridge_seconds
                req.stats.bridge_steps += sess.times.steps
        reason = req.stop_reason
        # every way out of the loop (serve, the scheduler) sets the reason before end()
        assert reason, f"request {req.id} ended without a stop reason"
        tail = req.text.flush()
        total = time.perf_counter() - req.t0
        req.stats.finish(reason, total)
        for sink in self.sinks:
            sink.emit(req.stats)
        if tail:
            yield Step(req.id, (), tail, (), None, 0, 0, 0.0, 0.0, total)
        yield Finished(req.id, req.text.text, tuple(req.generated), reason, req.stats,
                       logprobs=tuple(req.logprobs))

    # --- verification ----------------------------------------------------------------
    def _choose_plain(self, req: Request, row: FloatArray) -> int | None:
        s = req.params.sampling
        if req.logits_processor is not None:
            row = np.asarray(req.logits_processor(np.asarray(req.tokens, dtype=np.intc),
                                                  np.array(row, dtype=np.float32)),
                             dtype=np.float32)
        if req.grammar is not None:  # None: nothing the grammar admits
            y = grammar.choose(req.grammar, row, req.tokens, s,
                               None if s.greedy else req.generator)
            if y is not None:
                req.grammar.advance([y])
            return y
        if s.greedy:
            return sampling.greedy_token(row, req.tokens, s)
        return sampling.sample_at(sampling.distribution(row, req.tokens, s),
                                  req.uniforms().at(len(req.generated)))

    def _verify(self, req: Request, draft: Draft, rows: FloatArray) -> tuple[int, int | None]:
        s = req.params.sampling
        d = draft.tokens
        if not d:
            return 0, self._choose_plain(req, rows[0])
        n0 = len(req.generated)  # the position of d[0]
        if req.grammar is not None:
            rng = None if s.greedy else (req.generator if draft.probs is None
                                         else req.uniforms().step(n0))
            n, nxt, after = grammar.verify(req.grammar, draft, rows, req.tokens, s, rng)
            req.grammar.close()
            req.grammar = after
            return n, nxt
        if s.greedy:
            # Row i predicts the token after d[:i]; stop at the first disagreement.
            ys = []
            for i in range(len(d) + 1):
                ys.append(sampling.greedy_token(rows[i], [*req.tokens, *d[:i]], s))
                if i < len(d) and ys[i] != d[i]:
                    break
            return verify.verify_greedy(d, ys)
        # point masses and coupled draft models read the uniforms keyed by position; a
        # drafter that hands distributions gets rejection sampling on the step's own stream
        return verify.verify_sampling(d, draft.probs, _TargetRows(rows, req.tokens, d, s),
                                      req.generator if draft.probs is None
                                      else req.uniforms().step(n0))

    # --- emission -----------------------------------------------------------------------
    def emit(self, req: Request, new: list[int], rows: FloatArray, *, n_acc: int, proposer: str | None,
              drafted: int, draft_s: float, verify_s: float) -> Step:
        """Append verified tokens one by one, honouring EOG, stop strings and max_tokens."""
        p = req.params
        out_tokens: list[int] = []
        origins: list[str] = []
        lps: list[TokenLogprob] = []
        pieces: list[str] = []
        for i, tok in enumerate(new):
            if self.target.is_eog(tok):
                req.stop_reason = "eos"
                break
            req.tokens.append(tok)
            req.generated.append(tok)
            out_tokens.append(tok)
            origins.append("draft" if i < n_acc else "target")
            if p.logprobs is not None:
                lp = logprob(rows[i], tok, p.logprobs)
                lps.append(lp)
                req.logprobs.append(lp)
            pieces.append(req.text.push(self.target.token_piece(tok)))
            if req.text.stopped:
                req.stop_reason = "stop"
                break
            if len(req.generated) >= p.max_tokens:
                req.stop_reason = "length"
                break
        # The pending token is the last of `new`; it is in `tokens` but not yet in the KV cache
        # (it was emitted above, or the request ended).
        elapsed = time.perf_counter() - req.t0
        req.stats.observe_step(proposer=proposer, drafted=drafted, accepted=n_acc,
                               emitted=len(out_tokens), draft_seconds=draft_s,
                               verify_seconds=verify_s, elapsed=elapsed)
        return Step(req.id, tuple(out_tokens), "".join(pieces), tuple(origins), proposer, drafted,
                    n_acc, draft_s, verify_s, elapsed, logprobs=tuple(lps), pieces=tuple(pieces))


@runtime_checkable
class _Bridged(Protocol):
    """A session that keeps its vocabulary bridge's own times (a bridged draft's)."""

    @property
    def times(self) -> BridgeTimes: ...


@runtime_checkable
class _ObservesPasses(Protocol):
    """A session that reads the target's rows of each linear pass before accept (lookahead:
    the rows past the first rejection are its Jacobi step)."""

    def observe_pass(self, tokens: Sequence[int], rows: FloatArray) -> None: ...


class _TargetRows:
    """The target's distributions at each draft position, computed only when read
    (verification stops at the first rejection)."""

    def __init__(self, rows: FloatArray, history: list[int], draft: Sequence[int],
                 params: SamplingParams) -> None:
        self.rows, self.history, self.draft, self.params = rows, history, draft, params

    def __len__(self) -> int:
        return len(self.draft) + 1

    def __getitem__(self, i: int) -> FloatArray:
        return sampling.distribution(self.rows[i], [*self.history, *self.draft[:i]], self.params)


def logprob(row: FloatArray, tok: int, top_n: int) -> TokenLogprob:
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.argsort(-x[idx])]
        top = tuple((int(i), float(x[i] - lse)) for i in idx)
    return TokenLogprob(int(tok), float(x[tok] - lse), top)

