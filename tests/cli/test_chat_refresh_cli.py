"""`edgespec chat --exact` refreshes the answer's KV between turns (Conversation.settle), so
the next turn reuses the answer too, not only the previous prompt."""
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


def test_exact_chat_reuses_the_refreshed_answer(home, model_path):
    m = model_path("smollm2-135m")
    threads = os.environ.get("EDGESPEC_TEST_THREADS", "2")
    r = CliRunner().invoke(cli, ["chat", "--target", str(m), "--threads", threads, "--ctx", "1024",
                                 "--proposer", "ngram", "--max-tokens", "32", "--exact", "--json"],
                           input="Name three colours.\nAnd three animals?\n")
    assert r.exit_code == 0, r.output
    t1, t2 = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert t1["generated_tokens"] > 8
    # without the refresh exact mode reuses at most turn 1's prompt
    assert t2["prompt_reused"] > t1["prompt_tokens"] + t1["generated_tokens"] - 8
    assert "refresh failed" not in r.output
