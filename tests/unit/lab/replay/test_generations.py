"""The replay simulator: the shipped n-gram proposer, trace files, step accounting."""
from __future__ import annotations

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.control import FixedController
from edgespec.proposers import free_proposer
from edgespec.proposers.base import Draft
from edgespec.lab.replay.generations import (Trace, compare, format_table, from_proposer, load_traces,
                                        native_proposers, recorded, replay, save_traces,
                                        standard_configs)

CAL = Calibration.from_costs({1: 1.0, 2: 1.5, 4: 2.0, 16: 4.0}, step_seconds=0.1)


def ngram(trace: Trace, **options):
    return from_proposer(free_proposer("ngram", **options), trace)


def test_the_simulators_ngram_is_the_shipped_proposer():
    """What followed the latest earlier occurrence of the longest matching tail, fed the
    emitted tokens as the engine feeds its session."""
    t = Trace("t", (1, 2, 3, 4, 5, 9, 2, 3), (4, 5))
    look = ngram(t, min_n=1, max_n=3, max_draft=15)
    # "2 3" occurred before, followed by 4 5 9 2 3 (the draft runs on through its own tail)
    d = look(list(t.prompt), 2)
    assert d.tokens == (4, 5) and d.match_length == 2
    # after the session has seen 4 5, the tail "3 4 5" matched: what followed it
    assert look([*t.prompt, 4, 5], 1).tokens == (9,)
    assert len(ngram(Trace("n", (1, 2, 3), ()), min_n=1)([1, 2, 3], 4)) == 0  # nothing repeats
    # the per-trace factory builds the same proposer, one fresh session per trace
    assert native_proposers(["ngram"], {"ngram": {"min_n": 1}})(t)["ngram"](list(t.prompt), 2) == d


def test_trace_file_round_trip(tmp_path):
    t = Trace("a", (1, 2), (3, 4, 5), "qa", drafts={"draft": [{"tokens": [3, 4]}, None, {"tokens": [5]}]})
    path = tmp_path / "t.jsonl"
    save_traces([t, Trace("b", (9,), (8,))], path)
    back = load_traces(path)
    assert back[0] == t and back[1].name == "b" and back[1].category == ""


def test_replay_charges_each_pass_from_the_curve():
    t = Trace("t", (1, 2, 3, 1, 2, 3), (1, 2, 3, 7, 7))
    plain = replay(t, FixedController(None, 1), CAL, {})
    assert plain.steps == 5 and plain.seconds == pytest.approx(0.5)
    # ngram drafts 1 2 3 (the tail "1 2 3" occurred at the start): accepted, then 7 is the
    # target's own token
    spec = replay(t, FixedController("ngram", 3), CAL, {"ngram": ngram(t, min_n=1)})
    assert spec.tokens == 5
    assert spec.decisions[0][1].k == 3
    assert spec.accepted >= 3
    assert spec.seconds < plain.seconds


def test_recorded_drafts_replay_with_confidence():
    t = Trace("t", (1,), (5, 6, 7), drafts={"draft": [{"tokens": [5, 6, 0], "confidence": [0.9, 0.8, 0.1]},
                                                      None, None]})
    fn = recorded(t, "draft")
    d = fn([1], 2)
    assert d.tokens == (5, 6) and d.confidence == (0.9, 0.8)
    assert len(fn([1, 5], 2)) == 0
    res = replay(t, FixedController("draft", 2), CAL, {"draft": fn}, costly={"draft": 0.05})
    assert res.tokens == 3 and res.accepted == 2
    assert res.seconds == pytest.approx(0.05 * 2 + CAL.seconds(3))


def test_compare_reports_adaptive_no_slower_than_plain_on_novel_text():
    novel = Trace("novel", tuple(range(50)), tuple(range(100, 300)), "writing")
    table = compare([novel], CAL, native_proposers(["ngram"]), standard_configs(CAL, ["ngram"]))
    assert table["adaptive"]["novel"] == pytest.approx(1.0)
    text = format_table(table, [novel])
    assert "| adaptive |" in text and "writing" in text


