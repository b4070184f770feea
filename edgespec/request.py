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

Everything a request owns lives in :class:`Request`, so that several can later
share one llama.cpp context as separate sequences.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from . import grammar, sampling, verify
from .grammar import FORCED
from .events import Control, Event, Finished, PrefillDone, RequestStarted, Step, TokenLogprob
from .params import GenerationParams
from .proposers import EMPTY_DRAFT, Draft, ProposerSession
from .stats import RequestStats
from .textstream import TextAssembler


@dataclass
class Request:
    """Everything one request owns."""

    id: int
    params: GenerationParams
    proposer_label: str  # what the request asked for ("none", "suffix", "ngram+suffix", ...)
    tokens: list[int]  # prompt + generated, as the target has them (pending included)
    n_prompt: int
    proposers: dict[str, object] = field(default_factory=dict)  # what to open, by name
    sessions: dict[str, ProposerSession] = field(default_factory=dict)
    costly: frozenset[str] = frozenset()  # sessions that draft only when chosen (draft models)
    controller: object | None = None
    max_draft: int = 0  # candidates are proposed at this length
    seq_id: int = 0
    n_past: int = 0  # positions of `tokens` already in the target's KV cache
    reuse: bool = False  # start from the longest prefix of `tokens` the KV cache already holds
    in_flight: bool = False  # a pass has written positions past n_past that are not trimmed yet
    exact: bool = False  # reuse only positions a prefill wrote (see edgespec.kvcache)
    rng: np.random.Generator | None = None
    grammar: object | None = None  # edgespec.grammar.GrammarState of a constrained request
    stats: RequestStats = field(default_factory=RequestStats)
    text: TextAssembler = field(default_factory=TextAssembler)
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    t0: float = 0.0
    stop_reason: str = ""

    def close(self) -> None:
        completed = self.stop_reason not in ("", "cancelled")
        for s in self.sessions.values():
            s.close(completed)
        self.sessions.clear()
        if self.grammar is not None:
            self.grammar.close()


