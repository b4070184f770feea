"""The bridged draft proposer on the fake backend: a draft with another vocabulary (the fake
model's language with its token ids reversed and no "ab" merge) drafting for the fake target.

The fake contexts refuse any KV position the proposer gets wrong (a token decoded twice, a
skipped position, a stale trim), so every run checks the draft's KV bookkeeping through
proposals, rejections, re-encoded tails and the end of generation.
"""
from __future__ import annotations

import numpy as np
import pytest

from fakes import BOS, EOG, N_VOCAB, FakeModel, fake_engine, fixed
from fakes.backend import AB, SPECIAL, VOCAB

from edgespec.proposers.vocab_bridge import ATTR_CONTROL, ATTR_NORMAL
from edgespec.errors import InvalidInputError
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.proposers.bridged_draft import BridgedDraftProposer


class OtherVocab(FakeModel):
    """The target's language over another vocabulary: id ``t`` is ``N_VOCAB - 1 - t`` here,
    and its tokenizer never merges "ab" (so its token boundaries differ from the target's)."""

    def __init__(self, target: FakeModel) -> None:
        super().__init__(name="other.gguf")
        self.target = target
        self.bos, self.eos = self.d(BOS), self.d(1)

    @staticmethod
    def d(t: int) -> int:
        return N_VOCAB - 1 - t

    def row(self, history):
        r = self.target.row([self.d(x) for x in history])
        return r[[self.d(i) for i in range(N_VOCAB)]]

    def tokenize(self, text, add_special=True, parse_special=True):
        data = text.encode()
        out = [self.bos] if add_special else []
        i = 0
        while i < len(data):
            hit = next((t for t, s in SPECIAL.items() if parse_special and data.startswith(s, i)),
                       None)
            if hit is not None:
                out.append(self.d(hit))
                i += len(SPECIAL[hit])
                continue
            # a byte without a piece (U+FFFD for a malformed byte the target sampled) becomes
            # "#", as a real tokenizer's <unk> would: only the draft's guesses get worse
            out.append(self.d(VOCAB.get(data[i:i + 1], VOCAB[b"#"])))
            i += 1
        return out

    def token_piece(self, token, special=False):
        return super().token_piece(self.d(token), special)

    def token_attr(self, token):
        return ATTR_CONTROL if self.d(token) in SPECIAL else ATTR_NORMAL

    def is_eog(self, token):
        return self.d(token) in EOG

    @property
    def eog_tokens(self):
        return sorted(self.d(t) for t in EOG)


def engine(target=None):
    target = target or FakeModel()
    draft = OtherVocab(target)
    prop = BridgedDraftProposer(draft, target, n_ctx=256, check_pin=False)
    return fake_engine(target, {"bridge": prop}, control=fixed(3)), prop, draft


@pytest.mark.parametrize("prompt", ["a", "x", "d ab", "c\u00e9d"])
def test_greedy_bridged_output_is_the_plain_path(prompt):
    eng, prop, draft = engine()
    params = GenerationParams(max_tokens=20, chat=False)
    plain = eng.generate(prompt, params, proposer="none")
    spec = eng.generate(prompt, params, proposer="bridge")
    assert spec.tokens == plain.tokens and spec.stop_reason == plain.stop_reason
    assert spec.stats.drafted > 0
    t = prop.last
    assert t.steps > 0 and t.draft_tokens >= t.target_tokens > 0
    assert t.bridge_seconds > 0 and t.bridge_cpu_seconds >= 0


def test_drafts_are_accepted_and_the_draft_kv_follows_the_text():
    eng, prop, draft = engine()
    spec = eng.generate("a", GenerationParams(max_tokens=24, chat=False), proposer="bridge")
    # "abcéd abcéd ...": the target writes "a","b" where its tokenizer would merge "ab", so
    # proposals starting there are rejected, and the rest accepted
    assert 0 < spec.stats.accepted < spec.stats.drafted
    # the bridge's own time is in the request's stats, apart from the draft's inference
    st = spec.stats
    assert st.bridge_steps >= st.verify_passes > 0
    assert st.bridge_seconds > 0
    assert "bridge_us_per_step" in st.to_dict() and "bridge:" in st.summary()
    held = draft.contexts[-1].tokens()
    text = b"".join(draft.token_piece(t) for t in held)
    full = b"a" + eng.target.detokenize(spec.tokens)
    assert full.startswith(text) and len(text) >= len(full) - 8  # in step, up to the tail


