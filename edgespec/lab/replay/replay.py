"""Replay a recorded bench run through the same controllers, on a cost model.

Each recorded engine request is replayed in the run's order through a controller built
exactly as the engine built it (:func:`edgespec.control.make_controller` with the recorded
settings, proposers, calibration and traffic slice, and one goodput guard per engine, fed
by every request before it, warm-ups included). The loop mirrors
:class:`edgespec.loop.request.Loop`: at each step the draft limit from max_tokens and the
context's room, the free proposers' candidates, ``decide``, the candidate cut to ``k``, greedy
acceptance against the request's own recorded output, ``observe`` with the tokens the
step appended, emission until the end-of-generation token or max_tokens.

While the replay follows the recording (same decision, same accepted count), the
candidates are the recorded ones and the controller is told the *recorded* seconds, so its
state (cost scales, guard) evolves exactly as it did: the replay must reproduce the
recorded passes one for one, and a request where it does not is reported with the pass
where it left. The prediction charges every pass the cost model's seconds
(:class:`~edgespec.lab.replay.cost.CostModel`), never the recorded ones. After a divergence
the controller is told modelled seconds, and a position the recording never visited gets
the latest recorded candidate still matching the output, shifted to it (what a copy
proposer would continue with), or none. A costly proposer's recorded draft is known up to
its first rejected token; asked for more than was recorded after a full accept, its
further tokens are taken as rejected.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ...api.stats import geometric_mean
from ...calibration.curve import Calibration
from ...control import ControlSettings, GoodputGuard, Outcome, StepView, make_controller, truncate
from ...control.limit import draft_limit
from ...errors import InvalidInputError
from ...proposers.base import EMPTY_DRAFT, Draft
from .accept import matched
from .cost import CostModel, DepthCurve, Overheads, fit_overheads, fit_scale
from .record import SCHEMA

PLAIN_LABEL = "none"
_REJECTED = -1  # a token no vocabulary has: a draft position known to be rejected


@dataclass
class ReplayedRequest:
    config: str
    unit: int | None
    prompt_id: str | None
    category: str | None
    recorded_passes: int
    passes: list[tuple[int, int, int, int]] = field(default_factory=list)  # rows, depth, drafted, accepted
    seconds: float = 0.0  # predicted decode seconds
    decode_tokens: int = 0
    diverged_at: int | None = None  # first pass that left the recording (None: none did)

    @property
    def reproduced(self) -> bool:
        return self.diverged_at is None and len(self.passes) == self.recorded_passes

    @property
    def rate(self) -> float:
        return self.decode_tokens / self.seconds if self.seconds > 0 and self.decode_tokens else 0.0


@dataclass(frozen=True)
class Traces:
    header: Mapping
    requests: Sequence[Mapping]

    def curve(self, engine: str) -> DepthCurve:
        return DepthCurve.from_json(self.header["engines"][engine]["depth_curve"])

    def calibration(self, engine: str) -> Calibration | None:
        cal = self.header["engines"][engine].get("calibration")
        return Calibration.from_json(cal) if cal else None

    @property
    def measured(self) -> list[Mapping]:
        return [r for r in self.requests if not r.get("warmup")]


def load_traces(path: str | Path) -> Traces:
    """A run's ``traces.jsonl`` (or the run folder holding it), checked."""
    path = Path(path)
    if path.is_dir():
        path = path / "traces.jsonl"
    if not path.exists():
        raise InvalidInputError(f"{path} not found: replay needs a run made with "
                                "`edgespec bench --record` (it writes traces.jsonl beside bench.json)")
    header, requests = None, []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                d = json.loads(line)
                if i == 0:
                    header = d
                else:
                    requests.append(d)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{path} is not a readable trace file ({e}); record the run "
                                "again with `edgespec bench --record`") from None
    if not isinstance(header, dict) or header.get("kind") != "edgespec-bench-traces":
        raise InvalidInputError(f"{path} does not start with a bench trace header; was it "
                                "written by `edgespec bench --record`?")
    if header.get("schema") != SCHEMA:
        raise InvalidInputError(f"{path} is trace schema {header.get('schema')!r}; this edgespec "
                                f"reads schema {SCHEMA}: record the run again")
    for r in requests:
        if r.get("engine") not in header.get("engines", {}):
            raise InvalidInputError(f"{path}: a request names engine {r.get('engine')!r}, which "
                                    "the header does not describe (a truncated or mixed file?)")
    return Traces(header, requests)