class Loop:
    """Runs requests against one target context. The engine owns it; it owns no resources."""

    def __init__(self, target, ctx, *, target_name: str, draft_name: str | None, sinks,
                 cancelled, kv=None) -> None:
        from .kvcache import PrefixCache

        self.target, self.ctx = target, ctx
        self.kv = kv if kv is not None else PrefixCache(ctx)  # what the target's KV holds
        self.target_name, self.draft_name = target_name, draft_name
        self.sinks = sinks
        self.cancelled = cancelled  # a threading.Event set by Engine.cancel()

    def serve(self, req: Request) -> Iterator[Event]:
        req.t0 = time.perf_counter()
        yield RequestStarted(req.id, req.n_prompt, req.proposer_label, self.target_name,
                             self.draft_name if any(n in req.costly for n in req.sessions) else None)
        try:
            yield from self._serve(req)
        finally:
            # whatever ended the request (finished, cancelled, the consumer stopped reading,
            # an error between a pass and its trim), the KV cache keeps exactly what it
            # evaluated of the request's tokens, for the next request to reuse
            # (a stop inside an accepted draft leaves drafted positions past the last token)
            keep = min(req.n_past, len(req.tokens))
            try:
                if req.in_flight or keep < req.n_past:
                    self.ctx.trim(req.seq_id, keep)
                self.kv.commit(req.tokens[:keep])
            except Exception:
                self.kv.invalidate()

    def _serve(self, req: Request) -> Iterator[Event]:
        from .control import Outcome, StepView, truncate

        p = req.params
        pre = self.kv.prefill(req.tokens, reuse=req.reuse, exact=req.exact)
        logits = pre.logits
        req.n_past = len(req.tokens)
        # Opening a session indexes the prompt (a draft model prefills it): part of TTFT.
        for n, prop in req.proposers.items():
            if hasattr(prop, "reuse_prefix"):
                prop.reuse_prefix = req.reuse
            req.sessions[n] = prop.open(req.tokens, p.sampling)
        t_prefill = time.perf_counter() - req.t0
        req.stats.observe_prefill(req.n_prompt, t_prefill, reused=pre.reused)
        yield PrefillDone(req.id, req.n_prompt, t_prefill)

        first = self._choose_plain(req, logits[0])
        step = self._emit(req, [first] if first is not None else [], logits[:1], n_acc=0,
                          proposer=None, drafted=0, draft_s=0.0, verify_s=0.0)
        if first is None:
            req.stop_reason = req.stop_reason or "grammar"
        if first is not None:
            for s in req.sessions.values():
                s.accept([first], 0)
        yield step

        while not req.stop_reason:
            if self.cancelled.is_set():
                req.stop_reason = "cancelled"
                break
            remaining = p.max_tokens - len(req.generated)
            room = self.ctx.n_ctx - req.n_past - 1  # positions left after the pending token
            if room < 0:
                req.stop_reason = "context"
                break
            limit = max(0, min(req.max_draft, remaining - 1, room))
            draft, used, t_draft = EMPTY_DRAFT, None, 0.0
            if req.controller is not None:
                t_a = time.perf_counter()
                cands = {n: s.propose(limit) for n, s in req.sessions.items()
                         if n not in req.costly and limit > 0}
                if req.grammar is not None:  # the controller sees only what the grammar admits
                    cands = {n: truncate(c, req.grammar.admissible_prefix(c.tokens))
                             for n, c in cands.items()}
                t_draft = time.perf_counter() - t_a
                # what can still be emitted: the max_tokens budget, or the context's room
                # (the pending token plus `room` drafts)
                d = req.controller.decide(StepView(generated=len(req.generated),
                                                   remaining=min(remaining, room + 1),
                                                   candidates=cands))
                for rec in req.controller.drain_events():
                    req.stats.observe_control(rec.kind)
                    yield Control(req.id, rec.kind, rec.reason,
                                  draft_length=rec.draft_length if rec.draft_length is not None
                                  else d.k, proposer=rec.proposer or d.proposer)
                k = max(0, min(d.k, limit))
                if not d.plain and k > 0:
                    used = d.proposer
                    if used in cands:
                        draft = truncate(cands[used], k)
                    else:
                        t_b = time.perf_counter()
                        draft = req.sessions[used].propose(k)
                        if req.grammar is not None:
                            draft = truncate(draft, req.grammar.admissible_prefix(draft.tokens))
                        t_draft += time.perf_counter() - t_b
                if req.grammar is not None and not draft.tokens and limit > 0:
                    # a literal the grammar forces costs no proposer: draft it
                    t_b = time.perf_counter()
                    forced = req.grammar.forced(limit)
                    t_draft += time.perf_counter() - t_b
                    if forced:
                        draft, used = Draft(tokens=forced, source=FORCED), FORCED
            t_c = time.perf_counter()
            batch = [req.tokens[-1], *draft.tokens]
            req.in_flight = True
            rows = self.ctx.decode(batch, req.n_past, req.seq_id,
                                   logits="all" if draft.tokens else "last")
            n_acc, nxt = self._verify(req, draft, rows)
            req.n_past += 1 + n_acc
            if n_acc < len(draft.tokens):
                self.ctx.trim(req.seq_id, req.n_past)
            req.in_flight = False
            t_verify = time.perf_counter() - t_c
            new = [*draft.tokens[:n_acc], *([] if nxt is None else [nxt])]
            used = used if draft.tokens else None
            if new:  # empty only where the grammar admits nothing more
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
                    verify_seconds=t_verify if mine else 0.0, tokens=tuple(new),
                    confidence=draft.confidence if used and mine else None,
                    match_length=draft.match_length if used and mine else 0))
            yield self._emit(req, new, rows[: n_acc + 1], n_acc=n_acc, proposer=used,
                             drafted=len(draft.tokens), draft_s=t_draft, verify_s=t_verify)
            if nxt is None and not req.stop_reason:
                req.stop_reason = "grammar"  # nothing the grammar admits can come next

        tail = req.text.flush()
        total = time.perf_counter() - req.t0
        req.stats.finish(req.stop_reason, total)
        for sink in self.sinks:
            sink.emit(req.stats)
        if tail:
            yield Step(req.id, (), tail, (), None, 0, 0, 0.0, 0.0, total)
        yield Finished(req.id, req.text.text, tuple(req.generated), req.stop_reason, req.stats,
                       logprobs=tuple(req.logprobs))

    # --- verification ----------------------------------------------------------------
    def _choose_plain(self, req: Request, row: np.ndarray) -> int | None:
        s = req.params.sampling
        if req.grammar is not None:  # None: nothing the grammar admits
            y = grammar.choose(req.grammar, row, req.tokens, s, req.rng)
            if y is not None:
                req.grammar.advance([y])
            return y
        if s.greedy:
            return sampling.greedy_token(row, req.tokens, s)
        return sampling.sample(sampling.distribution(row, req.tokens, s), req.rng)

    def _verify(self, req: Request, draft: Draft, rows: np.ndarray) -> tuple[int, int | None]:
        s = req.params.sampling
        d = draft.tokens
        if not d:
            return 0, self._choose_plain(req, rows[0])
        if req.grammar is not None:
            n, nxt, after = grammar.verify(req.grammar, draft, rows, req.tokens, s, req.rng)
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
        return verify.verify_sampling(d, draft.probs, _TargetRows(rows, req.tokens, d, s), req.rng)

    # --- emission -----------------------------------------------------------------------
    def _emit(self, req: Request, new: list[int], rows, *, n_acc: int, proposer: str | None,
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


class _TargetRows:
    """The target's distributions at each draft position, computed only when read
    (verification stops at the first rejection)."""

    def __init__(self, rows: np.ndarray, history: list[int], draft: Sequence[int], params) -> None:
        self.rows, self.history, self.draft, self.params = rows, history, draft, params

    def __len__(self) -> int:
        return len(self.draft) + 1

    def __getitem__(self, i: int) -> np.ndarray:
        return sampling.distribution(self.rows[i], [*self.history, *self.draft[:i]], self.params)


def logprob(row: np.ndarray, tok: int, top_n: int) -> TokenLogprob:
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.argsort(-x[idx])]
        top = tuple((int(i), float(x[i] - lse)) for i in idx)
    return TokenLogprob(int(tok), float(x[tok] - lse), top)

