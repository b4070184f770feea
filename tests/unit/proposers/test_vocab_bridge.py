"""The vocabulary bridge on two toy vocabularies (no llama.cpp): boundary rules and sync.

``Toy`` tokenizes by greedy longest match over its pieces with byte fallback (one token per
byte, like SentencePiece's <0xNN> tokens) and parses control tokens when asked; the draft
and the target get different pieces, so their token boundaries disagree as real ones do.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from edgespec.proposers.vocab_bridge import (ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, Bridge, complete_text,
                                       is_text_token, matched_tokens, retokenize, split_utf8)


class Toy:
    def __init__(self, pieces, controls=(), eog=(), bos=None, prefix_space=False):
        self.controls = list(controls)  # ids 0.. ; text like "<|im_end|>"
        self.n_bytes_base = len(self.controls)
        self.pieces = [p.encode() if isinstance(p, str) else p for p in pieces]
        self.base = self.n_bytes_base + 256
        self.eog = {self.controls.index(c) for c in eog}
        self.bos = self.controls.index(bos) if bos else None
        self.prefix_space = prefix_space  # SentencePiece-like: adds " " before the text
        self.calls = 0

    def token_attr(self, t):
        if t < self.n_bytes_base:
            return ATTR_CONTROL
        return ATTR_BYTE if t < self.base else ATTR_NORMAL

    def is_eog(self, t):
        return t in self.eog

    def token_piece(self, t, special=False):
        if t < self.n_bytes_base:
            return self.controls[t].encode() if special else b""
        if t < self.base:
            return bytes([t - self.n_bytes_base])
        return self.pieces[t - self.base]

    def detok(self, toks):
        return b"".join(self.token_piece(t) for t in toks)

    def tokenize(self, text, add_special=True, parse_special=True):
        self.calls += 1
        out = [self.bos] if add_special and self.bos is not None else []
        segments = [text]
        if parse_special:
            for ci, c in enumerate(self.controls):
                nxt = []
                for s in segments:
                    if isinstance(s, int):
                        nxt.append(s)
                        continue
                    parts = s.split(c)
                    for j, part in enumerate(parts):
                        if j:
                            nxt.append(ci)
                        nxt.append(part)
                segments = nxt
        for s in segments:
            if isinstance(s, int):
                out.append(s)
                continue
            data = s.encode()
            if self.prefix_space and data:
                data = b" " + data
            i = 0
            while i < len(data):
                best = None
                for pi, p in enumerate(self.pieces):
                    if data.startswith(p, i) and (best is None or len(p) > len(self.pieces[best])):
                        best = pi
                if best is None:
                    out.append(self.n_bytes_base + data[i])
                    i += 1
                else:
                    out.append(self.base + best)
                    i += len(self.pieces[best])
        return out


CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
# the target: long word pieces, CJK and whitespace runs; the draft: short pieces
TARGET = Toy([" world", " wor", "ld", "hello", " hello", "你好", "世界", "  ", "    ", "\n",
              "def", " f", "():", "\n    ", "return", " 1", " x", "<", "tool", ">", "{\"a\"", ": 1}"],
             controls=CHATML, eog=("<|im_end|>", "<|endoftext|>"))
DRAFT = Toy(["he", "llo", " wo", "rld", " ", "\n", "de", "f", " f", "()", ":", "ret", "urn", "1",
             "<to", "ol>", "{", "\"a\"", ": ", "1}"],
            controls=["<s>", "<|im_end|>", "<end_of_turn>"], eog=("<|im_end|>", "<end_of_turn>"),
            bos="<s>")


def tok(v, text):
    return v.tokenize(text, add_special=False, parse_special=False)


def bridge(prompt="hello"):
    return Bridge(DRAFT, TARGET, tok(TARGET, prompt))


def draft_text(b, text):
    """Push the draft's tokens of ``text`` (as if the draft model generated them)."""
    b.begin()
    for t in tok(DRAFT, text):
        if b.push(t):
            break


# ----------------------------------------------------------------------- pure helpers
def test_split_utf8_holds_back_an_unfinished_character():
    ni = "你".encode()
    assert split_utf8(b"ab" + ni[:2]) == ("ab", ni[:2])
    assert split_utf8(b"ab" + ni) == ("ab你", b"")
    assert split_utf8(b"a\xffb") == ("a\ufffdb", b"")  # malformed: never held forever


def test_complete_text_tells_incomplete_from_malformed():
    thumbs = "👍".encode()
    assert complete_text(b"ok" + thumbs[:3]) == ("ok", False)
    assert complete_text(b"ok\xff!") == ("ok", True)
    assert complete_text(b"ok\xe4\x41") == ("ok", True)  # a lead byte, then no continuation


