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
That bookkeeping is the one MTP shares (:mod:`.heads`: an EAGLE-3 head is MTP's read one
position later); this module says what is EAGLE-3's own: the lead, the encoder, the refusals.

:func:`refusal` checks a target and a draft from their headers before llama.cpp runs
anything: llama.cpp aborts the process on a target architecture that does not publish
its layer inputs, or on a layer id past the target's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from ..api.params import SamplingParams
from ..errors import InvalidInputError
from ..runtime.gguf_facts import ModelFacts, read_facts
from .head_base import HeadContext, HeadProposer, HeadSession

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


class Head(HeadContext, Protocol):
    """What the proposer needs of :class:`edgespec.runtime.eagle3.Eagle3Context`: a head
    that also encodes the target's features into its input rows."""
    n_feat: int

    def encode(self, features: np.ndarray) -> np.ndarray: ...


class Eagle3Proposer(HeadProposer[Head]):
    name = "eagle3"
    serves = "the EAGLE-3 head"

    def _session(self, tokens: list[int], sampling: SamplingParams) -> "Eagle3Session":
        return Eagle3Session(self, tokens, sampling)


class Eagle3Session(HeadSession[Head]):
    """Head position ``P`` reads ``(t_{P+1}, g_P)``: the token one ahead (``lead`` 1) with
    the target's features of its own position, encoded by the head."""
    lead = 1

    def _width(self) -> int:
        return self.owner.head.n_feat

    def _head_input(self, rows: np.ndarray) -> np.ndarray:
        return self.owner.head.encode(rows)


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
