"""Whether a draft's token ids mean the same text as the target's (llama.cpp's rule).

Padded vocabularies (Qwen2.5 7B+ carry 152,064 tokens, 0.5B 151,936) pair: sizes may
differ by up to SPEC_VOCAB_MAX_SIZE_DIFFERENCE, and every token from
SPEC_VOCAB_CHECK_START_TOKEN_ID on, over the shorter vocabulary, must have the same
text and attributes (as in llama.cpp's ``common_speculative_are_compatible``).
"""
from __future__ import annotations

from typing import Protocol, Sequence


class VocabFacts(Protocol):
    """What the check reads of a model (edgespec.runtime.backend.Model has it all)."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def add_bos(self) -> bool: ...
    @property
    def bos(self) -> int: ...
    @property
    def eos(self) -> int: ...
    @property
    def eog_tokens(self) -> Sequence[int]: ...

    def token_text(self, token: int) -> str: ...

    def token_attr(self, token: int) -> int: ...


SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


def vocab_mismatch(target: VocabFacts, draft: VocabFacts) -> str | None:
    """The first reason ``draft`` cannot draft for ``target``, or None.

    Both need ``n_vocab``, ``bos``, ``eos``, ``add_bos``, ``eog_tokens``,
    ``token_text(i)`` and ``token_attr(i)``; pure over that data.
    """
    nt, nd = int(target.n_vocab), int(draft.n_vocab)
    if abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"the draft has {nd} tokens, the target {nt}: more than "
                f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE} apart, so their vocabularies differ")
    if bool(target.add_bos) != bool(draft.add_bos):
        return "the draft and the target disagree on adding BOS"
    for what, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if a != b:
            return f"the draft has {what} token {b}, the target {a}"
    for t in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
        ta, da = target.token_text(t), draft.token_text(t)
        if ta != da or target.token_attr(t) != draft.token_attr(t):
            return f"token {t} is {ta!r} in the target but {da!r} in the draft"
    if set(target.eog_tokens) != set(draft.eog_tokens):
        return "the draft and the target disagree on end-of-generation tokens"
    return None
