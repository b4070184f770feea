"""Drafts from the target's own multi-token-prediction head (``--proposer mtp``).

A target whose GGUF carries NextN blocks (``<arch>.nextn_predict_layers`` > 0: Qwen3.5,
GLM-4.5, MiMo-V2, DeepSeek-V3 converted with their MTP layers) drafts for itself through
llama.cpp's MTP context (:mod:`edgespec.runtime.mtp`): no second model, the head's
weights are the target file's own.

The head's input at position ``p`` is ``(x_p, h_{p-1})``, ``h`` being the target's hidden
state, taken from the target's own verify pass. So the MTP context's KV cache holds, at
every position, only entries made from the *target's* hidden states:

* ``propose`` first catches the head up on the positions accepted since the last draft
  (``kv_len .. len(seq) - 1``, each with the target's row for the position before), which
  also yields the first draft token; each further draft token feeds the head's own hidden
  state back, at the next position;
* those draft positions are dropped from the MTP cache before ``propose`` returns, so an
  accepted draft token is decoded again with the target's hidden state at the next
  catch-up, and a rejected one leaves nothing behind: the cache is in step with the
  accepted sequence after every step, whatever was accepted.

A hidden row the target never produced here (a prefix restored from the KV cache instead
of decoded) is read as zeros, as llama.cpp does for the first position: drafts may be
worse, the output never changes (verification decides). One request at a time, on the
target's sequence 0.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from ..api.params import SamplingParams
from ..decoding.sampling import distribution, make_rng, sample
from ..errors import InvalidInputError
from ..runtime.gguf_facts import read_facts
from .base import EMPTY_DRAFT, Draft


class Head(Protocol):
    """What the proposer needs of :class:`edgespec.runtime.mtp.MtpContext`."""
    n_ctx: int
    n_embd: int

    def decode(self, tokens: list[int], pos0: int, hidden: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None: ...

    def trim(self, from_pos: int) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class Rows(Protocol):
    """What the proposer needs of :class:`edgespec.runtime.mtp.NextnTap`."""

    def row(self, seq: int, pos: int) -> np.ndarray | None: ...

    def forget_below(self, seq: int, pos: int) -> None: ...

    def detach(self) -> None: ...


class MtpProposer:
    name = "mtp"
    costly = True

    def __init__(self, head: Head, tap: Rows, target_vocab: int, max_draft: int = 3,
                 target_seq: int = 0) -> None:
        self.head = head
        self.tap = tap
        self.target_vocab = int(target_vocab)
        self.max_draft = max(1, int(max_draft))
        self.target_seq = target_seq
        self.seconds_per_token = 0.0  # running estimate, read by the controller
        self.missing_rows = 0  # hidden rows read as zeros (never decoded by the target here)
        self._busy = False

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "MtpSession":
        if self._busy:
            raise RuntimeError("the MTP head serves one request at a time")
        self.head.clear()
        self._busy = True
        return MtpSession(self, [int(t) for t in prompt_tokens], sampling)

    def _release(self) -> None:
        self._busy = False

    def close(self) -> None:
        try:
            self.tap.detach()
        finally:
            self.head.close()


class MtpSession:
    def __init__(self, owner: MtpProposer, tokens: list[int], sampling: SamplingParams) -> None:
        self.owner = owner
        self.seq = tokens  # the accepted sequence, as the target sees it
        #: the MTP cache holds positions [0, kv_len), each made from the target's hidden state
        self.kv_len = 0
        self.sampling = sampling
        self._rng = None if sampling.greedy else make_rng(sampling.seed, "draft")

    def _hidden(self, pos: int) -> np.ndarray:
        """The target's hidden state after position ``pos`` (zeros before the start)."""
        o = self.owner
        row = o.tap.row(o.target_seq, pos) if pos >= 0 else None
        if row is None:
            if pos >= 0:
                o.missing_rows += 1
            return np.zeros(o.head.n_embd, dtype=np.float32)
        return row

    def _catch_up(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode positions kv_len .. len(seq)-1 with the target's hidden states; the
        logits and hidden state of the last one (the first draft position)."""
        o, m = self.owner, len(self.seq)
        start = min(self.kv_len, m - 1)
        if start < self.kv_len:
            o.head.trim(start)  # the last position is decoded again for its output
        hidden = np.stack([self._hidden(p - 1) for p in range(start, m)])
        out = o.head.decode(self.seq[start:m], start, hidden, want=True)
        assert out is not None
        self.kv_len = m
        o.tap.forget_below(o.target_seq, m - 2)
        return out

    def propose(self, k: int) -> Draft:
        o = self.owner
        k = min(k, o.max_draft)
        if k <= 0 or not self.seq or len(self.seq) + k >= o.head.n_ctx:
            return EMPTY_DRAFT
        t0 = time.perf_counter()
        logits, h = self._catch_up()
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        conf: list[float] = []
        history = list(self.seq)
        for i in range(k):
            tok, p, c = self._choose(logits[:o.target_vocab], history)
            tokens.append(tok)
            conf.append(c)
            if p is not None:
                probs.append(p)
            history.append(tok)
            if i + 1 < k:
                out = o.head.decode([tok], self.kv_len + i, h[None, :], want=True)
                assert out is not None
                logits, h = out
        if k > 1:
            o.head.trim(self.kv_len)  # draft positions: never kept (see the module doc)
        est = (time.perf_counter() - t0) / k
        o.seconds_per_token = est if o.seconds_per_token == 0 else \
            0.8 * o.seconds_per_token + 0.2 * est
        return Draft(tokens=tuple(tokens), probs=np.stack(probs) if probs else None,
                     confidence=tuple(conf), source="mtp")

    def _choose(self, logits: np.ndarray,
                history: list[int]) -> tuple[int, np.ndarray | None, float]:
        if self._rng is None:
            tok = int(np.argmax(logits))
            x = logits.astype(np.float64)
            return tok, None, 1.0 / float(np.sum(np.exp(x - x[tok])))
        p = distribution(logits, history, self.sampling)
        tok = sample(p, self._rng)
        return tok, p, float(p[tok])

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:  # noqa: ARG002
        # the cache already holds only positions made from the target's hidden states;
        # the new tokens are decoded at the next catch-up
        self.seq.extend(int(t) for t in tokens)

    def close(self, completed: bool) -> None:  # noqa: ARG002
        self.owner._release()


def refusal(path: Any, loaded_with_mtp: bool) -> str | None:
    """Why ``path`` cannot draft with ``mtp`` (None when it can): its header's NextN count."""
    facts = read_facts(path)
    name = Path(str(path)).name
    if facts.nextn_predict_layers <= 0:
        return (f"{name} has no multi-token-prediction layers ({facts.arch}.nextn_predict_layers "
                "is absent or 0), so --proposer mtp cannot draft for it. Use a GGUF converted "
                "with its MTP (NextN) layers (Qwen3.5, GLM-4.5, MiMo-V2, DeepSeek-V3 families; "
                "convert without --no-mtp), or another proposer: --proposer self (no second "
                "model), draft --draft NAME, ngram or suffix")
    if not loaded_with_mtp:
        return (f"{name} was loaded without its MTP layers; load it through the engine with "
                "--proposer mtp (the engine then loads them)")
    return None


def build_mtp(target: Any, target_ctx: Any, kernel: Any, max_draft: int) -> MtpProposer:
    """The mtp proposer of a loaded target and its context (the registry's factory)."""
    from ..runtime.mtp import MtpContext, NextnTap  # deferred: loads llama.cpp
    if target is None or target_ctx is None:
        raise InvalidInputError("the mtp proposer drafts with the target's own head: build it "
                                "through the engine (--proposer mtp)")
    why = refusal(target.path, bool(getattr(target, "load_mtp", False)))
    if why is not None:
        raise InvalidInputError(why)
    head = MtpContext(target_ctx, n_batch=kernel.n_batch if kernel else 64,
                      flash_attn=int(kernel.flash_attn) if kernel else 1,
                      type_k=kernel.kv_ggml_type if kernel else 8,
                      type_v=kernel.kv_ggml_type if kernel else 8)
    try:
        tap = NextnTap(target_ctx)
    except BaseException:
        head.close()
        raise
    return MtpProposer(head, tap, target_vocab=target.n_vocab, max_draft=max_draft)
