"""`edgespec chat` as a REPL: every turn saved and listed, `--resume` going on with the latest,
a stats footer per turn; on a real terminal (tmux), line editing and a history that persists
across runs, with no raw escape sequences echoed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import cli

ARGS = ["--threads", "1", "--ctx", "1024", "--proposer", "ngram", "--no-adaptive",
        "--max-tokens", "6"]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    return tmp_path


def run(*args, stdin=""):
    r = CliRunner().invoke(cli, ["chat", *args], input=stdin)
    assert r.exit_code == 0, r.output
    return r


def test_turns_are_saved_listed_and_resumed(home, model_path):
    m = str(model_path("smollm2-135m"))
    r = run("--target", m, *ARGS, stdin="Name a colour.\nAnd another?\n")
    assert r.stdout.strip()  # the answers
    footers = [ln for ln in r.stderr.splitlines() if " tok in " in ln]
    assert len(footers) == 2 and all("tok/s" in f for f in footers)
    (name,) = [p.stem for p in (home / "sessions").glob("*.session")]
    assert name.startswith("chat-")
    listed = run("--list").stdout
    assert name in listed and "2 turns" in listed and "Name a colour." in listed
    rows = [json.loads(x) for x in run("--list", "--json").stdout.splitlines()]
    assert [(x["name"], x["turns"]) for x in rows] == [(name, 2)]
    # --resume without a name: the latest, its KV state restored, later turns saved into it
    r = run("--target", m, *ARGS, "--resume", "--json", stdin="One more?\n")
    assert "tokens of KV state restored" in r.output
    (turn,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"turn"')]
    assert turn["prompt_reused"] > turn["prompt_computed"]
    assert [(x["name"], x["turns"]) for x in
            map(json.loads, run("--list", "--json").stdout.splitlines())] == [(name, 3)]


def test_no_save_keeps_nothing_and_a_missing_resume_is_refused(home, model_path):
    m = str(model_path("smollm2-135m"))
    run("--target", m, *ARGS, "--no-save", stdin="Hi\n")
    assert not list((home / "sessions").glob("*.session"))
    r = CliRunner().invoke(cli, ["chat", "--target", m, *ARGS, "--resume"])
    assert r.exit_code != 0 and "no saved conversation to resume" in r.output
    r = CliRunner().invoke(cli, ["chat", "--target", m, *ARGS, "--resume", "../x"])
    assert r.exit_code != 0 and "session name" in r.output


def test_reset_starts_a_new_saved_conversation(home, model_path):
    m = str(model_path("smollm2-135m"))
    run("--target", m, *ARGS, stdin="Hi\n/reset\nHello\n")
    listed = sorted(p.stem for p in (home / "sessions").glob("*.session"))
    assert len(listed) == 2  # the first conversation is not overwritten by the second


# --- a real terminal ---------------------------------------------------------------------
def _edgespec() -> str:
    exe = Path(sys.executable).with_name("edgespec")
    return str(exe) if exe.exists() else f"{sys.executable} -m edgespec"


class Tmux:
    def __init__(self, name: str, env: dict) -> None:
        self.name, self.env = name, env

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], env=self.env, check=True, text=True,
                              capture_output=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-J", "-S", "-200", "-t", self.name)

    def wait_for(self, text: str, count: int = 1, timeout: float = 90.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = self.screen()
            if s.count(text) >= count:
                return s
            time.sleep(0.3)
        raise AssertionError(f"{text!r} ×{count} never appeared:\n{self.screen()}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_on_a_terminal_up_recalls_history_across_runs(home, model_path, tmp_path):
    m = str(model_path("smollm2-135m"))
    env = {**os.environ, "EDGESPEC_HOME": str(home), "TMUX_TMPDIR": str(tmp_path),
           "TERM": "xterm-256color"}
    env.pop("TMUX", None)
    t = Tmux("edgespec-chat-test", env)
    cmd = f"{_edgespec()} chat --target {m} {' '.join(ARGS)}"
    t("new-session", "-d", "-s", t.name, "-x", "160", "-y", "50", cmd)
    try:
        t.wait_for("commands: /help")
        t("send-keys", "-t", t.name, "Say hi\\", "Enter")  # continues on the next line
        t.wait_for("… ")
        t("send-keys", "-t", t.name, "in French.", "Enter")
        t.wait_for(" tok in ")
        t("send-keys", "-t", t.name, "/help", "Enter")
        t.wait_for("continues the message")
        t("send-keys", "-t", t.name, "Up", "Up", "Up")  # /help, "in French.", "Say hi\"
        time.sleep(1.0)
        screen = t.screen()
        assert "^[[A" not in screen and "\x1b" not in screen
        assert screen.rstrip().splitlines()[-1] == "> Say hi\\"
        t("send-keys", "-t", t.name, "C-u", "/quit", "Enter")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and t.name in subprocess.run(
                ["tmux", "ls"], env=env, text=True, capture_output=True).stdout:
            time.sleep(0.3)
        history = (home / "sessions" / "input_history").read_text().splitlines()
        assert history == ["Say hi\\", "in French.", "/help", "/quit"]
        # a new run: Up recalls the last run's input
        t("new-session", "-d", "-s", t.name, "-x", "160", "-y", "50", cmd)
        t.wait_for("commands: /help")
        t("send-keys", "-t", t.name, "Up", "Up")
        time.sleep(1.0)
        assert t.screen().rstrip().splitlines()[-1] == "> /help"
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)
