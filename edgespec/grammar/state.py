"""Structured output: GBNF grammars and JSON schemas, enforced exactly under speculation.

A request may carry one constraint (``GenerationParams.grammar`` GBNF text,
``.json_schema`` or ``.json_mode``). :func:`constraint_of` turns it into GBNF and
refuses, before any model loads, what cannot be enforced exactly: text llama.cpp's
parser rejects, a schema that is not a valid JSON schema, a schema keyword the
converter (llama-cpp-python's port of llama.cpp's ``json_schema_to_grammar``) would
silently drop. Grammars are llama.cpp's own engine (``runtime.grammar_binding.Grammar``); nothing here
parses GBNF.

Semantics (the same on the plain and the speculative path, so greedy output is equal):

* the constrained distribution at a position is the target's logits with every token
  the grammar does not admit set to ``-inf`` *first*, then the usual processing
  (bias, penalties, top-k/p, min-p, temperature): llama.cpp's ``grammar_first`` order;
* greedy picks the best admissible token (:meth:`GrammarState.best` checks the argmax
  alone first and widens only when the grammar forbids it: exact, and cheap where
  the model already follows the grammar);
* the grammar advances over *emitted* tokens only; verification forks it per draft
  position (:meth:`GrammarState.fork`), so a rejected draft never touches it;
* an end-of-generation token is admissible only where the grammar is complete
  (llama.cpp's rule), and a position with nothing admissible ends the request with
  ``stop_reason == "grammar"``.

Drafting under a grammar: candidates are cut at their first token the grammar forbids
(:meth:`GrammarState.admissible_prefix`), and where the grammar forces a literal (a
fixed key, a closing bracket) :meth:`GrammarState.forced` drafts it at no proposer
cost. "Exactly one admissible *token*" almost never holds with a BPE vocabulary (a
literal ``"name"`` admits ``"``, ``"n``, ``"name`` ...), so forcing is found per
*character*: the grammar is applied to the ~100 single-character tokens only, and a
forced run of characters is tokenized as the model's tokenizer would.
"""
from __future__ import annotations

import time
import weakref
from typing import Sequence

import numpy as np

from ..decoding import sampling
from ..decoding import verify as spec
from ..errors import EdgespecError
from .bounds import LIMITS, GrammarTooComplexError
from .constraint import Constraint, GrammarError

#: longest literal probed per step; longer forced runs continue next step
MAX_FORCED_CHARS = 32

# --- runtime: one request's grammar state ---------------------------------------------------
def _accept(g, token: int, after: int) -> None:
    """``g.accept(token)``, then refuse a grammar whose parse stacks outgrew the limit.

    The static bounds (edgespec.grammar.bounds) cannot see every ambiguity: with
    ``s ::= "a" s "b" | "a" s "c"`` each "a" doubles the stacks, and llama.cpp's cost per
    token is their square (2^16 stacks: 13 s a token, then memory). Checked after every
    accept, so a request stops at no more than twice the limit.
    """
    g.accept(token)
    count = getattr(g, "stacks", None)
    n = count() if count is not None else None
    if n is not None and n > LIMITS.max_stacks:
        raise GrammarTooComplexError(
            f"the grammar is too complex: after {after + 1} tokens it holds {n:,} parse stacks "
            f"(the limit is {LIMITS.max_stacks:,}, max_stacks); it is ambiguous, so the ways "
            "to continue multiply with each token. Make its alternatives start differently.",
            "max_stacks")


_PROBES: "weakref.WeakKeyDictionary[object, tuple[np.ndarray, tuple[bytes, ...], int]]" = \
    weakref.WeakKeyDictionary()


def _probe_tokens(model) -> tuple[np.ndarray, tuple[bytes, ...], int]:
    """The model's single-character tokens for printable ASCII, then its EOG tokens."""
    hit = _PROBES.get(model)
    if hit is None:
        ids, pieces = [], []
        for c in [*(chr(i) for i in range(0x20, 0x7F)), "\n", "\t"]:
            try:
                toks = model.tokenize(c, add_special=False, parse_special=False)
            except (ValueError, EdgespecError):
                continue
            if len(toks) == 1 and model.token_piece(toks[0]) == c.encode() and toks[0] not in ids:
                ids.append(toks[0])
                pieces.append(c.encode())
        n_chars = len(ids)
        ids.extend(t for t in model.eog_tokens if t not in ids)
        hit = (np.asarray(ids, dtype=np.int32), tuple(pieces), n_chars)
        _PROBES[model] = hit
    return hit