def test_adaptive_control_on_recorded_generations():
    """Regression guard for the controller's tuning, on real outputs.

    The traces are Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) greedy answers, 96 tokens at most, to
    the first Spec-Bench question of each category and HumanEvalFix Python/0, recorded on the
    plain path (each prompt's tokens and the output's); the cost curve is this 2-core CPU's. Replaying is
    deterministic, so these bounds are exact properties of the current controller.
    """
    from pathlib import Path

    traces = load_traces(Path(__file__).parents[3] / "data" / "spec_bench_traces_qwen15b.jsonl")
    cal = Calibration.prior_cpu()
    from edgespec.api.stats import geometric_mean as geomean

    # the n-gram proposer matching from a single token on (orders 1-8): fixed lengths draft
    # on every weak match and lose, the controller drafts only where it pays
    table = compare(traces, cal, native_proposers(["ngram"], {"ngram": dict(min_n=1, max_n=8,
                                                                             max_draft=15)}),
                    standard_configs(cal, ["ngram"]))
    adaptive = table["adaptive"]
    by_cat = {t.category: adaptive[t.name] for t in traces}
    assert min(by_cat.values()) >= 0.96, by_cat  # never clearly slower than plain
    assert by_cat["summarization"] >= 1.15
    best_fixed = max(geomean(row.values()) for name, row in table.items() if name != "adaptive")
    assert geomean(adaptive.values()) >= best_fixed + 0.05
    # with its default orders (2-5) the proposer drafts less often, so fixed lengths lose
    # less, and the controller still comes out ahead
    table = compare(traces, cal, native_proposers(["ngram"], {"ngram": dict(max_draft=15)}),
                    standard_configs(cal, ["ngram"]))
    by_cat = {t.category: table["adaptive"][t.name] for t in traces}
    assert min(by_cat.values()) >= 0.98 and by_cat["summarization"] >= 1.2, by_cat
    best_fixed = max(geomean(row.values()) for name, row in table.items() if name != "adaptive")
    assert geomean(table["adaptive"].values()) >= best_fixed + 0.01


def test_foresight_bounds_every_controller_and_is_plain_without_matches():
    from edgespec.lab.replay.generations import foresight
    cal = Calibration.from_costs({1: 1.0, 2: 1.5, 4: 1.9, 8: 3.0, 16: 3.4}, step_seconds=0.1)
    # a repetitive output the n-gram proposer can copy from the prompt
    t = Trace("t", prompt=tuple([5, 6, 7, 8, 9] * 6), output=tuple([5, 6, 7, 8, 9] * 4))
    bound = foresight(t, cal, native_proposers(["ngram"])(t))
    adaptive = compare([t], cal, native_proposers(["ngram"]),
                       standard_configs(cal, ["ngram"]))["adaptive"]["t"]
    assert bound > 1.5 and bound >= adaptive - 1e-9
    # nothing to copy: the bound is the plain path
    t2 = Trace("t2", prompt=(1, 2, 3), output=(11, 12, 13, 14))
    assert foresight(t2, cal, native_proposers(["ngram"])(t2)) == 1.0


def test_copy_bound_caps_the_copying_proposers_and_counts_what_followed_a_tail():
    from edgespec.lab.replay.generations import best_cut, copy_bound, foresight
    cal = Calibration.from_costs({1: 1.0, 2: 1.5, 4: 1.9, 8: 3.0, 16: 3.4}, step_seconds=0.1)
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 2, 3, 9, 10, 11, 12)
    t = Trace("t", prompt=prompt, output=(30, 2, 3, 9, 10, 11, 12, 50, 51))
    # no proposer that drafts what followed a matched tail can beat the bound of its tail
    for name, opts in (("ngram", {"min_n": 1, "max_draft": 15}),
                       ("suffix", {"max_draft": 15, "use_global": False, "factor": 3.0})):
        fs = foresight(t, cal, native_proposers([name], {name: opts})(t))
        assert copy_bound(t, cal, 1) >= fs - 1e-9, name
    # by hand: 30 is new (plain step); after it, tail "30" never occurred (plain: 2);
    # tail "2" was followed by 3 4 5 ... and by 3 9 10 11 12: the longer copy is the
    # second, 5 tokens (3 9 10 11 12), verified in one 6-token pass
    seconds = cal.seconds(1) * 2
    assert best_cut(cal, 5) == 5  # all 5 pay here
    seconds += cal.seconds(6)
    seconds += cal.seconds(1)  # the pass's own token was 50; 51 follows nothing seen: plain
    assert copy_bound(t, cal, 1) == pytest.approx(9 * cal.seconds(1) / seconds)
    # a longer required tail finds fewer copies; nothing repeats: the plain path
    assert copy_bound(t, cal, 2) <= copy_bound(t, cal, 1)
    t2 = Trace("t2", prompt=(1, 2, 3), output=(11, 12, 13, 14))
    assert copy_bound(t2, cal, 1) == 1.0
    with pytest.raises(ValueError):
        copy_bound(t, cal, 0)


