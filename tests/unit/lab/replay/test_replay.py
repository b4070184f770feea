"""The replay's cost model and loop on synthetic records (pure: no model, no clock)."""
from __future__ import annotations

import json
import math

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.control import ControlSettings, FixedController, Outcome, StepView
from edgespec.errors import InvalidInputError
from edgespec.api.events import Finished, Step
from edgespec.proposers.base import Draft
from edgespec.lab.replay import (CostModel, DepthCurve, Overheads, fit_overheads, fit_scale,
                             load_traces, replay_request)
from edgespec.lab.replay.record import RecordingController, Recorder, RequestRecording
from edgespec.lab.replay.replay import build_controller, reference
from edgespec.api.stats import RequestStats


def _cal(step: float, costs: dict[int, float]) -> Calibration:
    return Calibration.from_costs(costs, step)


# --- the depth curve ---------------------------------------------------------------
def test_depth_curve_interpolates_in_depth_and_extrapolates_linearly():
    curve = DepthCurve(((300, _cal(0.02, {1: 1.0, 4: 2.0})), (100, _cal(0.01, {1: 1.0, 4: 3.0}))))
    assert curve.depths == (100, 300)  # sorted
    assert curve.seconds(1, 50) == pytest.approx(0.01)  # shallower than measured: the shallowest
    assert curve.seconds(1, 200) == pytest.approx(0.015)
    assert curve.seconds(4, 100) == pytest.approx(0.03)
    assert curve.seconds(4, 200) == pytest.approx((0.03 + 0.04) / 2)
    # attention grows linearly with depth: past the deepest, the last slope continues
    assert curve.seconds(1, 500) == pytest.approx(0.03)
    # within a depth, linear in rows between measured sizes
    assert curve.seconds(2, 100) == pytest.approx(0.01 * (1 + 2 / 3))
    at = curve.at(200)
    assert at.step_seconds == pytest.approx(0.015) and at.seconds(4) == pytest.approx(0.035)


def test_depth_curve_never_falls_past_the_deepest_and_round_trips():
    # a deeper pass measured cheaper (noise) must not make deeper ones cheaper still
    curve = DepthCurve(((100, _cal(0.02, {1: 1.0})), (200, _cal(0.01, {1: 1.0}))), busy=0.1)
    assert curve.seconds(1, 1000) == pytest.approx(0.01)
    again = DepthCurve.from_json(json.loads(json.dumps(curve.to_json())))
    assert again.depths == curve.depths and again.busy == 0.1
    assert again.seconds(1, 150) == pytest.approx(curve.seconds(1, 150))
    with pytest.raises(ValueError, match="depth curve"):
        DepthCurve.from_json({"depths": [{"depth": 1}]})
    with pytest.raises(ValueError, match="once"):
        DepthCurve(((5, _cal(0.01, {1: 1})), (5, _cal(0.02, {1: 1}))))


def test_cost_model_scales_pass_kinds_apart_and_can_ignore_depth():
    curve = DepthCurve(((64, _cal(0.01, {1: 1.0, 3: 2.0})), (1064, _cal(0.02, {1: 1.0, 3: 2.0}))))
    m = CostModel(curve, scale={"plain": 0.5, "verify": 2.0})
    assert m.pass_seconds(1, 564) == pytest.approx(0.015 * 0.5)
    assert m.pass_seconds(3, 564) == pytest.approx(0.03 * 2.0)
    assert CostModel(curve, depth=False).pass_seconds(3, 1064) == pytest.approx(0.02)


# --- fitting the loop's overheads ----------------------------------------------------
def _pass(k: int, loop: float, verify: float = 0.01, draft: float = 0.0, **kw) -> dict:
    return {"drafted": k, "verify_seconds": verify, "draft_seconds": draft,
            "gap_seconds": verify + draft + loop, **kw}


def test_fit_overheads_recovers_the_loop_costs_despite_hiccups():
    passes = [_pass(0, 0.001) for _ in range(9)] + [_pass(0, 0.5)]  # one descheduled pass
    for k in (1, 2, 4):
        passes += [_pass(k, 0.002 + 0.0005 * k, draft=0.0001, proposed=True) for _ in range(5)]
    passes += [_pass(2, 0.4, proposed=True)]
    o = fit_overheads(passes, tails=[0.003, 0.003, 0.9])
    assert o.plain == pytest.approx(0.001)
    assert o.verify == pytest.approx(0.002, abs=1e-9)
    assert o.per_row == pytest.approx(0.0005, abs=1e-9)
    assert o.propose == pytest.approx(0.0001)
    assert o.tail == pytest.approx(0.003) and o.passes == len(passes)
    assert o.loop(0) == pytest.approx(0.001) and o.loop(4) == pytest.approx(0.004)


