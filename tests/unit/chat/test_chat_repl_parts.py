"""The parts of `edgespec chat` that make it a REPL, without a model: the reader's
continuations and /paste, the history file, the stats footer, and listing saved sessions."""
from __future__ import annotations

import io
import os
import time

import pytest

from edgespec.api.stats import RequestStats
from edgespec.chat import sessions
from edgespec.chat.conversation import Conversation
from edgespec.chat.footer import footer
from edgespec.chat.lineinput import LineReader
from edgespec.api.params import GenerationParams
from fakes import fake_engine
from fakes.stateful import StatefulModel
from test_conversation import TEMPLATE


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(sessions, "model_digest", lambda engine: engine.target.path.name)
    return tmp_path


def scripted(lines):
    it = iter(lines)

    def ask(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return ask


def test_a_trailing_backslash_continues_the_message_on_a_terminal(tmp_path):
    r = LineReader(True, history=tmp_path / "h", ask=scripted(["def f():\\", "    pass", "hi"]))
    assert r.read() == "def f():\n    pass"
    assert r.read() == "hi"
    assert r.read() is None


def test_paste_reads_up_to_end_and_a_pipe_keeps_backslashes(tmp_path):
    r = LineReader(True, history=tmp_path / "h", ask=scripted(["a \\", "b", "/end", "next"]))
    assert r.paste() == "a \\\nb"
    assert r.read() == "next"
    piped = LineReader(False, stream=io.StringIO("x \\\ny\n/paste\n1\n2\n/end\n"))
    assert piped.read() == "x \\" and piped.read() == "y"  # one message per line, as before
    assert piped.read() == "/paste" and piped.paste() == "1\n2"
    assert piped.read() is None


def test_history_persists_atomically_across_readers(tmp_path):
    path = tmp_path / "sub" / "input_history"
    r = LineReader(True, history=path, ask=scripted([]))
    r._readline.add_history("first line")
    r._readline.add_history("second line")
    r.save_history()
    assert path.read_text().splitlines() == ["first line", "second line"]
    assert [p.name for p in path.parent.iterdir()] == ["input_history"]  # no temporary left
    again = LineReader(True, history=path, ask=scripted([]))
    rl = again._readline
    got = [rl.get_history_item(i) for i in range(1, rl.get_current_history_length() + 1)]
    assert got == ["first line", "second line"]


def test_the_footer_says_only_what_applies():
    s = RequestStats(proposer="ngram")
    s.generated_tokens, s.total_seconds, s.ttft_seconds, s.drafted, s.accepted = 12, 0.6, 0.05, 8, 6
    line = footer(s, plain_step_seconds=None)  # 11 decode tokens in 0.55 s: 20 tok/s
    assert line == "12 tok in 0.60 s · 20.0 tok/s · drafted 8, accepted 6 (75%)"
    assert footer(s, plain_step_seconds=0.1).endswith(" · 2.00× plain (10.0 tok/s)")
    plain = RequestStats(proposer="none")
    plain.generated_tokens, plain.total_seconds = 5, 1.0
    assert footer(plain) == "5 tok in 1.00 s"  # no rate without a TTFT, nothing drafted
    idle = RequestStats(proposer="draft")
    idle.generated_tokens, idle.total_seconds = 5, 1.0
    assert "draft: nothing drafted" in footer(idle)


def test_sessions_are_listed_newest_first_and_the_latest_resumes(home):
    eng = fake_engine(StatefulModel(name="fake.gguf", chat_template=TEMPLATE), {}, n_ctx=512)
    conv = Conversation(eng, params=GenerationParams(max_tokens=4))
    conv.ask("ab  c\nd")
    sessions.save(eng, conv, "older")
    conv.ask("x")
    sessions.save(eng, conv, "newer")
    past = time.time() - 100
    os.utime(home / "sessions" / "older.session", (past, past))
    (home / "sessions" / "broken.session").write_bytes(b"not a session")
    listed = sessions.describe()
    assert [s.name for s in listed] == ["newer", "older"]  # the broken one is left out
    assert listed[0].turns == 2 and listed[1].turns == 1
    assert listed[0].first == "ab c d"  # on one line
    assert sessions.latest() == "newer"
    assert sessions.auto_name(0).startswith("chat-19")