# --- fitting ------------------------------------------------------------------------
def _fit_passes(r: Mapping) -> Iterable[dict]:
    ctl = r.get("controller")
    costly = set(n for n, c in ((ctl or {}).get("proposers") or {}).items() if c)
    for p in r["passes"]:
        yield {**p, "proposed": bool(p.get("candidates")),
               "costly": p.get("proposer") in costly}


def fit(traces: Traces) -> dict[str, Overheads]:
    """Per configuration, the loop's overheads from its measured (not warm-up) requests."""
    by_cfg: dict[str, list[Mapping]] = {}
    for r in traces.measured:
        by_cfg.setdefault(r["config"], []).append(r)
    return {c: fit_overheads((p for r in rs for p in _fit_passes(r)),
                             [r["tail_seconds"] for r in rs])
            for c, rs in by_cfg.items()}


# --- one request ----------------------------------------------------------------------
class _Candidates:
    """The candidates a replayed step sees (see the module docstring)."""

    def __init__(self, r: Mapping, ref: Sequence[int]) -> None:
        self.ref = ref
        self.at: dict[int, Mapping] = {}
        for p in r["passes"]:
            self.at.setdefault(int(p["generated"]), p.get("candidates") or {})

    def get(self, gen: int, limit: int, names: Sequence[str]) -> dict[str, Draft]:
        out: dict[str, Draft] = {}
        for name in names:
            d = self._find(gen, name)
            if d is not None:
                out[name] = truncate(d, limit)
        return out

    def _find(self, gen: int, name: str) -> Draft | None:
        if gen in self.at:
            c = self.at[gen].get(name)
            return _draft(c, name) if c is not None else None
        for g in sorted((g for g in self.at if g < gen), reverse=True):
            c = self.at[g].get(name)
            if c is None:
                continue
            j = gen - g
            toks = c["tokens"]
            if len(toks) > j and list(toks[:j]) == list(self.ref[g:gen]):
                conf = c.get("confidence")
                return Draft(tokens=tuple(toks[j:]), source=name,
                             confidence=tuple(conf[j:]) if conf else None,
                             match_length=int(c.get("match_length", 0)) + j if c.get("match_length") else 0)
            return EMPTY_DRAFT  # the latest candidate no longer matches: nothing to continue
        return None


def _draft(c: Mapping, name: str) -> Draft:
    conf = c.get("confidence")
    return Draft(tokens=tuple(int(t) for t in c["tokens"]), source=name,
                 confidence=tuple(conf) if conf else None,
                 match_length=int(c.get("match_length", 0)))


def reference(r: Mapping) -> tuple[list[int], int | None]:
    """What the target chose at each position, and the position of the end-of-generation
    token (None: the request ended otherwise).

    The recorded output, continued by what the passes appended past it where the
    controller's record has them: a last pass's verification goes on past an accepted
    end token or max_tokens (the target's choices there decide its accepted count), and
    only emission stops. Without them (the plain path records emitted tokens only) an end
    token is a placeholder no draft matches."""
    out = list(r["output"])
    stream = list(r.get("first_token") or [])
    for p in r["passes"]:
        stream.extend(p.get("tokens") or ())
    eog_at = len(out) if r["stop_reason"] == "eos" else None
    if len(stream) > len(out) and stream[:len(out)] == out:
        return stream, eog_at
    return (out + [_REJECTED] if eog_at is not None else out), eog_at


