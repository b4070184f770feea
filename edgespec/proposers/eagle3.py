"""Drafts from an EAGLE-3 head (``--proposer eagle3 --draft FILE``), as llama.cpp's ``draft-eagle3``.

An EAGLE-3 GGUF (arch ``eagle3``) is one decoder layer fed by three of the target's layers
(:mod:`edgespec.runtime.eagle3`). At draft-KV position ``P`` its input is the pair
``(t_{P+1}, g_P)``, ``g_P`` being the encoded target features of position ``P``, taken from
the target's own verify pass; its output predicts ``t_{P+2}``.

With an accepted sequence ``seq[0..m-1]`` the target has decoded positions ``0..m-2`` (the
last token, the verify pass's bonus or correction, is decoded by the next verify pass), so
the head's cache holds, at every position, only pairs made from the *target's* features:

* ``propose`` catches the head up on positions ``kv_len .. m-2`` (token ``seq[P+1]``, the
  encoded features of ``P``); the last one yields the first draft token. Each further draft
  token is fed back with the head's own pre-norm state, at the next position;
* those draft positions are dropped before ``propose`` returns, so the cache is in step
  with the accepted sequence after every step, whatever was accepted.

Features the target never produced here (a prefix restored from the KV cache instead of
decoded) read as zeros and are counted (``missing_rows``): drafts may be worse, the output
never changes (verification decides). One request at a time, on the target's sequence 0.

:func:`refusal` checks a target and a draft from their headers before llama.cpp runs
anything: llama.cpp aborts the process on a target architecture that does not publish
its layer inputs, or on a layer id past the target's.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from ..api.params import SamplingParams
from ..decoding.sampling import distribution, make_rng, sample
from ..errors import InvalidInputError
from ..runtime.gguf_facts import ModelFacts, read_facts
from .base import EMPTY_DRAFT, Draft
from .draft import fit_row

#: GGUF architectures whose graph publishes every layer's input (``res->t_layer_inp``);
#: llama.cpp aborts on a layer-input request for any other (src/models/*.cpp, 0.3.36)
LAYER_INPUT_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "hunyuan_vl", "lfm2", "llama", "mimo2",
    "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "gpt-oss",
    "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp"})
#: of those, the ones whose trunk also publishes its final pre-norm state (``t_h_nextn``):
#: only they serve a target layer id equal to their layer count
FINAL_STATE_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "mimo2", "nemotron_h", "gpt-oss", "qwen35",
    "qwen35moe", "qwen3next"})


#: what to say when a target cannot serve an EAGLE-3 head
_INSTEAD = ("use another proposer: --proposer self (no second model), draft --draft NAME, "
            "ngram or suffix")


class Head(Protocol):
    """What the proposer needs of :class:`edgespec.runtime.eagle3.Eagle3Context`."""
    n_ctx: int
    n_embd: int
    n_feat: int

    def encode(self, features: np.ndarray) -> np.ndarray: ...

    def decode(self, tokens: list[int], pos0: int, g: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None: ...

    def trim(self, from_pos: int) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class Features(Protocol):
    """What the proposer needs of :class:`edgespec.runtime.eagle3.LayerTap`."""

    def row(self, seq: int, pos: int) -> np.ndarray | None: ...

    def forget_below(self, seq: int, pos: int) -> None: ...

    def detach(self) -> None: ...


class Eagle3Proposer:
    name = "eagle3"
    costly = True

    def __init__(self, head: Head, tap: Features, target_vocab: int, max_draft: int = 3,
                 target_seq: int = 0) -> None:
        self.head = head
        self.tap = tap
        self.target_vocab = int(target_vocab)
        self.max_draft = max(1, int(max_draft))
        self.target_seq = target_seq
        self.seconds_per_token = 0.0  # running estimate, read by the controller
        self.missing_rows = 0  # feature rows read as zeros (never decoded by the target here)
        self._busy = False

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "Eagle3Session":
        if self._busy:
            raise RuntimeError("the EAGLE-3 head serves one request at a time")
        self.head.clear()
        self._busy = True
        return Eagle3Session(self, [int(t) for t in prompt_tokens], sampling)

    def _release(self) -> None:
        self._busy = False

    def close(self) -> None:
        try:
            self.tap.detach()
        finally:
            self.head.close()


class Eagle3Session:
    def __init__(self, owner: Eagle3Proposer, tokens: list[int], sampling: SamplingParams) -> None:
        self.owner = owner
        self.seq = tokens  # the accepted sequence, as the target sees it
        #: the head's cache holds positions [0, kv_len), each (seq[P+1], the target's g_P)
        self.kv_len = 0
        self.sampling = sampling
        self._rng = None if sampling.greedy else make_rng(sampling.seed, "draft")

    def _features(self, pos: int) -> np.ndarray:
        o = self.owner
        row = o.tap.row(o.target_seq, pos)
        if row is None:
            o.missing_rows += 1
            return np.zeros(o.head.n_feat, dtype=np.float32)
        return row

    def _catch_up(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode positions kv_len .. len(seq)-2 from the target's features; the logits and
        pre-norm state of the last one (which predict the first draft token)."""
        o, top = self.owner, len(self.seq) - 2
        start = min(self.kv_len, top)
        if start < self.kv_len:
            o.head.trim(start)  # the last position is decoded again for its output
        feats = np.stack([self._features(p) for p in range(start, top + 1)])
        out = o.head.decode(self.seq[start + 1:top + 2], start, o.head.encode(feats), want=True)
        assert out is not None
        self.kv_len = top + 1
        o.tap.forget_below(o.target_seq, top)
        return out

    def propose(self, k: int) -> Draft:
        o = self.owner
        k = min(k, o.max_draft)
        if k <= 0 or len(self.seq) < 2 or len(self.seq) + k >= o.head.n_ctx:
            return EMPTY_DRAFT
        t0 = time.perf_counter()
        logits, h = self._catch_up()
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        conf: list[float] = []
        history = list(self.seq)
        for i in range(k):
            tok, p, c = self._choose(fit_row(logits, o.target_vocab), history)
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
                     confidence=tuple(conf), source="eagle3")

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
        # the cache already holds only positions made from the target's features; the new
        # tokens are decoded at the next catch-up
        self.seq.extend(int(t) for t in tokens)

    def close(self, completed: bool) -> None:  # noqa: ARG002
        self.owner._release()