def test_summary_leads_with_the_reports_figures():
    from edgespec.lab.replay.generations import format_summary
    traces = [Trace("a", (1,), (2,), "writing"), Trace("b", (1,), (2,), "writing"),
              Trace("c", (1,), (2,), "summarization"), Trace("h", (1,), (2,), "humanevalfix")]
    table = {"x": {"a": 1.0, "b": 1.2, "c": 2.0, "h": 1.5}}
    row = format_summary(table, traces).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    # geomean of all four; mean of the medians of writing (1.1) and summarization (2.0),
    # humanevalfix apart; worst median; summarization; humanevalfix
    assert cells == ["x", "1.38", "1.55", "1.10 (writing)", "2.00", "1.50"]


# --- loading: checked, and a recorded bench run is a trace file too ----------------------
def test_load_traces_explains_what_is_wrong(tmp_path):
    from edgespec.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="bench --record"):
        load_traces(tmp_path / "missing.jsonl")
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"name": "a", "prompt": [1], "output": [2]}\n{not json\n')
    with pytest.raises(InvalidInputError, match=r"t.jsonl:2 is not JSON"):
        load_traces(bad)
    bad.write_text('{"name": "a", "prompt": [1]}\n')
    with pytest.raises(InvalidInputError, match=r"t.jsonl:1 is not a trace: .*'output'"):
        load_traces(bad)
    bad.write_text('{"name": "a", "prompt": ["x"], "output": [2]}\n')
    with pytest.raises(InvalidInputError, match=r"t.jsonl:1 is not a trace"):
        load_traces(bad)


def _request(config: str, prompt_id: str, output: list[int], warmup: bool = False) -> dict:
    return {"engine": "default", "config": config, "warmup": warmup, "unit": 0,
            "prompt_id": prompt_id, "category": "qa", "prompt": [100, 101], "n_prompt": 2,
            "max_tokens": 8, "n_ctx": 64, "output": output, "first_token": output[:1],
            "stop_reason": "length", "passes": []}


def test_a_recorded_bench_run_loads_as_one_trace_per_prompt(tmp_path):
    """What `edgespec bench --record` wrote: each prompt once, in the run's order, the
    plain path's output preferred, warm-ups left out."""
    import json

    from edgespec.lab.replay.record import Recorder

    head = {**Recorder().header({}), "engines": {"default": {}}}
    reqs = [_request("none", "w", [9, 9], warmup=True),
            _request("ngram", "b", [5, 6, 7]), _request("none", "a", [1, 2]),
            _request("none", "b", [5, 6, 8]), _request("ngram", "a", [1, 3])]
    (tmp_path / "traces.jsonl").write_text("\n".join(json.dumps(x) for x in [head, *reqs]) + "\n")
    for path in (tmp_path, tmp_path / "traces.jsonl"):
        got = load_traces(path)
        assert [(t.name, t.prompt, t.output, t.category) for t in got] == [
            ("b", (100, 101), (5, 6, 8), "qa"), ("a", (100, 101), (1, 2), "qa")]
    # and they replay like any other trace
    r = replay(got[0], FixedController("ngram", 2), CAL, native_proposers(["ngram"])(got[0]))
    assert r.tokens == 3 and r.steps == 3  # nothing repeats: three plain steps


def test_the_replay_cuts_candidates_to_the_loops_draft_limit():
    """The candidate a controller sees never runs past the output's last token but one
    (the pass's own token fills it): the loop's draft_limit, not the proposer's length."""
    seen = []

    class Spy(FixedController):
        def decide(self, view):
            seen.append((view.remaining, len(view.candidates["c"].tokens)))
            return super().decide(view)

    t = Trace("t", (1,), (2, 3, 4))
    r = replay(t, Spy("c", 8), CAL, {"c": lambda hist, k: Draft(tokens=(2, 3, 4, 5, 6)[:k])})
    assert seen == [(3, 2)] and r.tokens == 3 and r.accepted == 2 and r.steps == 1