def test_retokenize_drops_the_token_more_text_could_extend():
    assert retokenize(TARGET, " wor", final=False) == ([], 0)
    toks, n = retokenize(TARGET, " world hello", final=False)
    assert TARGET.detok(toks) == b" world" and n == 6
    toks, n = retokenize(TARGET, " world hello", final=True)
    assert TARGET.detok(toks) == b" world hello" and n == 12


def test_retokenize_cuts_where_the_target_would_change_the_text():
    spm = Toy(["▁a".encode(), b" x", b"x"], prefix_space=True)
    # the tokenizer adds a prefix space: its tokens are not the text, nothing is proposed
    assert retokenize(spm, "x x", final=True) == ([], 0)


def test_matched_tokens():
    assert matched_tokens([b"he", b"llo", b"!"], b"hello world") == (2, 5)
    assert matched_tokens([b"x"], b"hello") == (0, 0)
    assert matched_tokens([], b"a") == (0, 0)


def test_text_tokens_exclude_control_and_eog():
    assert not is_text_token(DRAFT, 0) and not is_text_token(DRAFT, 1)
    assert is_text_token(DRAFT, DRAFT.n_bytes_base + 0xE4)  # byte fallback is text
    assert is_text_token(DRAFT, DRAFT.base)


# ----------------------------------------------------------------------- proposing
def test_prompt_is_rendered_with_chat_markers_and_the_drafts_own_bos():
    prompt = TARGET.tokenize("<|im_start|>hello<|im_end|>\n", add_special=False, parse_special=True)
    b = Bridge(DRAFT, TARGET, prompt)
    assert b.tokens[0] == DRAFT.bos
    assert 1 in b.tokens  # the draft's <|im_end|>, parsed from the rendered marker
    assert DRAFT.detok(b.tokens) == b"<|im_start|>hello\n"  # (the draft has no <|im_start|>)


def test_proposal_is_the_targets_own_tokens_of_the_drafts_text():
    b = bridge()
    draft_text(b, " world hello wor")
    toks, conf = b.proposal(8)
    assert toks == tok(TARGET, " world hello")  # " wor" may become " world": held back
    assert len(conf) == 2
    assert b.proposal(1)[0] == toks[:1]


def test_partial_utf8_from_byte_fallback_is_held_until_complete():
    b = bridge()
    ni = "你好".encode()
    b.begin()
    for byte in ni[:4]:  # the draft has no CJK pieces: one byte-fallback token per byte
        b.push(DRAFT.n_bytes_base + byte)
    # only whole characters reach the target: never the first byte of "好"; and the last
    # target token is held back ("你" may be the start of the target's "你好")
    assert ni[:3].startswith(TARGET.detok(b.proposal(8)[0]))
    assert b.proposal(8)[0] != tok(TARGET, "你")
    for byte in ni[4:]:
        b.push(DRAFT.n_bytes_base + byte)
    b.push(1)  # the draft's <|im_end|>: text final
    assert b.proposal(8)[0] == [*tok(TARGET, "你好"), 1]


def test_malformed_bytes_end_the_proposal_before_them():
    b = bridge()
    draft_text(b, " world")
    b.push(DRAFT.n_bytes_base + 0xFF)
    draft_more = tok(DRAFT, " hello")
    for t in draft_more:
        b.push(t)
    assert b.proposal(8)[0] == tok(TARGET, " world")  # final at the bad byte: kept whole


def test_draft_control_tokens_never_leak_into_target_text():
    b = bridge()
    draft_text(b, " world")
    assert b.push(2)  # <end_of_turn>: no target token has that text
    toks, _ = b.proposal(8)
    assert toks == tok(TARGET, " world")
    assert b"end_of_turn" not in TARGET.detok(toks)
    b = bridge()
    draft_text(b, " world")
    assert b.push(1)  # <|im_end|> maps to the target's own control token
    assert b.proposal(8)[0] == [*tok(TARGET, " world"), 1]
    assert b.push(DRAFT.base)  # nothing after the end is drafted
    assert b.proposal(8)[0] == [*tok(TARGET, " world"), 1]


def test_end_token_is_not_proposed_after_text_the_target_would_change():
    spm = Toy([" wo", "wo"], controls=CHATML, eog=("<|im_end|>",), prefix_space=True)
    b = Bridge(DRAFT, spm, tok(spm, "hello"))
    draft_text(b, "wo")
    assert b.push(1)
    # the target would tokenize "wo" as " wo": neither that nor the end after it is proposed
    assert b.proposal(8)[0] == []


def test_code_indentation_and_whitespace_runs_survive():
    b = bridge("def")
    code = " f():\n    return 1\n"
    draft_text(b, code)
    b.push(1)
    toks, _ = b.proposal(32)
    assert TARGET.detok(toks) == code.encode()
    assert toks[:-1] == tok(TARGET, code)