def test_fit_overheads_prices_a_costly_proposer_per_drafted_token():
    passes = [_pass(0, 0.001, draft=0.0001, proposed=True) for _ in range(3)]
    passes += [_pass(4, 0.002, draft=0.0001 + 4 * 0.003, costly=True) for _ in range(3)]
    o = fit_overheads(passes)
    assert o.costly_token == pytest.approx(0.003)
    assert o.per_row == 0.0 and o.verify == pytest.approx(0.002)  # one length: no slope


def test_fit_scale_is_the_median_measured_over_curve_ratio_per_pass_kind():
    curve = DepthCurve(((64, _cal(0.01, {1: 1.0, 3: 2.0})),))
    passes = ([{"rows": 1, "depth": 80, "verify_seconds": 0.009}] * 5
              + [{"rows": 3, "depth": 80, "verify_seconds": 0.024}] * 5
              + [{"rows": 3, "depth": 80, "verify_seconds": 1.0}])
    assert fit_scale(passes, curve) == {"plain": pytest.approx(0.9), "verify": pytest.approx(1.2)}


# --- replaying a request ---------------------------------------------------------------
def _fixed_record(accepted_first: int = 2) -> dict:
    """FixedController("ngram", 2) over output 1..7 (max_tokens 7), as the engine records it:
    pass 1 cuts [2, 3, 4, 5] to [2, 3] (both right), pass 2 drafts [5, 9] (one right), pass 3 is plain
    (one token left: no room to draft)."""
    settings = ControlSettings(adaptive=False, proposer="ngram", max_draft=2)
    from dataclasses import asdict
    return {
        "engine": "default", "config": "ngram[max_draft=2]", "warmup": False, "unit": 0,
        "prompt_id": "p", "category": "c", "prompt": [100, 101, 102], "n_prompt": 3,
        "max_tokens": 7, "n_ctx": 512, "output": [1, 2, 3, 4, 5, 6, 7], "first_token": [1],
        "stop_reason": "length", "decode_tokens": 6, "decode_seconds": 0.1, "tail_seconds": 0.0,
        "controller": {"settings": asdict(settings), "proposers": {"ngram": False},
                       "calibration": None, "slice": "default", "token_seconds": None},
        "passes": [
            {"generated": 1, "candidates": {"ngram": {"tokens": [2, 3, 4, 5]}}, "proposer": "ngram",
             "drafted": 2, "accepted": accepted_first, "tokens": [2, 3, 4], "batch_rows": 0,
             "depth": 3, "rows": 3, "verify_seconds": 0.02, "draft_seconds": 0.0001,
             "gap_seconds": 0.03},
            {"generated": 4, "candidates": {"ngram": {"tokens": [5, 9]}}, "proposer": "ngram",
             "drafted": 2, "accepted": 1, "tokens": [5, 6], "batch_rows": 0, "depth": 6,
             "rows": 3, "verify_seconds": 0.02, "draft_seconds": 0.0001, "gap_seconds": 0.03},
            {"generated": 6, "candidates": {}, "proposer": None, "drafted": 0, "accepted": 0,
             "tokens": [7], "batch_rows": 0, "depth": 8, "rows": 1, "verify_seconds": 0.01,
             "draft_seconds": 0.0, "gap_seconds": 0.012},
        ],
    }


MODEL = CostModel(DepthCurve.flat(_cal(0.01, {1: 1.0, 2: 1.5, 3: 1.8})))
OVER = Overheads(plain=0.001, verify=0.002, per_row=0.0005, propose=0.0001, tail=0.003)


def test_replay_reproduces_the_recorded_passes_and_charges_the_model():
    r = _fixed_record()
    res = replay_request(r, build_controller(r, None), MODEL, OVER)
    assert res.reproduced and res.diverged_at is None
    assert [(rows, k, a) for rows, _, k, a in res.passes] == [(3, 2, 2), (3, 2, 1), (1, 0, 0)]
    assert [d for _, d, _, _ in res.passes] == [3, 6, 8]
    verify = 0.018 + 0.0001 + 0.002 + 2 * 0.0005
    assert res.seconds == pytest.approx(2 * verify + 0.01 + 0.001 + 0.003)
    assert res.decode_tokens == 6 and res.rate == pytest.approx(6 / res.seconds)


def test_a_record_from_before_the_max_draft_rename_replays_as_it_ran():
    """Runs recorded before 2026-12-05 keep fixed control's length as ``draft_length``
    (replaying one raised TypeError); it is max_draft now."""
    r = _fixed_record()
    old = dict(r["controller"]["settings"])
    old["draft_length"], old["max_draft"] = old.pop("max_draft"), 15
    r = {**r, "controller": {**r["controller"], "settings": old}}
    res = replay_request(r, build_controller(r, None), MODEL, OVER)
    assert res.reproduced and [k for _, _, k, _ in res.passes] == [2, 2, 0]


def test_replay_reports_where_it_left_the_recording():
    r = _fixed_record(accepted_first=1)  # the recording says 1; the output accepts 2
    res = replay_request(r, build_controller(r, None), MODEL, OVER)
    assert not res.reproduced and res.diverged_at == 0


