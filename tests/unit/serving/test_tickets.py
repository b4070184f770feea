"""Tickets without a scheduler: cancelling calls back whoever issued them."""
from __future__ import annotations

import ast
from pathlib import Path

from edgespec.serving.tickets import Choices, Ticket


def _ticket(i: int, cancels: list[int]) -> Ticket:
    return Ticket(i, lambda ev: None, lambda t: cancels.append(t.id), prepared=None)  # type: ignore[arg-type]


def test_cancel_sets_the_flag_and_calls_back_with_the_ticket():
    cancels: list[int] = []
    t = _ticket(7, cancels)
    t.cancel()
    assert t.cancelled.is_set() and cancels == [7]


def test_choices_cancel_the_leader_last():
    cancels: list[int] = []
    c = Choices([_ticket(i, cancels) for i in range(3)])
    c.cancel()
    assert cancels == [2, 1, 0]


def test_tickets_do_not_import_the_scheduler():
    # the arrow runs scheduler -> tickets only (TYPE_CHECKING imports count: issue #41)
    src = Path(__file__).resolve().parents[3] / "edgespec" / "serving" / "tickets.py"
    names = {n.module for n in ast.walk(ast.parse(src.read_text(encoding="utf-8")))
             if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.endswith("scheduler") for m in names)
