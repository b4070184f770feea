"""The vocabulary bridge on real tokenizers and models: SmolLM2-135M (GPT-2 BPE, 49k tokens)
and Gemma-3-270M (SentencePiece with byte fallback, 262k tokens) drafting for Qwen2.5 0.5B
(151k tokens). Exact mode keeps verify passes bitwise, so greedy bridged output must be the
plain path's token for token; sampling is checked seed for seed and by homogeneity tests.

These tests qualify the pairs pinned in models.toml (bridge version 1).
"""
from __future__ import annotations

import pytest

from edgespec.lab.analysis import parity as P
from edgespec.proposers.vocab_bridge import BRIDGE_VERSION, Bridge
from edgespec.api.params import GenerationParams, SamplingParams

TARGET = "qwen-0.5b"
DRAFTS = ["smollm2-135m", "gemma-270m"]

# real cases: a Spec-Bench translation prompt (question 1 of the translation category),
# CJK, emoji with a skin-tone modifier and a flag, combining characters, code with mixed
# indentation and whitespace runs, and tool-call-like markup
PROMPTS = {
    "translation": "Translate German to English: Pfandhäuser boomen in Singapur , da die Krise "
                   "in der Mittelschicht angekommen ist",
    "cjk": "请用中文写两句话介绍春天。",
    "emoji": "Repeat exactly, then stop: café ☕ naïve (nai\u0308ve) 👍🏽 🇩🇪 — “quotes”",
    "code": "Fix this Python function and return only the code:\n```python\ndef  add(a,b):\n"
            "  if a:\n\t\treturn  a+b\n        return b\n```",
    "tool": 'Call the weather tool for Berlin. Answer only with <tool_call>{"name": "get_weather", '
            '"arguments": {"city": "..."}}</tool_call>',
}
MAX_TOKENS = 40


@pytest.fixture(scope="module", params=DRAFTS)
def engine(request, engine_factory):
    return engine_factory(TARGET, draft=request.param, proposer="bridge", n_ctx=1024)


def _bridge(engine):
    return engine.proposers["bridge"]


@pytest.mark.parametrize("case", list(PROMPTS))
def test_greedy_bridged_output_is_the_plain_path(engine, case):
    params = GenerationParams(max_tokens=MAX_TOKENS)
    plain = engine.generate(PROMPTS[case], params, proposer="none")
    spec = engine.generate(PROMPTS[case], params, proposer="bridge")
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text and spec.stop_reason == plain.stop_reason
    assert spec.stats.drafted > 0  # the bridge proposed target tokens on this text
    times = _bridge(engine).last
    assert times.steps > 0 and times.target_tokens > 0
    assert times.bridge_seconds > 0 and times.draft_seconds > times.bridge_seconds


def test_bridged_drafts_are_accepted(engine):
    """Text the target copies from its prompt: the draft's text is the target's, so its
    re-tokenized proposals must be accepted (a broken alignment would be rejected)."""
    prompt = ("Repeat this sentence exactly once: The quick brown fox jumps over the lazy dog "
              "while the cat sleeps.")
    params = GenerationParams(max_tokens=24)
    plain = engine.generate(prompt, params, proposer="none")
    spec = engine.generate(prompt, params, proposer="bridge")
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted >= 0.5 * spec.stats.drafted, spec.stats


def test_multi_turn_chat_template_markers(engine):
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "Name a prime number."},
                {"role": "assistant", "content": "7 is a prime number."},
                {"role": "user", "content": "Name another one, in German."}]
    params = GenerationParams(max_tokens=24)
    plain = engine.generate(messages, params, proposer="none")
    spec = engine.generate(messages, params, proposer="bridge")
    assert spec.tokens == plain.tokens
    assert "<|im_" not in spec.text and "<start_of_turn>" not in spec.text


def test_stop_string_inside_a_bridged_draft(engine):
    prompt = PROMPTS["code"]
    free = engine.generate(prompt, GenerationParams(max_tokens=MAX_TOKENS), proposer="none").text
    stop = free[len(free) // 2: len(free) // 2 + 5]
    assert stop.strip(), free
    params = GenerationParams(max_tokens=MAX_TOKENS, stop=(stop,))
    plain = engine.generate(prompt, params, proposer="none")
    spec = engine.generate(prompt, params, proposer="bridge")
    assert plain.stop_reason == spec.stop_reason == "stop"
    assert spec.text == plain.text and stop not in spec.text


def test_eos_from_the_draft(engine):
    prompt = "Answer with one word only: what colour is a clear daytime sky?"
    params = GenerationParams(max_tokens=24)
    plain = engine.generate(prompt, params, proposer="none")
    spec = engine.generate(prompt, params, proposer="bridge")
    assert plain.stop_reason == spec.stop_reason == "eos"
    assert spec.tokens == plain.tokens
    if _bridge(engine).model.path.stem == "smollm2-135m":
        # SmolLM2's <|im_end|> is proposed as Qwen's own: the target can end on a draft
        assert _bridge(engine).last.ends >= 1


def test_sampling_is_lossless_seed_for_seed(engine):
    """A bridged proposal is a point mass: verification draws the target's token with the
    request's generator and accepts the draft token only if they agree, one uniform per
    emitted token, so a seed gives the plain path's sample exactly."""
    drafted = 0
    for seed in range(3):
        sp = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        gp = GenerationParams(max_tokens=16, sampling=sp)
        plain = engine.generate(PROMPTS["translation"], gp, proposer="none")
        spec = engine.generate(PROMPTS["translation"], gp, proposer="bridge")
        assert spec.tokens == plain.tokens, seed
        drafted += spec.stats.drafted
    assert drafted > 0


def test_sampling_parity_passes(engine):
    pr = P.ParityPrompt("capital", "test", "The capital of France is Paris. The capital of Italy is")
    report = P.ConfigReport("bridge", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, [pr], ["bridge"], SamplingParams(temperature=1.0),
                                             n_seeds=30, positions=3, chat=False))
    assert report.n_tests == 4
    assert report.sampling_ok, report.to_json()


