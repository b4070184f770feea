"""A GGUF draft model that shares the target's vocabulary.

The draft keeps its own KV cache in step with the accepted sequence instead of
re-reading it every step: after each verification only the rejected tail is
trimmed, and the tokens it has not seen yet (at most the target's own token and
the last draft token) are fed with the next proposal.

Under sampling the draft is *coupled* to the target (decoding/sampling.py's RNG
policy): its token at generated position ``n`` is the inverse-CDF draw of its own
distribution with the request's uniform ``u(seed, n)``, the one the target's token
there is drawn with, and its drafts go out as point masses (``probs=None``):
verification accepts a token iff the target drew the same one, so the text never
depends on what or how much the draft proposed.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from ..errors import IncompatibleDraftError
from ..api.params import SamplingParams
from .base import EMPTY_DRAFT, Draft
from ..decoding.kvcache import common_prefix
from ..decoding.sampling import KeyedUniforms, Uniforms, distribution, sample_at
from ..decoding.tree import DraftTree
from ..runtime.kernel import KernelConfig
from ..api.arrays import FloatArray
from .vocab_check import vocab_mismatch

if TYPE_CHECKING:
    from ..runtime.model import Model

#: per drafted position: (the greedy logits row, or the sampling distribution), one is None
_Row = tuple[Optional[FloatArray], Optional[FloatArray]]


class DraftModelProposer:
    name = "draft"
    costly = True

    def __init__(self, model: Model, n_ctx: int, n_threads: int | None = None, n_batch: int = 0,
                 kernel: KernelConfig | None = None, target_vocab: int | None = None) -> None:
        k = kernel or KernelConfig()
        self.model = model
        #: the target's vocabulary size: a padded pair differs by up to 128 ids
        self.target_vocab = int(target_vocab or model.n_vocab)
        self.ctx = model.new_context(n_ctx=n_ctx, n_batch=n_batch or k.n_batch, n_threads=n_threads,
                                     flash_attn=int(k.flash_attn), type_k=k.kv_ggml_type,
                                     type_v=k.kv_ggml_type)
        self.seconds_per_token = 0.0  # running estimate, read by the controller
        self._busy = False
        #: set per request by the engine: start from the longest prefix the KV cache holds
        self.reuse_prefix = False
        self._held: list[int] = []  # what the draft's KV cache holds between requests
        self.last_reused = 0

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "DraftSession":
        if self._busy:
            raise RuntimeError("the draft model serves one request at a time")
        self._busy = True
        session = DraftSession(self, list(prompt_tokens), sampling)
        # the last prompt token is fed with the first proposal, so it is never reused
        n = min(common_prefix(self._held, session.seq), len(session.seq) - 1) \
            if self.reuse_prefix else 0
        self._held = []
        try:
            if n == 0:
                self.ctx.clear()
            else:
                self.ctx.trim(0, n)
            # Prefill now, not in the first propose(): it is part of the time to first token.
            if len(session.seq) - 1 > n:
                self.ctx.decode(session.seq[n:-1], n, logits="none")
            session.kv_len = max(len(session.seq) - 1, 0)
        except BaseException:
            self.ctx.clear()
            self._busy = False
            raise
        self.last_reused = n
        return session

    def _release(self) -> None:
        self._busy = False

    def close(self) -> None:
        self.ctx.close()


class DraftSession:
    def __init__(self, owner: DraftModelProposer, tokens: list[int], sampling: SamplingParams) -> None:
        self.owner = owner
        self.seq = tokens  # the accepted sequence, as the target sees it
        self.kv_len = 0  # how many of seq are in the draft's KV cache
        self.sampling = sampling
        self.pending: list[int] = []  # last proposal, to match against accepted tokens
        # that Draft, its per-position (logits, distribution) rows
        self._last: tuple[Draft, list[_Row]] | None = None
        self.n_prompt = len(tokens)  # generated position n is seq[n_prompt + n]
        #: the request's uniforms (the loop opens sessions with the seed it resolved)
        self._keys = None if sampling.greedy else KeyedUniforms(sampling.seed)

    def propose(self, k: int) -> Draft:
        return self._propose(k, 0)[0]

    def propose_tree(self, k: int, max_children: int = 4) -> DraftTree:
        """The linear draft as the first branch, plus at every position the draft's next
        most probable tokens (up to ``max_children - 1``) as leaves beside it: where the
        draft hesitates, a second guess rides in the same target pass. Node confidences are
        path probabilities under the draft. The leaves cost no draft decode."""
        n_alts = max(0, max_children - 1)
        if self.pending and self._last is not None:
            # the linear draft of this step is already decoded (the tree is no deeper than
            # it; drafting on would decode again): its rows give the leaves
            draft, rows = self._last
            draft = Draft(tokens=draft.tokens[:k], confidence=(draft.confidence or ())[:k],
                          source="draft")
            alts = [_runners_up(lg, p, t, n_alts) for (lg, p), t in zip(rows, draft.tokens)]
        else:
            draft, alts = self._propose(k, n_alts)
        if not draft.tokens:
            return DraftTree((), ())
        toks, conf = list(draft.tokens), list(draft.confidence or (0.0,) * len(draft.tokens))
        path_p, acc = [], 1.0
        for c in conf:
            acc *= c
            path_p.append(acc)
        paths, confs = [toks], [path_p]
        for i, options in enumerate(alts):
            before = path_p[i - 1] if i else 1.0
            for tok, pr in options:
                paths.append([*toks[:i], tok])
                confs.append([*path_p[:i], before * pr])
        return DraftTree.from_paths(paths, confs, source="draft")

    def _propose(self, k: int, n_alts: int) -> tuple[Draft, list[list[tuple[int, float]]]]:
        ctx = self.owner.ctx
        alts: list[list[tuple[int, float]]] = []
        if k <= 0 or len(self.seq) + k >= ctx.n_ctx:
            self.pending = []
            return EMPTY_DRAFT, alts
        t0 = time.perf_counter()
        feed = self.seq[self.kv_len:]
        nv = self.owner.model.n_vocab
        if any(t >= nv for t in feed):
            # the target (a padded vocabulary) emitted an id this draft lacks: the draft
            # cannot read on, so it stops drafting for the rest of this request
            self.pending = []
            return EMPTY_DRAFT, alts
        fit = self.owner.target_vocab
        logits = fit_row(ctx.decode(feed, self.kv_len, logits="last")[0], fit)
        self.kv_len = len(self.seq)
        tokens: list[int] = []
        conf: list[float] = []
        rows: list[_Row] = []
        history = list(self.seq)
        n0 = len(self.seq) - self.n_prompt  # the generated position of the first draft
        for i in range(k):
            tok, p, c = self._choose(logits, history, n0 + i)
            tokens.append(tok)
            conf.append(c)
            rows.append((logits if p is None else None, p))  # decode gave a fresh array
            if n_alts:
                alts.append(_runners_up(logits if p is None else None, p, tok, n_alts))
            history.append(tok)
            if i + 1 < k:
                logits = fit_row(ctx.decode([tok], self.kv_len + i, logits="last")[0], fit)
        dt = time.perf_counter() - t0
        n_decoded = max(len(feed), 1) + k - 1
        est = dt / n_decoded
        o = self.owner
        o.seconds_per_token = est if o.seconds_per_token == 0 else 0.8 * o.seconds_per_token + 0.2 * est
        self.pending = tokens
        # coupled draws are verified as point masses (probs=None), by position
        draft = Draft(tokens=tuple(tokens), probs=None, confidence=tuple(conf), source="draft")
        self._last = (draft, rows)
        return draft, alts

    def _choose(self, logits: FloatArray, history: list[int],
                n: int) -> tuple[int, FloatArray | None, float]:
        return choose_token(logits, history, self.sampling,
                            None if self._keys is None else self._keys.at(n))

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        if self.pending:
            # propose() left seq + pending[:-1] in the KV cache; keep the accepted part.
            keep = len(self.seq) + min(n_drafted_accepted, len(self.pending) - 1)
            self.owner.ctx.trim(0, keep)
            self.kv_len = keep
        self.seq.extend(int(t) for t in tokens)
        self.pending = []
        self._last = None

    def close(self, completed: bool) -> None:  # noqa: ARG002
        # a proposal not yet accepted left its tokens past kv_len: drop them, so the KV
        # holds exactly seq[:kv_len] for the next request to reuse
        try:
            if self.pending:
                self.owner.ctx.trim(0, self.kv_len)
            self.owner._held = self.seq[:self.kv_len]
        except Exception:
            self.owner._held = []
        self.pending = []
        self.owner._release()


def _runners_up(logits: FloatArray | None, p: FloatArray | None, chosen: int,
                n: int) -> list[tuple[int, float]]:
    """The ``n`` most probable tokens other than ``chosen``, with their probabilities (from
    the sampling distribution ``p``, or the softmax of greedy ``logits``: one is given)."""
    if p is None:
        if logits is None:
            raise ValueError("_runners_up needs the logits or the distribution")
        x = logits.astype(np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
    idx = np.argpartition(-p, n)[:n + 1]
    idx = idx[np.argsort(-p[idx])]
    return [(int(t), float(p[t])) for t in idx if int(t) != chosen and p[t] > 0][:n]


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose token ids do not mean the same text as the target's.

    llama.cpp's rule (:mod:`.vocab_check`): sizes within 128 (padded vocabularies pair),
    the same BOS/EOS/EOG, every token's text and attributes equal from id 5 on over the
    shorter vocabulary; the message names the first difference.
    """
    why = vocab_mismatch(target, draft)
    if why is not None:
        raise IncompatibleDraftError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {why}. Pick a "
            "draft of the same family (see `edgespec models list`), --proposer bridge for a pair "
            "pinned across tokenizers, or --proposer ngram/suffix.")