def build_controller(r: Mapping, guard: GoodputGuard | None):
    """The request's controller, as the engine built it; None for the plain path."""
    ctl = r.get("controller")
    if not ctl:
        return None
    cal = Calibration.from_json(ctl["calibration"]) if ctl.get("calibration") else None
    settings = recorded_settings(ctl["settings"])
    return make_controller(settings, dict(ctl["proposers"]), cal, guard, ctl.get("slice", "default"),
                           ctl.get("token_seconds"),
                           # a greedy or seeded request decided on its curve, not the clock
                           deterministic=bool(ctl.get("deterministic", False)))


def replay_request(r: Mapping, controller, model: CostModel, over: Overheads) -> ReplayedRequest:
    """Replay one recorded request (see the module docstring); ``controller`` None is the
    plain path."""
    ref, eog_at = reference(r)
    rec_passes = r["passes"]
    res = ReplayedRequest(config=r["config"], unit=r.get("unit"), prompt_id=r.get("prompt_id"),
                          category=r.get("category"), recorded_passes=len(rec_passes))
    gen = len(r.get("first_token") or [])
    if gen == 0 or (eog_at is not None and eog_at == 0):
        return res
    costly, free, max_draft = _proposers(r.get("controller") or {})
    cands = _Candidates(r, ref)
    n_prompt, n_ctx, max_tokens = int(r["n_prompt"]), int(r["n_ctx"]), int(r["max_tokens"])
    i, faithful = 0, True
    while True:
        remaining = max_tokens - gen
        depth = n_prompt + gen - 1
        room = n_ctx - depth - 1
        if room < 0 or gen >= len(ref) or remaining <= 0:
            break
        limit = draft_limit(max_draft, remaining, room)
        rec = rec_passes[i] if faithful and i < len(rec_passes) else None
        draft, used, consulted = EMPTY_DRAFT, None, False
        if controller is not None:
            draft, used, consulted = _decide(controller, cands, ref, rec, gen, limit, free,
                                             min(remaining, room + 1))
        k = len(draft.tokens)
        a = _accepted(draft.tokens, ref, gen)
        new = (*draft.tokens[:a], ref[gen + a])
        same = (rec is not None and int(rec["drafted"]) == k and int(rec["accepted"]) == a
                and (rec.get("proposer") if k else None) == (used if k else None))
        if faithful and not same:
            faithful = False
            res.diverged_at = i
        rows = max(k + 1, int(rec.get("batch_rows") or 0)) if same else k + 1
        pass_s = model.pass_seconds(rows, depth)
        draft_s = (over.propose if consulted else 0.0) + (over.costly_token * k if used in costly else 0.0)
        res.seconds += pass_s + draft_s + over.loop(k)
        res.passes.append((rows, depth, k, a))
        if controller is not None:
            controller.observe(Outcome(
                proposer=used if k else None, drafted=k, accepted=a,
                draft_seconds=float(rec["draft_seconds"]) if same else draft_s,
                verify_seconds=float(rec["verify_seconds"]) if same else pass_s,
                tokens=tuple(new), confidence=draft.confidence if k else None,
                match_length=draft.match_length if k else 0,
                batch_rows=int(rec.get("batch_rows") or 0) if same else 0))
        gen, stop = _advance(gen, len(new), eog_at, max_tokens)
        i += 1
        if stop:
            break
    res.seconds += over.tail
    res.decode_tokens = max(gen - 1, 0)
    return res


def recorded_settings(s: Mapping, **changes: object) -> ControlSettings:
    """ControlSettings as a trace recorded them, with ``changes`` applied. A trace recorded
    before 2026-12-05 also keeps ``draft_length``, fixed control's length (``max_draft``
    now, which took its place)."""
    fields = dict(s)
    length = fields.pop("draft_length", None)
    if length is not None and not fields.get("adaptive", True):
        fields["max_draft"] = length
    return ControlSettings(**{**fields, **changes})


