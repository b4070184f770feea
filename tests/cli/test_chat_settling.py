"""`edgespec chat`'s idle-time work between turns, without a model: in a terminal it runs
while the next message is typed and the message stops it; from a pipe it runs first."""
from __future__ import annotations

import threading

from edgespec.cli.chat import _settling, _Ui
from edgespec.errors import EdgespecError


class Conv:
    def __init__(self, fail: bool = False) -> None:
        self.started = threading.Event()
        self.stopped = False
        self.fail = fail
        self.calls = 0

    def settle(self, stop=None):
        self.calls += 1
        self.started.set()
        if self.fail:
            raise EdgespecError("injected")
        while stop is not None and not stop():
            threading.Event().wait(0.001)
        self.stopped = stop is not None
        return 0


def test_in_a_terminal_it_runs_while_reading_and_the_message_stops_it():
    conv = Conv()
    with _settling(conv, background=True, ui=_Ui(False)):
        assert conv.started.wait(5)  # running while "the user types"
        assert not conv.stopped
    assert conv.stopped and conv.calls == 1


def test_from_a_pipe_it_runs_before_the_next_line_and_nothing_without_a_turn():
    conv = Conv()
    with _settling(conv, background=False, ui=_Ui(False)):
        assert conv.calls == 1
    with _settling(None, background=True, ui=_Ui(False)):
        pass


def test_a_failed_refresh_is_a_warning_not_the_end_of_the_chat(capsys):
    with _settling(Conv(fail=True), background=True, ui=_Ui(False)):
        pass
    assert "KV refresh failed (injected)" in capsys.readouterr().err
