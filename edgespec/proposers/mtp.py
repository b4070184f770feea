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
target's sequence 0. That bookkeeping is the one EAGLE-3 shares (:mod:`.heads`); this
module says what is MTP's own: which token a head position reads, and the refusal.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..api.params import SamplingParams
from ..errors import InvalidInputError
from ..runtime.gguf_facts import read_facts
from .head_base import HeadContext, HeadProposer, HeadSession



class MtpProposer(HeadProposer[HeadContext]):
    name = "mtp"
    serves = "the MTP head"

    def _session(self, tokens: list[int], sampling: SamplingParams) -> "MtpSession":
        return MtpSession(self, tokens, sampling)


class MtpSession(HeadSession[HeadContext]):
    """Head position ``p`` reads ``(x_p, h_{p-1})``: the token at its own position (``lead``
    0) with the target's hidden state, as it is, after the position before."""
    lead = 0

    def _width(self) -> int:
        return self.owner.head.n_embd


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