def test_plain_replay_is_one_pass_per_token_and_stops_at_the_end_token():
    r = {"config": "none", "unit": 0, "prompt_id": "p", "category": "c", "n_prompt": 10,
         "max_tokens": 8, "n_ctx": 512, "output": [1, 2, 3], "first_token": [1],
         "stop_reason": "eos", "tail_seconds": 0.0, "controller": None,
         "passes": [{"generated": g, "proposer": None, "drafted": 0, "accepted": 0,
                     "tokens": t, "verify_seconds": 0.01, "draft_seconds": 0.0}
                    for g, t in ((1, [2]), (2, [3]), (3, []))]}
    ref, at = reference(r)
    assert ref == [1, 2, 3, -1] and at == 3  # the plain path records no end token id
    res = replay_request(r, None, MODEL, Overheads(plain=0.001))
    assert res.reproduced and len(res.passes) == 3  # the pass that produced the end token too
    assert [d for _, d, _, _ in res.passes] == [10, 11, 12]
    assert res.seconds == pytest.approx(3 * 0.011) and res.decode_tokens == 2


def test_a_position_never_recorded_gets_the_latest_matching_candidate_shifted():
    # a controller that drafts 1 where the recording drafted 2 reaches a position the
    # recording never visited; the copy proposer's earlier draft still matches there
    r = _fixed_record()
    r["controller"]["settings"]["max_draft"] = 1
    res = replay_request(r, build_controller(r, None), MODEL, OVER)
    assert res.diverged_at == 0
    # gen 1: [2] right -> gen 3: [2, 3, 4, 5] shifted to [4] right -> gen 5: the draft
    # recorded at 4, [5, 9], shifted to [9], wrong -> gen 6: the last token, plain
    assert [(k, a) for _, _, k, a in res.passes] == [(1, 1), (1, 1), (1, 0), (0, 0)]


# --- recording -----------------------------------------------------------------------
def test_recording_keeps_decisions_and_gaps_that_sum_to_decode_seconds():
    inner = FixedController("ngram", 2)
    rc = RecordingController(inner)
    assert rc.k == 2  # everything else is the wrapped controller's
    rr = RequestRecording({"n_prompt": 5})
    rr.controller = rc
    d = rc.decide(StepView(generated=1, remaining=9, candidates={"ngram": Draft(tokens=(7, 8))}))
    rc.observe(Outcome("ngram", 2, 1, 0.001, 0.02, tokens=(7, 4)))
    assert d.k == 2 and rc.passes[0]["candidates"] == {"ngram": {"tokens": [7, 8]}}
    st = RequestStats()
    st.observe_prefill(5, 0.1)
    st.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0,
                    verify_seconds=0, elapsed=0.1)
    st.observe_step(proposer="ngram", drafted=2, accepted=1, emitted=2, draft_seconds=0.001,
                    verify_seconds=0.02, elapsed=0.13)
    st.generated_tokens = 3
    st.finish("length", 0.135)
    for ev in (Step(1, (3,), "", ("target",), None, 0, 0, 0.0, 0.0, 0.1),
               Step(1, (7, 4), "", ("draft", "target"), "ngram", 2, 1, 0.001, 0.02, 0.13),
               Step(1, (), "x", (), None, 0, 0, 0.0, 0.0, 0.135),  # the text flush: no pass
               Finished(1, "", (3, 7, 4), "length", st)):
        rr.on_event(ev)
    rec = rr.rec
    assert len(rec["passes"]) == 1
    p = rec["passes"][0]
    assert p["depth"] == 5 and p["rows"] == 3 and p["gap_seconds"] == pytest.approx(0.03)
    assert sum(x["gap_seconds"] for x in rec["passes"]) + rec["tail_seconds"] == pytest.approx(
        rec["decode_seconds"])
    assert rec["first_token"] == [3] and rec["output"] == [3, 7, 4]


def test_load_traces_explains_what_is_wrong(tmp_path):
    with pytest.raises(InvalidInputError, match="--record"):
        load_traces(tmp_path)
    (tmp_path / "traces.jsonl").write_text("{not json\n")
    with pytest.raises(InvalidInputError, match="not a readable trace file"):
        load_traces(tmp_path)
    (tmp_path / "traces.jsonl").write_text(json.dumps({"kind": "other"}) + "\n")
    with pytest.raises(InvalidInputError, match="header"):
        load_traces(tmp_path)
    head = Recorder().header({})
    (tmp_path / "traces.jsonl").write_text(json.dumps({**head, "schema": 99}) + "\n")
    with pytest.raises(InvalidInputError, match="schema 99"):
        load_traces(tmp_path)
    (tmp_path / "traces.jsonl").write_text(json.dumps(head) + "\n"
                                           + json.dumps({"engine": "exact"}) + "\n")
    with pytest.raises(InvalidInputError, match="engine 'exact'"):
        load_traces(tmp_path / "traces.jsonl")
    assert math.isfinite(MODEL.pass_seconds(1, 0))
