"""A session `/load` whose KV state is skipped prints its one SessionWarning and nothing
else: no `ResourceWarning: unclosed file '/dev/null'` when the process exits (issue 29).

The chat process runs as a real subprocess, because the stray warnings appeared only at
interpreter shutdown: recording every warning category ("always") while one warning was
emitted left CPython's C-level filter list pointing at that temporary list, so at exit the
two /dev/null files llama-cpp-python keeps open for its whole life were reported.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import cli
from edgespec.cli.chat import _Ui, _with_warnings
from edgespec.chat.sessions import SessionWarning

ARGS = ["--threads", "1", "--ctx", "1024", "--proposer", "ngram", "--no-adaptive",
        "--max-tokens", "4"]


def _edgespec() -> list[str]:
    exe = Path(sys.executable).with_name("edgespec")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "edgespec.cli"]


@pytest.fixture()
def damaged_session(tmp_path, monkeypatch, model_path):
    """A saved session whose KV state fails its length check, so /load skips the state."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    m = model_path("smollm2-135m")
    r = CliRunner().invoke(cli, ["chat", "--target", str(m), *ARGS, "--json"],
                           input="Name a colour.\n/save hues\n")
    assert r.exit_code == 0, r.output
    path = tmp_path / "sessions" / "hues.session"
    path.write_bytes(path.read_bytes()[:-5])
    return m, tmp_path


@pytest.mark.parametrize("warn_opt", ["", "error::ResourceWarning"])
def test_loading_a_session_without_its_kv_state_warns_once_and_leaks_nothing(damaged_session,
                                                                            warn_opt):
    m, home = damaged_session
    env = {**os.environ, "EDGESPEC_HOME": str(home), "PYTHONWARNINGS": warn_opt}
    proc = subprocess.run(_edgespec() + ["chat", "--target", str(m), *ARGS, "--json"],
                          input="/load hues\n", capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert '"command": "/load"' in proc.stdout and "0 tokens of KV state restored" in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    # the one warning the user should read, and nothing after it
    assert lines == [ln for ln in lines if "not restoring the KV cache because its KV state is "
                                           "truncated" in ln], proc.stderr
    assert len(lines) == 1
    assert "ResourceWarning" not in proc.stderr and "/dev/null" not in proc.stderr


def test_reporting_warnings_records_only_what_it_reports():
    """The helper shows session warnings, and leaves every other category's filters as the
    user set them (an unclosed file stays ignored by default)."""
    shown = []
    ui = _Ui(as_json=False)
    ui.error = shown.append

    def emits():
        warnings.warn("state skipped", SessionWarning)
        warnings.warn(ResourceWarning("unclosed file"))
        return 7

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        assert _with_warnings(ui, emits) == 7
        assert _with_warnings(ui, emits) == 7  # "always": shown every time, not once
    assert shown == ["warning: state skipped", "warning: state skipped"]