def test_the_draft_ends_where_the_target_does():
    eng, prop, _ = engine()
    spec = eng.generate("x", GenerationParams(max_tokens=20, chat=False), proposer="bridge")
    assert spec.stop_reason == "eos"
    assert prop.last.ends >= 1  # the draft's </s> was proposed as the target's own


def test_sampling_with_a_seed_is_the_plain_sample():
    eng, _, _ = engine()
    for seed in range(5):
        sp = SamplingParams(temperature=1.0, seed=seed)
        gp = GenerationParams(max_tokens=16, chat=False, sampling=sp)
        assert eng.generate("a", gp, proposer="bridge").tokens == \
            eng.generate("a", gp, proposer="none").tokens


def test_a_draft_sharing_the_vocabulary_is_refused():
    target = FakeModel()
    with pytest.raises(InvalidInputError, match="--proposer draft"):
        BridgedDraftProposer(FakeModel(name="same.gguf"), target, n_ctx=64, check_pin=False)


def test_a_prompt_the_draft_context_cannot_hold_drafts_nothing():
    target = FakeModel()
    prop = BridgedDraftProposer(OtherVocab(target), target, n_ctx=16, check_pin=False)
    eng = fake_engine(target, {"bridge": prop}, control=fixed(3), n_ctx=64)
    r = eng.generate("abcd abcd abcd", GenerationParams(max_tokens=4, chat=False))
    assert r.stats.drafted == 0 and len(r.tokens) == 4


def test_options_are_checked():
    target = FakeModel()
    with pytest.raises(InvalidInputError, match="max_ratio"):
        BridgedDraftProposer(OtherVocab(target), target, n_ctx=64, check_pin=False, max_ratio=0.5)


def test_row_mapping_is_the_targets_language():
    target = FakeModel()
    draft = OtherVocab(target)
    h = [3, 4, 5]
    assert int(np.argmax(draft.row([draft.d(t) for t in h]))) == draft.d(target.next_greedy(h))
    assert AB not in [draft.d(t) for t in draft.tokenize("ab", add_special=False)]


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_every_draft_length_keeps_the_kv_in_step(k):
    target = FakeModel()
    prop = BridgedDraftProposer(OtherVocab(target), target, n_ctx=256, check_pin=False)
    eng = fake_engine(target, {"bridge": prop}, control=fixed(k))
    for prompt in ("a", ". ", "#", "\u00e9", "abab d"):
        for seed in (None, 1, 2):
            sp = SamplingParams() if seed is None else SamplingParams(temperature=1.5, seed=seed)
            gp = GenerationParams(max_tokens=30, chat=False, sampling=sp)
            assert eng.generate(prompt, gp, proposer="bridge").tokens == \
                eng.generate(prompt, gp, proposer="none").tokens, (prompt, seed)


def test_a_follow_up_request_reuses_the_drafts_kv_prefix():
    eng, prop, draft = engine()
    params = GenerationParams(max_tokens=12, chat=False)
    first = eng.generate("x. ", params, proposer="bridge", reuse=True)
    assert prop.last_reused == 0
    follow = "x. " + first.text + " ab"
    again = eng.generate(follow, params, proposer="bridge", reuse=True)
    assert prop.last_reused >= 3  # the earlier prompt's draft tokens were kept
    assert again.tokens == eng.generate(follow, params, proposer="none").tokens
    fresh = eng.generate(follow, params, proposer="bridge", reuse=False)
    assert prop.last_reused == 0 and fresh.tokens == again.tokens
