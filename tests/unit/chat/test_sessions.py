"""Sessions on disk: a conversation's messages and KV state survive a restart; a state saved
under another model, kernel configuration or build, or a damaged file, is never restored."""
from __future__ import annotations

import os
import warnings

import pytest

from edgespec.chat import sessions
from edgespec.runtime.kernel import KernelConfig
from edgespec.chat.conversation import Conversation
from edgespec.errors import EdgespecError, InvalidInputError
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.chat.sessions import SessionError, SessionWarning
from fakes import fake_engine
from test_conversation import TEMPLATE
from fakes.stateful import StatefulModel

#: an unseeded sample reuses every held position, the answers' too (a greedy turn reuses what
#: a prefill wrote: tests/unit/decoding/test_kv_refresh.py); the fake's PEAK makes its text
#: greedy's at this temperature
P = GenerationParams(max_tokens=6, sampling=SamplingParams(temperature=0.05))


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(sessions, "model_digest", lambda engine: engine.target.path.name)
    return tmp_path


def engine(name="fake.gguf"):
    return fake_engine(StatefulModel(name=name, chat_template=TEMPLATE), {}, n_ctx=512)


def talk(eng):
    conv = Conversation(eng, system="a", params=P)
    conv.ask("x")
    conv.ask("ab")
    return conv


def test_a_saved_conversation_resumes_in_a_new_engine_without_prefilling_it():
    eng = engine()
    conv = talk(eng)
    path = sessions.save(eng, conv, "trip")
    assert path.parent == sessions.paths.sessions_dir() and sessions.list_sessions() == ["trip"]
    assert not list(path.parent.glob("*.tmp"))

    eng2 = engine()  # a restart: nothing in the KV cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv2, got = sessions.load_conversation(eng2, "trip", params=P)
    assert got.restored == len(eng.kv_cache.held) and eng2.ctx.tokens() == eng.kv_cache.held
    assert conv2.messages == conv.messages and conv2.system == "a"
    t = conv2.ask("x")
    assert t.stats.prompt_reused == got.restored
    ref = engine().generate(conv2.history()[:-1], P)
    assert t.text == ref.text


@pytest.mark.parametrize("change, why", [
    ("model", "another model"),
    ("kernel", "another kernel configuration"),
])
def test_a_state_from_another_model_or_configuration_is_never_restored(change, why):
    eng = engine()
    conv = talk(eng)
    sessions.save(eng, conv, "s")
    other = engine(name="other.gguf") if change == "model" else engine()
    if change == "kernel":
        other.config = other.config.__class__(**{**other.config.__dict__,
                                                 "kernel": KernelConfig(repack=False)})
    with pytest.warns(SessionWarning, match=why):
        conv2, got = sessions.load_conversation(other, "s", params=P)
    assert got.restored == 0 and other.ctx.tokens() == [] and conv2.messages == conv.messages
    t = conv2.ask("x")
    assert t.stats.prompt_reused == 0
    assert t.text == engine().generate(conv2.history()[:-1], P).text


def test_a_truncated_state_keeps_the_messages_and_prefills():
    eng = engine()
    conv = talk(eng)
    path = sessions.save(eng, conv, "s")
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.warns(SessionWarning, match="truncated"):
        conv2, got = sessions.load_conversation(engine(), "s")
    assert got.restored == 0 and conv2.messages == conv.messages


def test_a_corrupt_state_byte_fails_its_checksum():
    eng = engine()
    path = sessions.save(eng, talk(eng), "s")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(SessionWarning, match="checksum"):
        _, got = sessions.load_conversation(engine(), "s")
    assert got.restored == 0


def test_a_state_llama_cpp_refuses_is_not_used():
    eng = engine()
    sessions.save(eng, talk(eng), "s")
    eng2 = engine()

    def refuse(state, seq_id=0):
        raise EdgespecError("refused")

    eng2.ctx.state_set = refuse
    with pytest.warns(SessionWarning, match="refused"):
        _, got = sessions.load_conversation(eng2, "s")
    assert got.restored == 0 and eng2.kv_cache.held == []


@pytest.mark.parametrize("damage, match", [
    (lambda d: d[:20], "not an edgespec session|truncated or corrupt"),
    (lambda d: b"GARBAGE" + d, "not an edgespec session"),
    (lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], "corrupt"),
    (lambda d: d[:16] + (9).to_bytes(4, "little") + d[20:], "format 9"),
])
def test_an_unreadable_header_is_refused_and_the_file_left_in_place(damage, match):
    eng = engine()
    path = sessions.save(eng, talk(eng), "s")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SessionError, match=match):
        sessions.load(engine(), "s")
    assert path.exists()


def test_missing_session_and_bad_names():
    with pytest.raises(SessionError, match="no saved session"):
        sessions.load(engine(), "nope")
    for bad in ("", "../x", "a/b", ".hidden", "x" * 65):
        with pytest.raises(InvalidInputError):
            sessions.session_path(bad)


def test_the_sessions_directory_stays_within_its_size_bound():
    eng = engine()
    conv = talk(eng)
    first = sessions.save(eng, conv, "s0")
    size = first.stat().st_size
    for i in range(1, 6):
        os.utime(sessions.session_path(f"s{i - 1}"), (i, i))  # strictly older than the next
        sessions.save(eng, conv, f"s{i}", max_total_bytes=3 * size + size // 2)
    assert sessions.list_sessions() == ["s3", "s4", "s5"]
    # a state larger than the whole bound: only the messages are kept
    with pytest.warns(SessionWarning, match="exceeds"):
        sessions.save(eng, conv, "big", max_total_bytes=100)
    _, got = sessions.load_conversation(engine(), "big")
    assert got.restored == 0