def choose_token(logits: FloatArray, history: list[int], sampling: SamplingParams,
                 u: float | Uniforms | None) -> tuple[int, FloatArray | None, float]:
    """A model draft's next token from its logits: (token, its sampling distribution or None
    when greedy, the confidence the controller weighs). ``u`` is the position's keyed
    uniform (the target's own at that position: a coupled draw), or a generator to draw
    one from (a drafter that is verified by rejection sampling), None when greedy."""
    if u is None:
        # greedy verification only needs the draft's best guess; its softmax mass
        # at that token is the confidence the controller weighs
        tok = int(np.argmax(logits))
        m = float(logits[tok])
        conf = 1.0 / float(np.sum(np.exp(logits.astype(np.float64) - m)))
        return tok, None, conf
    p = distribution(logits, history, sampling)
    tok = sample_at(p, u if isinstance(u, float) else float(u.random()))
    return tok, p, float(p[tok])


def fit_row(logits: FloatArray, n_vocab: int) -> FloatArray:
    """A draft's logits row over the target's ``n_vocab`` ids: ids the target lacks are cut
    (a draft never proposes them), ids the draft lacks get -inf (it never proposes those
    either, and a target-sized logit bias or penalty still indexes the row)."""
    n = logits.shape[-1]
    if n == n_vocab:
        return logits
    if n > n_vocab:
        return logits[..., :n_vocab]
    out = np.full(logits.shape[:-1] + (n_vocab,), -np.inf, dtype=logits.dtype)
    out[..., :n] = logits
    return out
