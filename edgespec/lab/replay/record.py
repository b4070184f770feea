"""Recording what a replay needs while the bench runs (``edgespec bench --record``).

Per engine request, in the order the run made them (warm-ups included: they feed the
engine's goodput guard, which later requests' controllers consult):

* the prompt and output token ids, the stop reason, max_tokens and the context size;
* how the request's controller was built (settings, proposers and whether each is
  costly, the calibration it priced with, traffic slice, a draft model's seconds/token);
* per pass: the depth (cached cells before it), the step it was (``generated``), every
  free proposer's candidate (tokens, confidence, match length), the controller's
  decision, the draft verified, accepted count, the tokens the pass appended, and the
  measured seconds: the pass (``verify_seconds``), the drafting (``draft_seconds``) and
  the whole gap since the previous step (``gap_seconds``, what decode time sums).

The controller is wrapped (:class:`RecordingController`, through the engine's
``controller_hook``): it sees each :class:`~edgespec.control.StepView` and
:class:`~edgespec.control.Outcome` the engine hands the real one and copies a few token
tuples, microseconds against a pass. Timings come from the ``Step`` events the bench
already reads.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ...control import Decision, Outcome, StepView
from ...api.events import Finished, Step
from ... import control
import hashlib
from pathlib import Path

SCHEMA = 1


def draft_json(d) -> dict:
    out: dict[str, Any] = {"tokens": [int(t) for t in d.tokens]}
    if d.confidence is not None:
        out["confidence"] = [float(c) for c in d.confidence]
    if d.match_length:
        out["match_length"] = int(d.match_length)
    return out


class RecordingController:
    """Delegates to the request's controller and keeps every decision and outcome."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.passes: list[dict] = []
        self._open: dict | None = None

    def __getattr__(self, name: str):  # cal, settings, ... (treepass reads ``cal``)
        return getattr(self.inner, name)

    def decide(self, view: StepView) -> Decision:
        d = self.inner.decide(view)
        self._open = {"generated": view.generated, "remaining": view.remaining,
                      "candidates": {n: draft_json(c) for n, c in view.candidates.items()},
                      "decision": {"proposer": d.proposer, "k": d.k, "reason": d.reason,
                                   "expected_tokens": d.expected_tokens}}
        return d

    def observe(self, outcome: Outcome) -> None:
        rec = self._open if self._open is not None else {}
        self._open = None
        rec.update(proposer=outcome.proposer, drafted=outcome.drafted, accepted=outcome.accepted,
                   tokens=[int(t) for t in outcome.tokens], batch_rows=outcome.batch_rows,
                   outcome_draft_seconds=outcome.draft_seconds,
                   outcome_verify_seconds=outcome.verify_seconds)
        self.passes.append(rec)
        self.inner.observe(outcome)

    def drain_events(self):
        return self.inner.drain_events()


class RequestRecording:
    """One engine request: the bench feeds it the request's events."""

    def __init__(self, rec: dict) -> None:
        self.rec = rec
        self.steps: list[Step] = []
        self.controller: RecordingController | None = None

    def on_event(self, ev) -> None:
        if isinstance(ev, Step):
            self.steps.append(ev)
        elif isinstance(ev, Finished):
            self._finish(ev)

    def _finish(self, fin: Finished) -> None:
        steps = self.steps
        # the first step is the prefill's token; a trailing text flush is no pass
        first, passes = steps[0], list(steps[1:])
        if passes and passes[-1].verify_seconds == 0.0 and not passes[-1].tokens:
            passes.pop()
        ctl = self.controller.passes if self.controller is not None else None
        if ctl is not None and len(ctl) != len(passes):
            raise RuntimeError(f"recorded {len(ctl)} controller passes for {len(passes)} steps")
        n_prompt = self.rec["n_prompt"]
        out, prev, generated = [], first.elapsed, len(first.tokens)
        for i, st in enumerate(passes):
            p = dict(ctl[i]) if ctl is not None else {
                "generated": generated, "proposer": None, "drafted": 0, "accepted": 0,
                "tokens": list(st.tokens), "batch_rows": 0}
            p.update(depth=n_prompt + generated - 1, rows=max(st.drafted + 1, p.get("batch_rows") or 0),
                     emitted=len(st.tokens), verify_seconds=st.verify_seconds,
                     draft_seconds=st.draft_seconds, gap_seconds=st.elapsed - prev)
            prev = st.elapsed
            generated += len(st.tokens)
            out.append(p)
        self.rec.update(
            output=[int(t) for t in fin.tokens], stop_reason=fin.stop_reason,
            first_token=[int(t) for t in first.tokens],
            decode_tokens=fin.stats.decode_tokens, decode_seconds=fin.stats.decode_seconds,
            tail_seconds=fin.stats.total_seconds - prev, passes=out)


class Recorder:
    """Everything ``--record`` keeps for a run: per engine its curves and controller
    defaults, per request a :class:`RequestRecording`."""

    def __init__(self) -> None:
        self.engines: dict[str, dict] = {}
        self.requests: list[dict] = []
        self._current: RequestRecording | None = None

    def attach(self, key: str, engine, depth_curve) -> None:
        """Hook ``engine`` (``key``: "default" or "exact") and keep what its controllers
        priced with: the calibration, the guard's settings and prior, the depth curve."""
        cal = engine.calibration() if engine.control.adaptive else None
        self.engines[key] = {
            "calibration": cal.to_json() if cal is not None else None,
            "control": asdict(engine.control),
            "guard_prior": engine.guard.plain_seconds_prior,
            "kernel": asdict(engine.config.kernel) if engine.config.kernel is not None else None,
            "depth_curve": depth_curve.to_json(),
        }
        engine.controller_hook = self._hook

    def _hook(self, req, controller, built):
        cur = self._current
        if cur is None:
            return controller
        cur.rec["controller"] = {
            "settings": asdict(built["settings"]), "proposers": dict(built["proposers"]),
            "calibration": built["calibration"].to_json() if built["calibration"] is not None else None,
            "slice": built["slice"], "token_seconds": built["token_seconds"],
            "deterministic": bool(built.get("deterministic", False))}
        cur.controller = RecordingController(controller)
        return cur.controller

    def begin(self, *, engine: str, config: str, prompt_tokens, max_tokens: int, n_ctx: int,
              warmup: bool = False) -> RequestRecording:
        rr = RequestRecording({"engine": engine, "config": config, "warmup": warmup,
                               "prompt": [int(t) for t in prompt_tokens],
                               "n_prompt": len(prompt_tokens), "max_tokens": max_tokens,
                               "n_ctx": n_ctx, "controller": None})
        self._current = rr
        return rr

    def end(self, rr: RequestRecording) -> None:
        """Keep a finished request (the bench labels it with its unit and prompt later)."""
        self._current = None
        if "passes" in rr.rec:  # one that failed before finishing has nothing to replay
            self.requests.append(rr.rec)

    def header(self, matrix: dict) -> dict:
        return {"schema": SCHEMA, "kind": "edgespec-bench-traces", "engines": self.engines,
                "matrix": matrix, "controller_code": controller_code()}


def controller_code() -> str:
    """A digest of the controller's source: a replay through other controller code than
    the run's cannot reproduce its decisions, and says so."""

    h = hashlib.sha256()
    for f in sorted(Path(control.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