# --- the alignment on the real vocabularies (no decoding) --------------------------------
def _vocabs(engine):
    return _bridge(engine).model, engine.target


def test_real_end_tokens_map_by_text(engine):
    draft, target = _vocabs(engine)
    b = Bridge(draft, target, target.tokenize("Hi", add_special=False))
    b.begin()
    for t in draft.tokenize(" Hello there", add_special=False, parse_special=False):
        b.push(t)
    b.push(draft.eos)
    toks, _ = b.proposal(16)
    text = target.detokenize([t for t in toks if not target.is_eog(t)])
    assert text == b" Hello there"
    end_text = draft.token_piece(draft.eos, special=True)
    if target.tokenize(end_text.decode(), add_special=False, parse_special=True) == [toks[-1]]:
        assert target.is_eog(toks[-1])  # mapped to the target's own control token
    else:
        assert b"<" not in target.detokenize(toks, special=True)  # never as text


def test_real_partial_and_malformed_bytes(engine):
    draft, target = _vocabs(engine)
    b = Bridge(draft, target, target.tokenize("Say", add_special=False))
    text = " 你好 👍🏽 done"
    b.begin()
    toks = draft.tokenize(text, add_special=False, parse_special=False)
    pushed = b""
    for t in toks:
        b.push(t)
        pushed += draft.token_piece(t)
        got = target.detokenize(b.proposal(32)[0])
        # only text the draft finished reaches the target (a byte-level target may still
        # split a character across its own tokens, as it would generating it)
        whole = pushed.decode("utf-8", "ignore").encode()
        assert pushed.startswith(whole) and whole.startswith(got)
    assert len(toks) > len(text.split())  # the draft did split characters into bytes
    b = Bridge(draft, target, target.tokenize("Say", add_special=False))
    b.begin()
    for t in draft.tokenize(" ok fine", add_special=False, parse_special=False):
        b.push(t)
    bad = [t for t in range(min(draft.n_vocab, 300)) if draft.token_piece(t) == b"\xff"]
    if bad:  # a byte-fallback / byte-level token for a byte no UTF-8 text contains
        b.push(bad[0])
        for t in draft.tokenize(" more", add_special=False, parse_special=False):
            b.push(t)
        assert target.detokenize(b.proposal(32)[0]) == b" ok fine"


def test_real_sync_reencodes_only_the_changed_tail(engine):
    draft, target = _vocabs(engine)
    b = Bridge(draft, target, target.tokenize("Count:", add_special=False))
    b.begin()
    for t in draft.tokenize(" one two three four", add_special=False, parse_special=False):
        b.push(t)
    props, _ = b.proposal(8)
    assert target.detokenize(props) == b" one two three"
    kept_before = len(b.tokens)
    # the target accepts " one two" and then chooses " five" itself
    unchanged = b.accept([*props[:2], *target.tokenize(" five", add_special=False)])
    assert unchanged >= kept_before + 1  # " one two" stayed in the draft's KV
    assert draft.detokenize(b.tokens).endswith(b"Count: one two five")


# --- the pin: a changed tokenizer is refused ------------------------------------------------
def test_pair_with_a_changed_tokenizer_is_refused(engine, tmp_path, monkeypatch):
    from edgespec.registry import registry_path
    from edgespec.registry.bridge_pins import UnqualifiedBridgeError, check_pair

    draft, target = _vocabs(engine)
    assert check_pair(target, draft, BRIDGE_VERSION).draft == draft.path.stem
    with pytest.raises(UnqualifiedBridgeError, match="bridge version"):
        check_pair(target, draft, "999")
    text = registry_path().read_text()
    pin = check_pair(target, draft, BRIDGE_VERSION).draft_vocab_sha256
    changed = tmp_path / "models.toml"
    changed.write_text(text.replace(pin, "0" * 64))
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(changed))
    with pytest.raises(UnqualifiedBridgeError, match="changed since the bridge pair was qualified"):
        check_pair(target, draft, BRIDGE_VERSION)
