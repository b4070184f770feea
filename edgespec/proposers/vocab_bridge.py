"""The vocabulary bridge: a draft model with another tokenizer proposes for the target.

The two models share *text*, not token ids. The draft continues the text; its new bytes are
re-tokenized by the target; after verification the draft's own token sequence is brought
back in line with the text the target accepted. Everything here is pure bookkeeping over two
vocabularies (anything with ``tokenize``, ``token_piece``, ``token_attr``, ``is_eog``, as
:class:`edgespec.runtime.model.Model` and ``tests/fakes`` have); the draft model's KV cache is
driven by :mod:`edgespec.proposers.bridged_draft`.

Boundary rules, each a way a careless bridge corrupts text:

* The target's tokens of text already shared are never re-split: only the draft's *new*
  text is tokenized, on its own, and a proposed token is kept only if the concatenation of
  the proposed tokens' bytes is exactly a prefix of the draft's new bytes.
* The last target token of a proposal is dropped unless the draft's text ended there (an
  end-of-generation token): more text could extend it (`` wor`` + ``ld``).
* Bytes that do not yet form a whole UTF-8 character (a byte-level BPE piece, a
  SentencePiece ``<0xE4>`` byte-fallback token) are held back until completed; a byte
  sequence that can never complete (malformed) ends the proposal before it.
* Draft control tokens (chat markers, EOS) never become target text: the proposal ends at
  one; if the target has a control token with the same text (``<|im_end|>`` in both
  ChatML vocabularies) it is proposed as that token, so the target can end where the draft
  did.
* While the target's accepted text ends inside a character (it emitted a byte token) the
  draft cannot continue it as text: nothing is proposed until the character completes.

Sync after verification: the draft's tokens whose bytes the accepted text confirms are kept
(its KV cache stays valid for them); the rest is trimmed and only the changed tail is
re-encoded with the draft's tokenizer, starting at the last whitespace-led draft token
so a word cut at a token boundary is re-encoded whole.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Protocol, Sequence

#: bumped whenever a rule above changes: models.toml pins each cross-tokenizer pair to it
BRIDGE_VERSION = "1"

# llama_token_attr bits (llama.h)
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
_TEXT_ATTRS = ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_BYTE

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
#: most generated draft tokens re-encoded with a word the target completed differently
MAX_BACKOFF = 4


class Vocab(Protocol):
    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...

    def token_piece(self, token: int, special: bool = False) -> bytes: ...

    def token_attr(self, token: int) -> int: ...

    def is_eog(self, token: int) -> bool: ...


# --------------------------------------------------------------------------- pure helpers
def split_utf8(data: bytes) -> tuple[str, bytes]:
    """``data`` as text plus the trailing bytes of a character not yet complete.

    Malformed bytes that no later byte can complete become U+FFFD (the draft's context only
    needs text close to the target's). ``b"ab\\xe4\\xbd"`` -> ``("ab", b"\\xe4\\xbd")``.
    """
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = dec.decode(data, final=False)
    return text, dec.getstate()[0]


def complete_text(data: bytes) -> tuple[str, bool]:
    """The longest prefix of ``data`` made of whole, valid characters, and whether what
    follows it is malformed (can never become text) rather than merely incomplete.

    ``b"ok\\xf0\\x9f"`` -> ``("ok", False)``; ``b"ok\\xff!"`` -> ``("ok", True)``.
    """
    dec = codecs.getincrementaldecoder("utf-8")(errors="strict")
    try:
        return dec.decode(data, final=False), False
    except UnicodeDecodeError as e:
        return data[:e.start].decode("utf-8"), True


def is_text_token(vocab: Vocab, token: int) -> bool:
    """A token that renders text: normal, user-defined or a byte; never a control or EOG token."""
    attr = vocab.token_attr(token)
    return bool(attr & _TEXT_ATTRS) and not attr & ATTR_CONTROL and not vocab.is_eog(token)


def retokenize(target: Vocab, text: str, final: bool) -> tuple[list[int], int]:
    """Target tokens for ``text`` continuing already-shared text, and the bytes they cover.

    Tokens are kept while their concatenated bytes stay a prefix of ``text`` (a tokenizer
    that adds a prefix space or normalises would otherwise change the text); unless
    ``final``, the last kept token is dropped, since text that follows could extend it.
    """
    if not text:
        return [], 0
    data = text.encode("utf-8")
    toks = target.tokenize(text, add_special=False, parse_special=False)
    kept: list[int] = []
    n = 0
    for t in toks:
        piece = target.token_piece(t)
        if not piece or data[n:n + len(piece)] != piece:
            final = False  # what follows a mismatch is not the draft's text: nothing is final
            break
        kept.append(t)
        n += len(piece)
    if not final and kept:
        n -= len(target.token_piece(kept.pop()))
    return kept, n


def matched_tokens(pieces: Sequence[bytes], data: bytes) -> tuple[int, int]:
    """How many leading ``pieces`` concatenate to a prefix of ``data``, and their byte length.

    ``matched_tokens([b"he", b"llo", b"!"], b"hello world")`` -> ``(2, 5)``.
    """
    n = 0
    for i, p in enumerate(pieces):
        if data[n:n + len(p)] != p:
            return i, n
        n += len(p)
    return len(pieces), n


def render_prompt(target: Vocab, tokens: Sequence[int], bos: int | None = None) -> bytes:
    """The target prompt as text the draft can read: control tokens (chat markers) as their
    own text, which a draft trained on the same markers parses back into its tokens. A
    leading target ``bos`` is left out: the draft adds its own."""
    out = bytearray()
    for i, t in enumerate(tokens):
        if i == 0 and t == bos:
            continue
        out += target.token_piece(t, special=not is_text_token(target, t))
    return bytes(out)


# --------------------------------------------------------------------------- the bridge
@dataclass
class Proposal:
    """What the draft generated this step (its tokens, their bytes) and what the target
    gets from it."""

    draft_tokens: list[int] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    final: bool = False  # the draft's text ended (a control token or malformed bytes)
    end_token: int | None = None  # the target's control token the draft ended with
    target_tokens: list[int] = field(default_factory=list)
    target_conf: list[float] = field(default_factory=list)
    n_stable: int = 0  # target tokens the whole text gave (before the cut to k)


class Bridge:
    """Alignment of one request's text between a draft vocabulary and the target's.

    ``tokens`` are the draft's tokens of the shared text (what its KV cache should hold);
    ``held`` the accepted target bytes not given to the draft yet (an unfinished character).
    The proposer calls :meth:`push` per drafted token, reads :meth:`proposal`, and after
    verification :meth:`accept`, which says how much of ``tokens`` is unchanged.
    """

    def __init__(self, draft: Vocab, target: Vocab, prompt_tokens: Sequence[int],
                 target_bos: int | None = None) -> None:
        self.draft, self.target = draft, target
        text, self.held = split_utf8(render_prompt(target, prompt_tokens, target_bos))
        # the draft's own BOS and chat markers, as its tokenizer wants them
        self.tokens: list[int] = draft.tokenize(text, add_special=True, parse_special=True)
        self.n_fixed = len(self.tokens)  # the prompt's tokens are never re-encoded
        self.pieces: list[bytes] = [b""] * self.n_fixed  # generated tokens' bytes only
        self.pending = Proposal()
        self._end_map: dict[int, int | None] = {}
        self._text: dict[int, bool] = {}  # draft token -> is_text_token (attrs cost a C call)
        # (key, proposal) of the last proposal computed; key: (text bytes, final, k)
        self._cached: tuple[tuple[int, bool, int], tuple[list[int], list[float]]] | None = None

    # -- proposing
    @property
    def ready(self) -> bool:
        """False while the accepted text ends inside a character: the draft cannot see it."""
        return not self.held

    def begin(self) -> None:
        self.pending = Proposal()
        self._cached = None

    def push(self, token: int, confidence: float = 1.0) -> bool:
        """Add one drafted token; True when the draft's text has ended (stop drafting)."""
        p = self.pending
        if p.final:
            return True
        text_token = self._text.get(token)
        if text_token is None:
            text_token = self._text[token] = is_text_token(self.draft, token)
        if not text_token:
            p.final = True
            p.end_token = self._end_token(token)
            return True
        piece = self.draft.token_piece(token)
        p.draft_tokens.append(token)
        p.pieces.append(piece)
        p.confidence.append(confidence)
        p.text += piece
        return False

    def proposal(self, k: int) -> tuple[list[int], list[float]]:
        """The target tokens the draft's text gives, at most ``k``, with the confidence of
        the draft token that completes each."""
        p = self.pending
        key = (len(p.text), p.final, k)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        text, malformed = complete_text(bytes(p.text))
        final = p.final or malformed
        toks, _ = retokenize(self.target, text, final)
        conf = self._confidence(toks)
        if final and p.end_token is not None and not malformed and \
                sum(len(self.target.token_piece(t)) for t in toks) == len(text.encode("utf-8")):
            toks.append(p.end_token)
            conf.append(p.confidence[-1] if p.confidence else 1.0)
        p.n_stable = len(toks)
        p.target_tokens, p.target_conf = toks[:k], conf[:k]
        self._cached = (key, (p.target_tokens, p.target_conf))
        return p.target_tokens, p.target_conf

    def enough(self, k: int, at_least: int | None = None) -> bool:
        """Whether the drafted text already gives ``k`` target tokens (drafting can stop).

        The target's tokenizer is not asked before the draft has ``at_least`` tokens
        (default ``k``; the proposer passes what its measured token ratio predicts): each
        call between two draft decodes runs cache-cold (~150 us instead of ~15 us here), and
        a low guess costs a longer draft, never a wrong one."""
        p = self.pending
        if p.final:
            return True
        return len(p.draft_tokens) >= (k if at_least is None else at_least) and \
            len(self.proposal(k)[0]) >= k

    @property
    def draft_per_target(self) -> float | None:
        """Draft tokens per target token in the last proposal's text (None: too little)."""
        p = self.pending
        return len(p.draft_tokens) / (p.n_stable + 1) if p.draft_tokens and not p.final \
            else None

    # -- after verification
    def accept(self, target_tokens: Sequence[int]) -> int:
        """Bring ``tokens`` in line with the text the target accepted (``target_tokens``: the
        accepted drafts and the target's own token); returns how many leading ``tokens`` are
        unchanged (the draft's KV cache stays valid for those)."""
        data = self.held + b"".join(self.target.token_piece(t) for t in target_tokens)
        p = self.pending
        self.begin()
        m, used = matched_tokens(p.pieces, data)
        self.tokens += p.draft_tokens[:m]
        self.pieces += p.pieces[:m]
        rest = data[used:]
        unchanged = len(self.tokens)
        if rest and rest[0] not in _WHITESPACE:
            # a word cut at a token boundary (" wo" + "rld") is re-encoded whole, as the
            # draft would have it: back to its whitespace-led token, a few tokens at most
            start = self._word_start()
            rest = b"".join(self.pieces[start:]) + rest
            del self.tokens[start:], self.pieces[start:]
            unchanged = start
        if rest:
            text, self.held = split_utf8(rest)
            if text:
                new = self.draft.tokenize(text, add_special=False, parse_special=False)
                self.tokens += new
                self.pieces += [self.draft.token_piece(t) for t in new]
        return unchanged

    # -- internals
    def _word_start(self) -> int:
        """Where re-encoding may start: the latest generated token that begins with
        whitespace within MAX_BACKOFF tokens, else the latest one that starts a character
        (bytes from there decode), else the end (nothing is re-encoded)."""
        lo = max(self.n_fixed, len(self.tokens) - MAX_BACKOFF)
        first_char = len(self.tokens)
        for i in range(len(self.tokens) - 1, lo - 1, -1):
            head = self.pieces[i][:1]
            if not head or head[0] & 0xC0 == 0x80:
                continue  # a continuation byte: not a character boundary
            if head[0] in _WHITESPACE:
                return i
            if first_char == len(self.tokens):
                first_char = i
        return first_char

    def _end_token(self, token: int) -> int | None:
        """The target's control token with the same text as the draft's, if any."""
        if token not in self._end_map:
            text = self.draft.token_piece(token, special=True)
            mapped = None
            if text:
                toks = self.target.tokenize(text.decode("utf-8", "replace"), add_special=False,
                                            parse_special=True)
                if len(toks) == 1 and not is_text_token(self.target, toks[0]):
                    mapped = toks[0]
            self._end_map[token] = mapped
        return self._end_map[token]

    def _confidence(self, toks: Sequence[int]) -> list[float]:
        p = self.pending
        out: list[float] = []
        end, i, covered = 0, 0, 0
        for t in toks:
            end += len(self.target.token_piece(t))
            while i < len(p.pieces) and covered < end:
                covered += len(p.pieces[i])
                i += 1
            out.append(p.confidence[i - 1] if i else 1.0)
        return out


__all__ = ["BRIDGE_VERSION", "Bridge", "Proposal", "Vocab", "complete_text", "is_text_token",
           "matched_tokens", "render_prompt", "retokenize", "split_utf8"]