def _proposers(ctl_info: Mapping) -> tuple[set[str], list[str], int]:
    """The recorded controller's costly proposers, its free ones and its longest draft."""
    costly = {n for n, c in (ctl_info.get("proposers") or {}).items() if c}
    free = [n for n in (ctl_info.get("proposers") or {}) if n not in costly]
    max_draft = int(recorded_settings(ctl_info["settings"]).max_draft) if ctl_info else 0
    return costly, free, max_draft


def _decide(controller, cands: _Candidates, ref: Sequence[int], rec: Mapping | None, gen: int,
            limit: int, free: list[str], remaining: int) -> tuple[Draft, str | None, bool]:
    """The controller's step at ``gen``: (the draft, the proposer it came from, whether the
    free proposers were consulted)."""
    draft, used = EMPTY_DRAFT, None
    view_c = cands.get(gen, limit, free) if limit > 0 else {}
    consulted = bool(free) and limit > 0
    d = controller.decide(StepView(generated=gen, remaining=remaining, candidates=view_c))
    controller.drain_events()
    k = max(0, min(d.k, limit))
    if not d.plain and k > 0:
        used = d.proposer
        if used in view_c:
            draft = truncate(view_c[used], k)
        else:
            draft = _costly_draft(rec, ref, gen, k, used)
    return draft, used, consulted


def _accepted(tokens: Sequence[int], ref: Sequence[int], gen: int) -> int:
    """How many of the drafted ``tokens`` the target's choices at ``gen`` accept."""
    a = matched(tokens, ref, gen)
    if gen + a >= len(ref):  # nothing left to verify against (cannot happen with a
        a = len(ref) - gen - 1  # recorded end token; kept for malformed input)
    return a


def _advance(gen: int, n_new: int, eog_at: int | None, max_tokens: int) -> tuple[int, bool]:
    """``gen`` after emitting a pass's ``n_new`` tokens, and whether the request stops
    (its end token reached, or max_tokens)."""
    for _ in range(n_new):
        if eog_at is not None and gen == eog_at:
            return gen, True
        gen += 1
        if gen >= max_tokens:
            return gen, True
    return gen, False


def _costly_draft(rec: Mapping | None, ref: Sequence[int], gen: int, k: int, name: str) -> Draft:
    """A costly proposer's k tokens: what it drafted here when recorded (its accepted
    prefix, then a rejected token), else the output's next tokens up to the recorded
    acceptance pattern's unknown: taken as rejected."""
    if rec is not None and rec.get("proposer") == name and int(rec.get("drafted", 0)) > 0:
        acc = int(rec["accepted"])
        toks = list(ref[gen:gen + min(acc, k)])
        toks += [_REJECTED] * (k - len(toks))
        return Draft(tokens=tuple(toks), source=name)
    return Draft(tokens=(_REJECTED,) * k, source=name)


# --- the run ----------------------------------------------------------------------
def replay_run(traces: Traces, model_for: Mapping[str, CostModel],
               overheads: Mapping[str, Overheads]) -> list[ReplayedRequest]:
    """Every request in the run's order (warm-ups replayed for the guard, not returned);
    ``model_for`` maps an engine key ("default", "exact") to its cost model."""
    guards: dict[str, GoodputGuard] = {}
    for key, e in traces.header["engines"].items():
        guards[key] = GoodputGuard(recorded_settings(e["control"]),
                                   plain_seconds_prior=e.get("guard_prior"))
    out = []
    for r in traces.requests:
        ctl = build_controller(r, guards[r["engine"]])
        res = replay_request(r, ctl, model_for[r["engine"]], overheads.get(r["config"], Overheads()))
        if not r.get("warmup"):
            out.append(res)
    return out


VARIANTS = ("flat curve", "+ depth", "+ overheads", "+ pass scale")
MAIN = "+ overheads"