class GrammarState:
    """A request's position in its grammar, over the target's vocabulary.

    ``seconds`` accumulates the time spent in grammar work (masking, forks, probes), so
    its cost per step can be reported.
    """

    def __init__(self, grammar, model, clock: list[float] | None = None) -> None:
        self._g = grammar
        self.model = model
        self.accepted = 0  # tokens advanced over (named when the grammar is refused)
        self._all: np.ndarray | None = None
        self._clock = clock if clock is not None else [0.0]

    @classmethod
    def open(cls, constraint: Constraint, model) -> "GrammarState":
        """A fresh state; refuses a grammar that admits no token of this vocabulary at all."""
        try:
            g = model.grammar(constraint.gbnf, constraint.root)
        except EdgespecError as e:
            raise GrammarError(str(e)) from None
        st = cls(g, model)
        if not st._g.allowed(np.arange(model.n_vocab, dtype=np.int32)).any():
            st.close()
            raise GrammarError(f"the grammar admits no token of {model.path.name}'s vocabulary "
                               "at its start, so nothing could be generated; check its root rule")
        return st

    @property
    def seconds(self) -> float:
        return self._clock[0]

    # --- choosing ---------------------------------------------------------------------
    def best(self, x: np.ndarray) -> int | None:
        """argmax of ``x`` over the admissible tokens (lowest id on ties), None if none is."""
        t0 = time.perf_counter()
        try:
            top = int(np.argmax(x))
            if not np.isfinite(x[top]):
                return None
            if self._g.allowed(np.array([top], dtype=np.int32))[0]:
                return top
            n = x.shape[0]
            width = 64
            while True:
                if width >= n:
                    ids = np.flatnonzero(np.isfinite(x))
                else:
                    # every id at or above the width-th best value: ties at the cut stay in
                    thr = np.partition(x, n - width)[n - width]
                    ids = np.flatnonzero(x >= thr)
                    ids = ids[np.isfinite(x[ids])]
                ok = self._g.allowed(ids.astype(np.int32))
                if ok.any():
                    cand = ids[ok]
                    return int(cand[np.argmax(x[cand])])
                if width >= n:
                    return None
                width *= 16
        finally:
            self._clock[0] += time.perf_counter() - t0

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A float64 copy of ``logits`` with every token the grammar forbids at ``-inf``."""
        t0 = time.perf_counter()
        if self._all is None:
            self._all = np.arange(logits.shape[0], dtype=np.int32)
        out = np.array(logits, dtype=np.float64, copy=True)
        out[~self._g.allowed(self._all)] = -np.inf
        self._clock[0] += time.perf_counter() - t0
        return out

    # --- drafting ---------------------------------------------------------------------
    def admissible_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar admits in order (an EOG token ends it)."""
        if not tokens:
            return 0
        t0 = time.perf_counter()
        g = self._g.clone()
        try:
            for i, t in enumerate(tokens):
                if not g.allowed(np.array([t], dtype=np.int32))[0]:
                    return i
                if self.model.is_eog(t):
                    return i + 1
                _accept(g, t, i)
            return len(tokens)
        finally:
            g.close()
            self._clock[0] += time.perf_counter() - t0

    def forced(self, max_tokens: int) -> tuple[int, ...]:
        """Tokens of the literal the grammar forces next, at most ``max_tokens`` (maybe none).

        The last token of a run that the grammar leaves open is dropped: the model's own
        tokenization may merge it with what follows (``"`` + ``:`` -> ``":``).
        """
        if max_tokens <= 0:
            return ()
        t0 = time.perf_counter()
        ids, pieces, n_chars = _probe_tokens(self.model)
        g = self._g.clone()
        text = b""
        closed = False
        try:
            while len(text) < MAX_FORCED_CHARS:
                ok = np.flatnonzero(g.allowed(ids))
                if ok.shape[0] != 1:
                    break
                if ok[0] >= n_chars:  # only end-of-generation: the grammar is complete
                    closed = True
                    break
                _accept(g, int(ids[ok[0]]), len(text))
                text += pieces[ok[0]]
        finally:
            g.close()
        toks: tuple[int, ...] = ()
        if text:
            toks = tuple(self.model.tokenize(text.decode("ascii"), add_special=False,
                                             parse_special=False))
            if not closed:
                toks = toks[:-1]
            toks = toks[:max_tokens]
        self._clock[0] += time.perf_counter() - t0
        if toks:
            toks = toks[: self.admissible_prefix(toks)]
        return toks

    # --- advancing --------------------------------------------------------------------
    def advance(self, tokens: Sequence[int]) -> None:
        """Accept emitted tokens (EOG tokens end a request and are not accepted)."""
        t0 = time.perf_counter()
        for t in tokens:
            if self.model.is_eog(t):
                continue
            # llama.cpp aborts the process on a token its grammar forbids: check first
            if not self._g.allowed(np.array([t], dtype=np.int32))[0]:
                raise EdgespecError(f"internal error: token {t} was emitted against the grammar")
            _accept(self._g, int(t), self.accepted)
            self.accepted += 1
        self._clock[0] += time.perf_counter() - t0

    def fork(self) -> "GrammarState":
        """An independent copy at the same position (shares the cost clock)."""
        t0 = time.perf_counter()
        st = GrammarState(self._g.clone(), self.model, self._clock)
        st._all, st.accepted = self._all, self.accepted
        self._clock[0] += time.perf_counter() - t0
        return st

    def close(self) -> None:
        if self._g is not None:
            self._g.close()
            self._g = None