def refusal(target: ModelFacts, draft: ModelFacts, layers: Sequence[int],
            d2t: np.ndarray | None = None) -> str | None:
    """Why ``draft`` cannot draft for ``target`` with ``eagle3`` (None when it can), from
    their headers, the draft's target layer ids and its ``d2t`` map (if it has one)."""
    tname, dname = Path(target.path).name, Path(draft.path).name
    if draft.arch != "eagle3":
        return (f"{dname} is a {draft.arch} model, not an EAGLE-3 draft (general.architecture "
                "eagle3); pass an EAGLE-3 GGUF converted for this target with --draft, or "
                "--proposer draft for an ordinary draft model")
    if target.arch not in LAYER_INPUT_ARCHS:
        return (f"{tname} is a {target.arch} model: llama.cpp publishes the layer inputs an "
                f"EAGLE-3 head reads only for {', '.join(sorted(LAYER_INPUT_ARCHS))} targets, "
                f"so --proposer eagle3 cannot run on it; {_INSTEAD}")
    if len(layers) != 3:
        return (f"{dname} names {len(layers)} target layers (eagle3.target_layers); an EAGLE-3 "
                "head reads exactly 3")
    for lid in layers:
        top = target.n_layers if target.arch in FINAL_STATE_ARCHS else target.n_layers - 1
        if not 0 <= lid <= top:
            return (f"{dname} reads target layer {lid}, but {tname} has layers 0..{top} to read "
                    f"(eagle3.target_layers {list(layers)}): the draft was made for another "
                    "target")
    hidden = draft.metadata.get("eagle3.target_hidden_size")
    if hidden != target.n_embd:
        return (f"{dname} was made for a target of hidden size {hidden} "
                f"(eagle3.target_hidden_size), but {tname} has {target.n_embd}: pick the "
                "EAGLE-3 draft converted for this target")
    names = {t.name for t in draft.tensors}
    borrows = "token_embd.weight" not in names or "output.weight" not in names
    if borrows and draft.n_embd != target.n_embd:
        return (f"{dname} borrows the target's token embeddings or output head, so its "
                f"embedding length ({draft.n_embd}) must equal {tname}'s ({target.n_embd})")
    if d2t is not None and len(d2t) and (int(d2t.min()) < 0 or int(d2t.max()) >= target.n_vocab):
        return (f"{dname} maps its vocabulary (d2t) to ids up to {int(d2t.max())}, outside "
                f"{tname}'s {target.n_vocab} tokens: it was made for another vocabulary")
    return None


def read_d2t(facts: ModelFacts) -> np.ndarray | None:
    """The draft's ``d2t`` map (draft id -> target id, I64), read from the file; None
    when it has none."""
    t = next((t for t in facts.tensors if t.name == "d2t"), None)
    if t is None:
        return None
    if t.ggml_type != GGMLQuantizationType.I64 or len(t.shape) != 1:
        raise InvalidInputError(f"{Path(facts.path).name}: its d2t tensor is not a 1-D I64 "
                                "map; the file is not a valid EAGLE-3 draft")
    return np.fromfile(facts.path, dtype="<i8", count=int(t.shape[0]),
                       offset=facts.data_offset + t.offset)


def build_eagle3(target: Any, target_ctx: Any, draft: Any, kernel: Any,
                 max_draft: int) -> Eagle3Proposer:
    """The eagle3 proposer of a loaded target, its context and a loaded EAGLE-3 draft."""
    from ..runtime.eagle3 import Eagle3Context, LayerTap, target_layer_ids  # deferred: loads llama.cpp
    if target is None or target_ctx is None or draft is None:
        raise InvalidInputError("the eagle3 proposer reads the target's verify pass: build it "
                                "through the engine (--proposer eagle3 --draft FILE)")
    dfacts, tfacts = read_facts(draft.path), read_facts(target.path)
    layers = target_layer_ids(draft) if dfacts.arch == "eagle3" else ()
    why = refusal(tfacts, dfacts, layers, read_d2t(dfacts) if dfacts.arch == "eagle3" else None)
    if why is not None:
        raise InvalidInputError(why)
    head = Eagle3Context(draft, target_ctx, n_batch=kernel.n_batch if kernel else 64,
                         flash_attn=int(kernel.flash_attn) if kernel else 1,
                         type_k=kernel.kv_ggml_type if kernel else 8,
                         type_v=kernel.kv_ggml_type if kernel else 8)
    try:
        tap = LayerTap(target_ctx, layers)
    except BaseException:
        head.close()
        raise
    return Eagle3Proposer(head, tap, target_vocab=target.n_vocab, max_draft=max_draft)