def models(traces: Traces, overheads: Mapping[str, Overheads]) -> dict[str, tuple[dict[str, CostModel], Mapping[str, Overheads]]]:
    """The cost models compared, each adding one thing the real loop pays: the controller's
    own flat calibration; the depth curve; the fitted overheads (the model); the run-wide
    measured/curve pass-time ratio."""
    out: dict[str, tuple[dict[str, CostModel], Mapping[str, Overheads]]] = {}
    engines = list(traces.header["engines"])
    flat = {}
    for e in engines:
        cal = traces.calibration(e)
        flat[e] = CostModel(DepthCurve.flat(cal) if cal is not None else traces.curve(e), depth=False)
    out["flat curve"] = (flat, {})
    out["+ depth"] = ({e: CostModel(traces.curve(e)) for e in engines}, {})
    out["+ overheads"] = ({e: CostModel(traces.curve(e)) for e in engines}, overheads)
    scaled = {}
    for e in engines:
        curve = traces.curve(e)
        passes = [p for r in traces.measured if r["engine"] == e for p in r["passes"]]
        scaled[e] = CostModel(curve, scale=fit_scale(passes, curve))
    out["+ pass scale"] = (scaled, overheads)
    return out


@dataclass
class Comparison:
    """Per configuration and unit: measured and predicted speedup over the plain path."""

    rows: dict[str, dict[int, dict]]  # config -> unit -> {prompt, measured, predicted, ...}
    variants: dict[str, dict[str, tuple[float, float]]]  # variant -> config -> (measured, predicted) geomeans
    reproduced: int
    replayed: int
    diverged: list[tuple[str, str | None, int]]  # (config, prompt, pass)


def compare(traces: Traces) -> tuple[Comparison, dict[str, Overheads]]:
    """Replay the run under every cost model of :func:`models`; the per-prompt rows are the
    main model's (:data:`MAIN`)."""
    over = fit(traces)
    measured: dict[tuple[str, int], float] = {}
    for r in traces.measured:
        if r.get("unit") is not None and r["decode_seconds"] > 0 and r["decode_tokens"] > 0:
            measured[(r["config"], r["unit"])] = r["decode_tokens"] / r["decode_seconds"]
    rows: dict[str, dict[int, dict]] = {}
    variants: dict[str, dict[str, tuple[float, float]]] = {}
    reproduced = replayed = 0
    diverged: list[tuple[str, str | None, int]] = []
    for name, (model_for, ov) in models(traces, over).items():
        results = replay_run(traces, model_for, ov)
        pred = {(x.config, x.unit): x for x in results if x.unit is not None}
        per_cfg: dict[str, list[tuple[float, float]]] = {}
        for (cfg, unit), x in pred.items():
            base = pred.get((PLAIN_LABEL, unit))
            m, mb = measured.get((cfg, unit)), measured.get((PLAIN_LABEL, unit))
            if cfg == PLAIN_LABEL or base is None or not base.rate or not x.rate or not m or not mb:
                continue
            ps, ms = x.rate / base.rate, m / mb
            per_cfg.setdefault(cfg, []).append((ms, ps))
            if name == MAIN:
                rows.setdefault(cfg, {})[unit] = {
                    "prompt": x.prompt_id, "category": x.category, "measured": ms, "predicted": ps,
                    "error": ps / ms - 1.0, "passes": x.recorded_passes,
                    "replayed_passes": len(x.passes), "reproduced": x.reproduced}
        variants[name] = {c: (geometric_mean(m for m, _ in v), geometric_mean(p for _, p in v))
                          for c, v in per_cfg.items()}
        if name == MAIN:
            replayed = len(results)
            reproduced = sum(x.reproduced for x in results)
            diverged = [(x.config, x.prompt_id, x.diverged_at if x.diverged_at is not None
                         else len(x.passes)) for x in results if not x.reproduced]
    return Comparison(rows, variants, reproduced, replayed, diverged), over