# --- the grammar's side of verification (edgespec.loop.request calls these) ---------------------
#: the label of steps whose draft is the grammar's forced literal
FORCED = "grammar"


class NothingAdmissible(Exception):
    """No token is admissible (nothing the grammar allows survives the sampling settings)."""


def cut(state: GrammarState, draft, greedy: bool):
    """The part of ``draft`` worth verifying under the grammar: its admissible prefix.

    A draft that carries the distributions it was *sampled* from (a draft model under
    sampling) keeps its first inadmissible token too. Verification rejects that token
    (the masked target gives it no mass) and draws the position from the residual
    max(0, p - q): that is what makes the emitted token distributed as p. Cutting it away
    would draw the position from p instead, having already seen q put the draw outside
    the grammar, and over-weight what q rarely proposes. A point-mass draft (n-gram,
    suffix, forced literals) has residual p there, so cutting changes nothing; neither
    does greedy verification.
    """
    n = state.admissible_prefix(draft.tokens)
    if n < len(draft.tokens) and draft.probs is not None and not greedy:
        n += 1
    return draft.head(n)


def choose(state: GrammarState, row: np.ndarray, history: Sequence[int], params,
           rng) -> int | None:
    """The plain path's constrained choice at one position (None: nothing admissible)."""
    if params.greedy:
        return state.best(sampling.greedy_logits(row, history, params))
    try:
        return sampling.sample(distribution(state, row, history, params), rng)
    except NothingAdmissible:
        return None


def distribution(state: GrammarState, row: np.ndarray, history: Sequence[int],
                 params) -> np.ndarray:
    """The constrained distribution: mask first, then llama.cpp's processing chain."""
    masked = state.mask(row)
    try:
        return sampling.distribution(masked, history, params)
    except ValueError:  # every token masked or banned
        raise NothingAdmissible() from None


def verify(state: GrammarState, draft, rows: np.ndarray, history: Sequence[int], params,
           rng) -> tuple[int, int | None, GrammarState]:
    """Verify ``draft`` under the grammar: (accepted, next token or None, state after them).

    Row ``i`` is judged at the grammar's position after ``draft[:i]`` (a fork of
    ``state``, which is left untouched), so each row is exactly the plain path's
    constrained choice there. The returned state has accepted the accepted drafts and
    the next token; the caller replaces its state with it.
    """
    d = draft.tokens
    work = state.fork()
    try:
        if params.greedy:
            ys: list[int] = []
            for i in range(len(d) + 1):
                y = choose(work, rows[i], [*history, *d[:i]], params, None)
                if y is None:
                    return i, None, work
                ys.append(y)
                if i == len(d) or y != d[i]:
                    break
                work.advance([y])
            n, nxt = spec.verify_greedy(d, ys)
        else:
            target = _ConstrainedRows(work, rows, history, d, params)
            try:
                n, nxt = spec.verify_sampling(d, draft.probs, target, rng)
            except NothingAdmissible:
                return target.at, None, work
            target.advance_to(n)
        work.advance([nxt])
        return n, nxt, work
    except BaseException:
        work.close()
        raise


class _ConstrainedRows:
    """Constrained target distributions per draft position, computed in order when read."""

    def __init__(self, state: GrammarState, rows, history, draft, params) -> None:
        self.state, self.rows, self.history, self.draft, self.params = \
            state, rows, history, draft, params
        self.at = 0  # the state has accepted draft[:at]

    def advance_to(self, i: int) -> None:
        self.state.advance(self.draft[self.at:i])
        self.at = max(self.at, i)

    def __len__(self) -> int:
        return len(self.draft) + 1

    def __getitem__(self, i: int) -> np.ndarray:
        self.advance_to(i)
        return distribution(self.state, self.rows[i], [*self.history, *self.draft[:i]],
                            self.params)