def test_tool_call_markup_is_text():
    b = bridge()
    draft_text(b, "<tool>{\"a\": 1}")
    b.push(1)
    toks, _ = b.proposal(32)
    assert TARGET.detok(toks) == b"<tool>{\"a\": 1}" and toks[-1] == 1


# ----------------------------------------------------------------------- sync
def test_accept_keeps_confirmed_draft_tokens_and_reencodes_only_the_tail():
    b = bridge()
    n0 = len(b.tokens)
    draft_text(b, " world hello")
    toks, _ = b.proposal(8)
    # the target accepts " world" then chooses " x" itself
    unchanged = b.accept([toks[0], *tok(TARGET, " x")])
    assert unchanged == n0 + 2  # " wo", "rld" confirmed: the KV keeps them
    assert DRAFT.detok(b.tokens[n0:]) == b" world x"
    assert b.pending.draft_tokens == []


def test_a_word_cut_at_a_token_boundary_is_reencoded_whole():
    b = bridge()
    n0 = len(b.tokens)
    b.accept(tok(TARGET, " wor"))
    assert DRAFT.detok(b.tokens[n0:]) == b" wor"
    unchanged = b.accept(tok(TARGET, "ld"))
    # " wo","r" + "ld" -> " wo","rld": the draft's own encoding of " world", from " wo"
    assert b.tokens[n0:] == tok(DRAFT, " world")
    assert unchanged == n0


def test_target_ending_inside_a_character_pauses_the_bridge():
    b = bridge()
    ni = "你".encode()
    byte_tokens = [TARGET.n_bytes_base + x for x in ni]
    b.accept(byte_tokens[:2])
    assert not b.ready and b.held == ni[:2]
    b.accept(byte_tokens[2:])
    assert b.ready and DRAFT.detok(b.tokens).endswith(ni)


def test_target_control_tokens_are_not_draft_text():
    b = bridge()
    before = list(b.tokens)
    b.accept([0])  # <|im_start|> renders no text
    assert b.tokens == before


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["he", "llo", " wo", "rld", " ", "\n", "    ", "你", "好", "世界",
                                 "👍", "🏽", "e\u0301", "é", "<tool>", "{\"a\": 1}", "def", "x",
                                 "\t", "  "]), min_size=1, max_size=30),
       st.lists(st.integers(0, 6), min_size=1, max_size=30),
       st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_random_dialogue_keeps_the_draft_in_step_with_the_target(words, ks, errs):
    """A simulated request: the target's text is ``truth``; the draft proposes a text that
    agrees with it for a while then errs; the target accepts the proposal's agreeing prefix
    plus one token of its own. After every step the draft's tokens render exactly the
    accepted text (less the held-back bytes), and every proposal is target tokens whose
    bytes are the draft's text."""
    truth = "".join(words)
    tt = tok(TARGET, truth)
    b = bridge("hello")
    base = DRAFT.detok(b.tokens)
    pos = 0  # target tokens of truth accepted
    step = 0
    while pos < len(tt):
        k = ks[step % len(ks)]
        err = errs[step % len(errs)]
        step += 1
        accepted_bytes = TARGET.detok(tt[:pos])
        if b.ready and k:
            rest = truth.encode()[len(accepted_bytes):]
            guess = (rest[: len(rest) // (err + 1)] + (b"zz" if err else b"")).decode(
                "utf-8", "ignore").encode()
            b.begin()
            for t in DRAFT.tokenize(guess.decode(), add_special=False, parse_special=False):
                b.push(t)
            props, conf = b.proposal(k)
            assert len(props) <= k and len(conf) == len(props)
            assert guess.startswith(TARGET.detok(props))
        else:
            props = []
        n = 0
        while n < len(props) and pos + n < len(tt) and props[n] == tt[pos + n]:
            n += 1
        new = tt[pos:pos + n + 1]
        b.accept(new)
        pos += len(new)
        committed = TARGET.detok(tt[:pos])
        assert DRAFT.detok(b.tokens) + b.held == base + committed
        assert len(b.held) < 4


def test_unchanged_prefix_is_what_the_kv_may_keep():
    b = bridge()
    draft_text(b, " world hello")
    before = list(b.tokens) + list(b.pending.draft_tokens)
    unchanged = b.accept(tok(TARGET, " world hello"))
    assert b.tokens[:unchanged] == before[:unchanged]


@pytest.mark.parametrize("text", ["Pfandhäuser boomen in Singapur", "世界 你好", "emoji 👍🏽 ok",
                                  "e\u0301\u0301 combining"])
def test_multilingual_proposals_are_exact_text(text):
    b = bridge()
    draft_text(b, text)
    b.push(1)
    toks, _ = b.proposal(64)
    assert TARGET.detok(toks) == text.encode()
