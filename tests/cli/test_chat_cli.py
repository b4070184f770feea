"""`edgespec chat` through click's CliRunner on a real small model: one message per stdin line,
one JSON record per turn, commands, and a session that survives a restart."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edgespec.cli import cli


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    return tmp_path


def chat(model, stdin, *args):
    threads = os.environ.get("EDGESPEC_TEST_THREADS", "2")
    r = CliRunner().invoke(cli, ["chat", "--target", str(model), "--threads", threads, "--ctx",
                                 "1024", "--proposer", "ngram", "--no-adaptive", "--max-tokens",
                                 "12", *args], input=stdin)
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")], r


def test_json_turns_reuse_the_conversation_and_commands_answer(home, model_path):
    m = model_path("smollm2-135m")
    recs, _ = chat(m, "Name a colour.\n\n/stats\nAnd another one?\n/system Be brief.\n"
                      "/reset\nName a colour.\n", "--json")
    turns = [r for r in recs if "turn" in r]
    cmds = {r["command"]: r["result"] for r in recs if "command" in r}
    assert [t["turn"] for t in turns] == [1, 2, 1]  # /reset starts over
    t1, t2, t3 = turns
    for t in turns:
        assert t["text"] and t["stop_reason"] in ("eos", "length")
        assert t["prompt_reused"] + t["prompt_computed"] == t["prompt_tokens"]
        assert t["ttft_seconds"] > 0 and "acceptance_rate" in t and "decode_tokens_per_second" in t
    assert t1["prompt_reused"] == 0
    assert t2["prompt_reused"] > t2["prompt_computed"]  # turn 1 was not read again
    assert cmds["/stats"]["prompt_tokens"] == t1["prompt_tokens"]  # the last turn's stats
    # after /system and /reset the prompt differs from turn 1 only after the system message
    assert t3["prompt_tokens"] != t1["prompt_tokens"]


def test_save_then_resume_after_a_restart(home, model_path):
    m = model_path("smollm2-135m")
    recs, _ = chat(m, "Name a colour.\n/save colours\n", "--json")
    assert recs[-1]["command"] == "/save" and recs[-1]["result"].endswith("colours.session")
    # a new process: the conversation and its KV state come back
    recs, r = chat(m, "And another one?\n", "--json", "--session", "colours")
    (turn,) = [x for x in recs if "turn" in x]
    assert turn["turn"] == 1 and turn["prompt_reused"] > turn["prompt_computed"]
    assert "tokens of KV state restored" in r.output and "warning" not in r.output
    # a damaged session file: a warning, and the conversation is prefilled
    path = home / "sessions" / "colours.session"
    path.write_bytes(path.read_bytes()[:-7])
    recs, r = chat(m, "And another one?\n", "--json", "--session", "colours")
    (turn,) = [x for x in recs if "turn" in x]
    assert "warning" in r.output and turn["prompt_reused"] == 0


def test_bad_commands_and_sessions_do_not_end_the_chat(home, model_path):
    recs, r = chat(model_path("smollm2-135m"), "/frobnicate\n/load missing\n/save ../x\nHi\n",
                   "--json")
    assert "unknown command" in r.output and "no saved session" in r.output
    assert "session name" in r.output
    assert [x["turn"] for x in recs if "turn" in x] == [1]


def test_plain_text_mode_streams_the_answer(home, model_path):
    # the same greedy turn in --json mode says what the answer is; plain mode prints it
    recs, _ = chat(model_path("smollm2-135m"), "Name a colour.\n", "--json")
    (turn,) = [x for x in recs if "turn" in x]
    _, r = chat(model_path("smollm2-135m"), "Name a colour.\n")
    assert turn["text"].strip() and turn["text"].strip() in r.stdout
    assert not r.stdout.lstrip().startswith("{")  # text, not a JSON record


def test_json_mode_constrains_every_turn(home, model_path):
    m = model_path("smollm2-135m")
    schema = home / "colour.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"colour": {"type": "string"}},
                                  "required": ["colour"], "additionalProperties": False}))
    r = CliRunner().invoke(cli, ["chat", "--target", str(m), "--threads",
                                 os.environ.get("EDGESPEC_TEST_THREADS", "2"), "--ctx", "1024",
                                 "--max-tokens", "48", "--json-schema", str(schema), "--json"],
                           input="Name a colour as JSON.\nAnother one?\n")
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    turns = [t for t in recs if "turn" in t]
    assert len(turns) == 2
    for t in turns:
        if t["stop_reason"] == "eos":  # a finished answer is valid under the schema
            assert set(json.loads(t["text"])) == {"colour"}
        else:
            assert t["text"].lstrip().startswith("{")
