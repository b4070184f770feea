"""Live numbers and their renderings, from literal events."""
from __future__ import annotations

from collections import Counter

import pytest

from edgespec.events import Control, PrefillDone, RequestStarted, Step
from tui.app import parse_stop
from tui.metrics import VERIFY_SLOPE, LiveMetrics, fold_stats
from tui.render import bar, histogram_text, live_text, positions_text, spark_text, split_cells
from tui.widgets import History, step_pieces
from tui_helpers import script

D, T = "draft", "target"


def step(t, drafted, accepted, n=None, verify=0.1, proposer="ngram"):
    n = accepted + 1 if n is None else n
    return Step(1, tuple(range(n)), "x" * n, (D,) * accepted + (T,) * (n - accepted),
                proposer if drafted else None, drafted, accepted, 0.001, verify, t)


def test_window_and_request_acceptance_and_draft_length():
    m = LiveMetrics()
    for ev in [RequestStarted(1, 4, "ngram", "q"), PrefillDone(1, 4, 0.2),
               step(0.3, 4, 4), step(0.4, 4, 0), step(0.5, 0, 0),
               Control(1, "draft_length", "shorter", draft_length=2)]:
        m.observe(ev)
    assert m.window_acceptance == pytest.approx(4 / 8)
    assert m.stats.acceptance_rate == pytest.approx(4 / 8)
    assert list(m.pass_acceptance) == [1.0, 0.0]
    assert m.draft_length == 2 and m.proposer_now == "ngram"
    assert m.stats.accepted_length_hist == Counter({5: 1, 1: 2})


def test_rate_now_spans_the_recent_steps():
    m = LiveMetrics()
    m.observe(PrefillDone(1, 4, 1.0))
    m.observe(step(1.5, 2, 2))  # 3 tokens
    m.observe(step(2.0, 0, 0))  # 1 token
    assert m.tokens_per_second_now == pytest.approx(4 / 1.0)


def test_plain_estimate_prefers_timed_plain_steps_then_the_cost_model():
    m = LiveMetrics()
    assert m.plain_estimate() is None
    m.observe(step(0.2, 4, 1, verify=0.1 * (1 + VERIFY_SLOPE * 4)))
    est = m.plain_estimate()
    assert est.basis == "model" and est.tokens_per_second == pytest.approx(10.0)
    for i in range(3):
        m.observe(step(0.3 + i * 0.05, 0, 0, verify=0.05))
    est = m.plain_estimate()
    assert est.basis == "measured" and est.tokens_per_second == pytest.approx(20.0)
    # what earlier requests on this target timed carries over
    later = LiveMetrics(plain_timing=m.plain_timing)
    assert later.plain_estimate().tokens_per_second == pytest.approx(20.0)


def test_fold_stats_matches_the_engine_vocabulary():
    events = script([("a", D), ("b", D), ("c", T)], [("d", T)])
    s = fold_stats(events[:-1])
    assert (s.generated_tokens, s.drafted, s.accepted, s.verify_passes, s.plain_steps) == (4, 3, 2, 1, 1)
    assert s.proposer == "ngram" and s.prompt_tokens == 5


def test_step_pieces_use_per_token_text_or_fall_back_to_a_proportional_split():
    exact = Step(1, (1, 2, 3), "foobar!", (D, D, T), "ngram", 3, 2, 0, 0, 0,
                 pieces=("foo", "bar", "!"))
    assert step_pieces(exact) == [("foo", D), ("bar", D), ("!", T)]
    legacy = Step(1, (1, 2), "abcd", (D, T), "ngram", 2, 1, 0, 0, 0)
    assert step_pieces(legacy) == [("ab", D), ("cd", T)]
    plain = Step(1, (1,), "z", (T,), None, 0, 0, 0, 0, 0)
    assert step_pieces(plain) == [("z", T)]


def test_bars_and_cells():
    assert bar(0.0, 4) == "    " and bar(1.0, 4) == "████" and bar(0.5, 4) == "██  "
    assert bar(1 / 16, 2) == "▏ "
    assert split_cells([1, 1, 2], 8) == [2, 2, 4]
    assert sum(split_cells([0.3, 0.01, 5], 21)) == 21
    assert split_cells([0, 0], 5) == [0, 0]


def test_renderings_fit_their_width_and_show_the_numbers():
    m = LiveMetrics()
    for ev in script([("a", D), ("b", D), ("c", T)], [("d", T)], [("e", D), ("f", T)]):
        m.observe(ev)
    width = 30
    text = live_text(m, rss=300 * 2**20, width=width)
    lines = text.plain.split("\n")
    assert all(len(line) <= width for line in lines), lines
    assert "60% req" in text.plain and "300 MiB RSS" in text.plain and "avg" in text.plain
    hist = histogram_text(m.stats.accepted_length_hist, width=width).plain.split("\n")
    assert hist[0].startswith("accepted length") and len(hist) == 1 + 3
    assert all(len(line) <= width for line in hist)
    pos = positions_text(m.stats.position_acceptance, m.stats.position_drafted, width=width)
    rows = pos.plain.split("\n")[1:]
    assert [r[-4:] for r in rows] == ["100%", " 50%", "  0%"]  # drafted 2, 2, 1 times


def test_sparkline_is_absolute_and_marks_rejected_passes():
    t = spark_text([1.0, 0.5, 0.0, 0.25], width=10)
    top, bottom = t.plain.split("\n")
    assert top == "█   " and bottom == "██▁▄"
    assert spark_text([0.5] * 50, width=10).plain.split("\n")[1] == "█" * 10
    assert "no verify pass" in spark_text([], width=10).plain


def test_histogram_skips_empty_lengths_only_in_a_long_tail():
    short = histogram_text(Counter({1: 5, 3: 1}), width=30).plain.split("\n")[1:]
    assert [r.split()[0] for r in short] == ["1", "2", "3"]
    tail = histogram_text(Counter({1: 60, 4: 2, 11: 2}), width=30).plain.split("\n")[1:]
    assert [r.split()[0] for r in tail] == ["1", "4", "11"]


def test_parse_stop_strings():
    assert parse_stop("") == ()
    assert parse_stop(r"\n\n, END ,###") == ("\n\n", "END", "###")
    assert parse_stop(r"a\,b, \t") == ("a,b", "\t")


def test_history_recall_keeps_what_was_being_typed():
    h = History()
    assert h.recall(-1, "x") is None
    h.add("one")
    h.add("two")
    h.add("two")  # repeats collapse
    assert h.recall(-1, "typing") == "two"
    assert h.recall(-1, "two") == "one"
    assert h.recall(-1, "one") is None
    assert h.recall(+1, "one") == "two"
    assert h.recall(+1, "two") == "typing"
    assert h.recall(+1, "typing") is None
