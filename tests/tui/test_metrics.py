"""Live numbers and their renderings, from literal events."""
from __future__ import annotations

from collections import Counter

import pytest

from edgespec.api.events import Control, Finished, PrefillDone, RequestStarted, Step
from edgespec.tui.app import parse_stop
from edgespec.tui.metrics import RATE_STEPS, VERIFY_SLOPE, LiveMetrics, fold_stats
from edgespec.tui.render import (LABEL, Palette, bar, histogram_text, live_text, positions_text,
                        spark_text, split_cells)
from edgespec.tui.widgets import History, step_pieces
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
               Control(1, "draft_length", "shorter", k=2)]:
        m.observe(ev)
    assert m.window_acceptance == pytest.approx(4 / 8)
    assert m.stats.acceptance_rate == pytest.approx(4 / 8)
    assert list(m.pass_acceptance) == [1.0, 0.0]
    assert m.k == 2 and m.proposer_now == "ngram"
    assert m.stats.accepted_length_hist == Counter({5: 1, 1: 2})


def test_rate_now_spans_the_recent_steps_after_the_first_token():
    m = LiveMetrics()
    m.observe(PrefillDone(1, 4, 1.0))
    m.observe(step(1.2, 0, 0, verify=0.0))  # the prefill's token: TTFT, not decode
    m.observe(step(1.5, 2, 2))  # 3 tokens
    m.observe(step(2.0, 0, 0))  # 1 token
    assert m.tokens_per_second_now == pytest.approx(4 / 0.8)
    for i in range(1, RATE_STEPS + 1):  # a long run: only the last RATE_STEPS steps count
        m.observe(step(2.0 + i, 0, 0, verify=1.0))
    assert m.tokens_per_second_now == pytest.approx(1.0)


def short_all_accepted_answer(prefill=0.5, ttft=0.855, pass_seconds=0.1) -> list:
    """A 12-token answer, drafts all accepted: the prefill's token, then passes of 3 + bonus,
    3 + bonus, 2 + bonus. The first token came 0.355 s after the prefill (a draft model
    reading the prompt): time the plain path does not spend between its tokens."""
    events = [RequestStarted(1, 200, "draft", "qwen-1.5b", "qwen-0.5b"),
              PrefillDone(1, 200, prefill), step(ttft, 0, 0, verify=0.0)]
    t = ttft
    for drafted in (3, 3, 2):
        t += pass_seconds
        events.append(step(t, drafted, drafted, verify=pass_seconds - 0.001, proposer="draft"))
    stats = fold_stats(events)
    stats.finish("length", t)
    return events + [Finished(1, "x" * 12, tuple(range(12)), "length", stats)]


def test_speedup_compares_decode_with_decode_and_shows_ttft_apart():
    # the plain path measured at 20 tok/s on this target (50 ms a step)
    m = LiveMetrics(plain_timing=(20, 1.0))
    events = short_all_accepted_answer()
    for ev in events[:-1]:
        m.observe(ev)
    live = live_text(m, rss=None, width=40).plain
    assert m.tokens_per_second_now == pytest.approx(11 / 0.3)
    m.observe(events[-1])
    done = live_text(m, rss=None, width=40).plain
    assert m.stats.generated_tokens == 12 and m.stats.acceptance_rate == 1.0
    # 11 tokens after the first in 0.3 s against 20 tok/s. Before, this read "16.8 tok/s
    # avg" (the 0.355 s before the first token counted as decode time) against a plain
    # rate of 21.0 (the first token counted as a plain step taking no time): ×0.80
    assert m.tokens_per_second_now == pytest.approx(11 / 0.3)
    for text in (live, done):
        assert "×1.83" in text and "20.0 tok/s measured" in text
        assert "ttft       855 ms prefill 500" in text
    assert "36.7 tok/s avg" in done


def test_plain_timing_counts_plain_decode_steps_only():
    m = LiveMetrics()
    m.observe(PrefillDone(1, 4, 0.5))
    m.observe(step(0.5, 0, 0, verify=0.0))  # the prefill's token: no step of its own
    for i in range(3):
        m.observe(step(0.6 + 0.1 * i, 0, 0, verify=0.1))
    m.observe(Step(1, (), "held back", (), None, 0, 0, 0.0, 0.0, 0.9))  # the closing flush
    assert m.plain_timing == (3, pytest.approx(0.3))
    assert m.plain_estimate().tokens_per_second == pytest.approx(10.0)
    assert m.stats.plain_steps == 4 and m.stats.generated_tokens == 4


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


