"""What the command line shows while the first run measures the machine: progress (what is
measured, how far, how long is left) and edgespec's warnings as one ``edgespec:`` line."""
from __future__ import annotations

import io
import subprocess
import sys
import warnings

from edgespec.calibration import progress
from edgespec.cli import feedback


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_task(out, monkeypatch, units=4):
    monkeypatch.setattr(progress, "UPDATE_INTERVAL", 0.0)
    old = progress.set_reporter(feedback.Progress(out))
    try:
        with progress.task("timing verify passes of 1-16 tokens", total=units) as t:
            for _ in range(units):
                t.advance()
    finally:
        progress.set_reporter(old)


def test_a_terminal_sees_what_is_measured_how_far_and_when_it_ends(monkeypatch):
    out = _Tty()
    _run_task(out, monkeypatch)
    text = out.getvalue()
    assert "measuring this model on this machine once" in text
    assert "timing verify passes of 1-16 tokens: 25%" in text and "s left" in text
    assert "100%" in text and "done in" in text
    assert "\r\x1b[K" in text  # one line redrawn, not a scroll of updates


def test_a_pipe_gets_one_note_per_measurement_and_no_redraws(monkeypatch):
    out = io.StringIO()
    _run_task(out, monkeypatch)
    lines = out.getvalue().splitlines()
    assert lines == ["edgespec: measuring this model on this machine once (cached afterwards)",
                     "edgespec: timing verify passes of 1-16 tokens..."]


def test_a_measurement_for_this_run_only_does_not_claim_to_be_a_cached_first_run(monkeypatch):
    """A bench's --record curves are measured on every run: saying "first run ... cached
    afterwards" before them is false, and had a reader wait for a cache that never came."""
    monkeypatch.setattr(progress, "UPDATE_INTERVAL", 0.0)
    out = io.StringIO()
    old = progress.set_reporter(feedback.Progress(out))
    try:
        with progress.task("timing verify passes after 4096 cached tokens", total=2, cached=False) as t:
            t.advance(2)
    finally:
        progress.set_reporter(old)
    text = out.getvalue()
    assert "measuring this model" not in text and "cached afterwards" not in text
    assert "edgespec: timing verify passes after 4096 cached tokens..." in text


def test_without_a_reporter_measuring_prints_nothing(capsys):
    old = progress.set_reporter(None)
    try:
        with progress.task("x", total=2) as t:
            t.advance(2)
    finally:
        progress.set_reporter(old)
    assert capsys.readouterr() == ("", "")


def test_eta_from_the_rate_so_far():
    assert progress.eta(0, 10, 5.0) is None
    assert progress.eta(5, 10, 5.0) == 5.0


def test_an_edgespec_warning_is_one_line_without_python_source():
    code = ("import warnings\n"
            "from edgespec.cli import feedback\n"
            "from edgespec.calibration.curve import CalibrationWarning\n"
            "from edgespec.engine import build\n"
            "feedback.install()\n"
            "warnings.warn_explicit('the machine is busy', CalibrationWarning, "
            "build.__file__, 82)\n"
            "warnings.warn('foreign', UserWarning)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "edgespec: the machine is busy"
    # a warning from outside edgespec keeps Python's own format
    assert any("UserWarning: foreign" in ln for ln in lines[1:])