def time_block(m: LiveMetrics, width: int = 30) -> tuple[dict[str, int], list[str]]:
    """The time row of the numbers block: cells per style name, and its caption lines."""
    p = Palette()
    text = live_text(m, rss=None, width=width, p=p)
    lines = text.plain.split("\n")
    row = next(i for i, line in enumerate(lines) if line.startswith("time"))
    end = next(i for i, line in enumerate(lines) if line.startswith("memory"))
    start = sum(len(line) + 1 for line in lines[:row]) + LABEL
    names = {p.dim: "pre", p.draft: "draft", p.verify: "verify", p.target: "plain"}
    cells = Counter()
    for span in text.spans:
        if start <= span.start < start + width - LABEL and span.style in names:
            cells[names[span.style]] += span.end - span.start
    assert all(len(line) <= width for line in lines[row:end]), lines[row:end]
    return dict(cells), [line.strip() for line in lines[row + 1:end]]


def test_the_time_split_files_plain_steps_under_plain_not_verify():
    # a plain-only stream: nothing drafted, so no verify pass and no draft time
    m = LiveMetrics()
    for ev in script(*[[(f" t{i}", T)] for i in range(6)]):
        m.observe(ev)
    split = m.time_split
    assert split["verify"] == 0 and split["draft"] == 0
    assert split["plain"] == pytest.approx(6 * 0.1) and split["pre"] == pytest.approx(0.05)
    cells, caption = time_block(m)
    assert set(cells) == {"pre", "plain"} and sum(cells.values()) == 30 - LABEL
    assert " ".join(caption) == "pre 8% plain 92%"  # before, "pre 8% draft 0% verify 92%"


def test_the_time_split_of_a_mixed_stream_keeps_verify_passes_apart():
    # the shape the bug was seen on: a 68-token answer with one draft (2 of 3 accepted) and
    # 65 plain steps showed "verify 90%"; its one verify pass is a sliver of the time
    steps = [[(" a", D), (" b", D), (" c", T)]] + [[(f" t{i}", T)] for i in range(65)]
    m = LiveMetrics()
    for ev in script(*steps):
        m.observe(ev)
    assert m.stats.generated_tokens == 68 and m.stats.verify_passes == 1
    split = m.time_split
    assert split["verify"] == pytest.approx(0.1)  # the one pass
    assert split["plain"] == pytest.approx(65 * 0.1)
    assert split["draft"] == pytest.approx(0.003) and split["pre"] == pytest.approx(0.05)
    total = sum(split.values())
    cells, caption = time_block(m)
    assert cells["plain"] >= 19 and cells.get("verify", 0) <= 1
    # every phase that took time is named, wrapped to the panel's width
    assert " ".join(caption) == " ".join(f"{k} {v / total:.0%}" for k, v in split.items())
    assert caption == ["pre 1% draft 0%", "verify 2% plain 98%"]  # was "verify 99%"

    # as many verify passes as plain steps, alike in time: two bars of the same length
    m = LiveMetrics()
    for ev in script(*[[(" a", D), (" b", T)], [(" c", T)]] * 10):
        m.observe(ev)
    assert m.time_split["verify"] == pytest.approx(m.time_split["plain"])
    cells, caption = time_block(m)
    assert cells == {"pre": 1, "verify": 10, "plain": 10}
    assert caption == ["pre 2% draft 1%", "verify 48% plain 48%"]


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


def test_tree_figures_show_only_where_trees_ran():
    from edgespec.api.stats import RequestStats
    from edgespec.tui.render import summary_line
    s = RequestStats(generated_tokens=20, total_seconds=1.0, stop_reason="length")
    assert "trees" not in summary_line(s)
    s.observe_tree(nodes=6, branches=2, accepted=3, off_first=True)
    s.observe_tree(nodes=6, branches=2, accepted=1, off_first=False)
    assert "trees 2 (path 2.00, off 1st 50%)" in summary_line(s)
