"""Run the matrix: load the target once, interleave configurations prompt by prompt.

Protocol (why each rule exists):

* One engine serves every engine configuration through the per-request
  ``proposer=`` override, so all of them share the same weights, context and
  page cache; the plain path is simply ``proposer="none"``.
* A *unit* is one turn of one prompt. Each unit runs every configuration back to
  back, the order rotating from unit to unit (A B C, B C A, ...), so slow drift of a
  shared machine and any first-or-last position effect fall on every configuration alike.
* Multi-turn prompts carry each configuration's *own* earlier answers, as a user's
  conversation would; with exact decoding those answers are identical anyway.
* A warm-up request per configuration runs first and is thrown away (page faults,
  allocator growth, the first graph build).
* Ctrl-C stops at once; what was measured is kept and marked ``interrupted``.
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from ..errors import EdgespecError, InvalidInputError
from ..events import Finished, Step
from ..params import GenerationParams, SamplingParams
from ..stats import RequestStats
from .anchor import trace_to_stats
from .matrix import ANCHOR_KIND, BASELINE, ConfigSpec, Matrix
from .prompts import (BenchPrompt, bucket_label, load_humanevalfix, load_jsonl_prompts,
                      load_spec_bench)

# Knobs that configure the engine as a whole (Engine.load arguments), not one proposer.
# Knobs of the speculation controller: per request (Engine.stream(control=...)), so fixed
# draft lengths and adaptive control compare on one loaded model.
CONTROL_KNOBS = ("draft_len", "adaptive", "exact")

# Not one of the measured prompts: a proposer that learns across requests (the suffix tree)
# must not see the start of a measured answer before it is measured.
WARMUP_MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]

Progress = Callable[[int, int, dict | None], None]  # (done, total, record or None for warm-up)


def collect_prompts(m: Matrix) -> list[BenchPrompt]:
    prompts: list[BenchPrompt] = []
    if m.spec_bench:
        prompts += load_spec_bench(categories=m.spec_bench, per_category=m.per_category,
                                   max_turns=m.max_turns)
    if m.humanevalfix:
        prompts += load_humanevalfix(n=m.humanevalfix)
    for path in m.jsonl:
        prompts += load_jsonl_prompts(path, field=m.prompt_field, n=m.jsonl_n)
    if m.max_turns:
        prompts = [BenchPrompt(p.id, p.category, p.turns[: m.max_turns], p.source) for p in prompts]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise InvalidInputError("two prompts share an id; give JSONL records distinct 'id' fields")
    return prompts


# --- how engine configurations map onto one loaded engine ----------------------
@dataclass(frozen=True)
class EnginePlan:
    """Engine.load arguments and the proposer name each configuration requests with."""

    proposer_options: dict[str, dict]  # for the engine's own instance of each proposer
    extra: dict[str, tuple[str, dict]]  # label -> (proposer, options) loaded under the label
    request_name: dict[str, str]  # label -> the name passed as stream(proposer=...)
    control: dict[str, dict] = field(default_factory=dict)  # label -> CONTROL_KNOBS it sets


def plan_engine(configs: Sequence[ConfigSpec]) -> EnginePlan:
    """The first configuration of each proposer uses the engine's instance (with its knobs);
    every later one gets its own instance under its label, so a proposer that learns across
    requests (the suffix tree) never sees another configuration's answer to the same prompt."""
    options: dict[str, dict] = {}
    extra: dict[str, tuple[str, dict]] = {}
    names: dict[str, str] = {}
    control: dict[str, dict] = {}
    for c in configs:
        if c.kind != "engine":
            continue
        own = {k: v for k, v in c.knob_dict.items() if k not in CONTROL_KNOBS}
        ctl = {k: v for k, v in c.knob_dict.items() if k in CONTROL_KNOBS}
        if ctl:
            control[c.label] = ctl
        if c.proposer == BASELINE:
            if c.knob_dict:
                raise InvalidInputError("the plain path ('none') takes no knobs")
            names[c.label] = BASELINE
        elif c.proposer not in options:
            options[c.proposer] = own
            names[c.label] = c.proposer
        else:
            if c.proposer == "draft":
                if options["draft"] != own:
                    raise InvalidInputError("one engine holds one draft model: give every 'draft' "
                                            "configuration the same model knobs")
                names[c.label] = "draft"
                continue
            # an instance name of its own (a knob-less label would collide with the engine's)
            name = c.label if c.label != c.proposer else f"{c.label}#{len(extra) + 2}"
            extra[name] = (c.proposer, own)
            names[c.label] = name
    if options.get("draft"):
        raise InvalidInputError(f"the draft proposer takes only control knobs ({', '.join(CONTROL_KNOBS)}); "
                                f"got {', '.join(options['draft'])}")
    return EnginePlan(proposer_options={k: v for k, v in options.items() if v},
                      extra=extra, request_name=names, control=control)


def control_settings(base, knobs: dict):
    """The engine's default ControlSettings with a configuration's draft_len/adaptive."""
    from dataclasses import replace
    if not knobs:
        return None
    adaptive = bool(knobs.get("adaptive", base.adaptive))
    changes: dict = {"adaptive": adaptive}
    if "draft_len" in knobs:
        n = int(knobs["draft_len"])
        changes.update(draft_length=n, **({"max_draft": n} if adaptive else {}))
    return replace(base, **changes)


def load_engine(m: Matrix, plan: EnginePlan):
    from ..engine import Engine
    from ..proposers import free_proposer

    engine = Engine.load(m.target, draft=m.draft, proposer=BASELINE, n_ctx=m.n_ctx,
                         threads=m.threads, proposer_options=plan.proposer_options)
    for label, (name, options) in plan.extra.items():
        # The engine's proposer table is keyed by request name, so a knob variant is just
        # one more entry; the controller and stats see it under its label.
        engine.add_proposer(label, free_proposer(name, **options))
    missing = [c.label for c in m.engine_configs
               if plan.request_name[c.label] != BASELINE
               and plan.request_name[c.label] not in engine.proposers]
    if missing:
        engine.close()
        raise EdgespecError(f"the engine could not load {', '.join(missing)} (loaded: "
                            f"{', '.join(engine.proposers) or 'none'}); is the native library built "
                            "(`make install`)?")
    return engine


def total_requests(m: Matrix, prompts: Sequence[BenchPrompt]) -> int:
    """Requests a run makes, warm-ups included (for progress and ETA)."""
    units = sum(len(p.turns) for p in prompts)
    return (units + (m.warmup if prompts else 0)) * len(m.configs)


# --- the run -------------------------------------------------------------------------
@dataclass
class BenchRun:
    matrix: Matrix
    identity: dict = field(default_factory=dict)
    load_seconds: dict = field(default_factory=dict)  # "target" and one per anchor label
    records: list[dict] = field(default_factory=list)
    warmup_discarded: int = 0
    interrupted: bool = False
    started_at: float = 0.0
    finished_at: float = 0.0

    def to_dict(self) -> dict:
        return {"schema": 1, "identity": self.identity, "matrix": self.matrix.to_dict(),
                "load_seconds": self.load_seconds, "warmup_discarded": self.warmup_discarded,
                "interrupted": self.interrupted, "started_at": self.started_at,
                "finished_at": self.finished_at, "records": self.records}


class Runner:
    """Runs the units of a matrix on an already loaded engine (and anchors)."""

    def __init__(self, m: Matrix, engine, anchors: dict | None = None,
                 request_name: dict[str, str] | None = None, progress: Progress | None = None,
                 control: dict[str, dict] | None = None) -> None:
        self.m = m
        self.engine = engine
        self.control = control or {}
        self.anchors = anchors or {}
        self.request_name = request_name or {c.label: c.proposer for c in m.engine_configs}
        self.progress = progress or (lambda done, total, rec: None)
        self._proc = _process()

    def run(self, prompts: Sequence[BenchPrompt], run: BenchRun) -> BenchRun:
        total = total_requests(self.m, prompts)
        done = 0
        run.started_at = run.started_at or time.time()
        try:
            if prompts:
                for _ in range(self.m.warmup):
                    for cfg in self.m.configs:
                        self._request(cfg, WARMUP_MESSAGES, self.m.warmup_tokens, seed=0)
                        run.warmup_discarded += 1
                        done += 1
                        self.progress(done, total, None)
            unit = 0
            for prompt in prompts:
                answers: dict[str, list[str] | None] = {c.label: [] for c in self.m.configs}
                for turn in range(len(prompt.turns)):
                    k = unit % len(self.m.configs)
                    order = list(self.m.configs[k:]) + list(self.m.configs[:k])
                    unit_records = []
                    for pos, cfg in enumerate(order):
                        history = answers[cfg.label]
                        if history is None:  # an earlier turn failed: no history to continue
                            rec = _error_record("skipped: an earlier turn of this prompt failed")
                        else:
                            rec = self._request(cfg, prompt.messages(history), self.m.max_new_tokens,
                                                seed=self.m.seed + unit)
                            if "error" in rec:
                                answers[cfg.label] = None
                            else:
                                history.append(rec["text"])
                        rec.update(config=cfg.label, kind=cfg.kind, prompt_id=prompt.id,
                                   category=prompt.category, source=prompt.source, turn=turn,
                                   n_turns=len(prompt.turns), unit=unit, position=pos)
                        if "prompt_tokens" in rec:
                            rec["bucket"] = bucket_label(rec["prompt_tokens"], self.m.buckets)
                        unit_records.append(rec)
                        run.records.append(rec)
                        done += 1
                        self.progress(done, total, rec)
                    _mark_parity(unit_records, greedy=self.m.temperature == 0)
                    unit += 1
        except KeyboardInterrupt:
            run.interrupted = True
        run.finished_at = time.time()
        return run

    # --- one request ---------------------------------------------------------------
    def _request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int, seed: int) -> dict:
        try:
            if cfg.kind == ANCHOR_KIND:
                return self._anchor_request(cfg, messages, max_tokens)
            return self._engine_request(cfg, messages, max_tokens, seed)
        except EdgespecError as e:
            return _error_record(str(e))

    def _params(self, max_tokens: int, seed: int) -> GenerationParams:
        return GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(
            temperature=self.m.temperature, seed=seed if self.m.temperature > 0 else None))

    def _engine_request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int,
                        seed: int) -> dict:
        rss = _rss(self._proc)
        t0 = time.perf_counter()
        fin = None
        ctl = self.control.get(cfg.label)
        kw = {}
        if ctl:
            kw["control"] = control_settings(self.engine.control, ctl)
            if "exact" in ctl:
                kw["exact"] = bool(ctl["exact"])
        stream: Iterator = self.engine.stream(messages, self._params(max_tokens, seed),
                                              proposer=self.request_name[cfg.label], **kw)
        try:
            for ev in stream:
                if isinstance(ev, Step):
                    rss = max(rss, _rss(self._proc))
                elif isinstance(ev, Finished):
                    fin = ev
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        wall = time.perf_counter() - t0
        if fin is None:
            raise EdgespecError("the engine stream ended without a Finished event")
        return _record(fin.stats, list(fin.tokens), fin.text, wall, rss)

    def _anchor_request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int) -> dict:
        anchor = self.anchors.get(cfg.label)
        if anchor is None:
            return _error_record("anchor not loaded (is llama-cpp-python's high-level API available?)")
        # Tokenized by the engine, so the anchor sees exactly the plain path's prompt.
        tokens = self.engine.prompt_tokens(messages, self._params(max_tokens, 0))
        rss = _rss(self._proc)
        t0 = time.perf_counter()
        trace = anchor.generate(tokens, max_tokens, temperature=self.m.temperature)
        wall = time.perf_counter() - t0
        rss = max(rss, _rss(self._proc))
        text = self.engine.target.detokenize(trace.tokens).decode("utf-8", "replace")
        return _record(trace_to_stats(trace, cfg.label), list(trace.tokens), text, wall, rss)


def _record(stats: RequestStats, tokens: list[int], text: str, wall: float, rss: int) -> dict:
    d = stats.to_dict()
    d.update(e2e_seconds=stats.total_seconds, wall_seconds=wall, rss_peak_bytes=rss,
             process_peak_rss_bytes=_max_rss(), token_times=list(stats.token_times),
             position_drafted=list(stats.position_drafted),
             position_accepted=list(stats.position_accepted),
             tokens=tokens, text=text)
    return d


def _error_record(message: str) -> dict:
    return {"error": message}


def _mark_parity(records: list[dict], greedy: bool) -> None:
    """Same output tokens as the plain path on this unit? (Only meaningful for greedy runs.)"""
    base = next((r for r in records if r.get("config") == BASELINE and "tokens" in r), None)
    for r in records:
        if r.get("config") == BASELINE or "tokens" not in r or base is None or not greedy:
            r["parity"] = None
        else:
            r["parity"] = r["tokens"] == base["tokens"]


def _process():
    try:
        import psutil
        return psutil.Process()
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None


def _rss(proc) -> int:
    return int(proc.memory_info().rss) if proc is not None else 0


def _max_rss() -> int:
    # ru_maxrss is the process high-water mark, in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# --- load everything, run, close ---------------------------------------------------
def anchor_context(m: Matrix, engine, prompts: Sequence[BenchPrompt]) -> int:
    """A context just big enough for the longest conversation (the anchor's logits buffer grows
    with n_ctx x n_vocab), rounded up to 256 and capped by the matrix."""
    need = 0
    params = GenerationParams(max_tokens=m.max_new_tokens)
    for p in prompts:
        # every turn with an empty answer gives the template's overhead; answers add at most
        # max_new_tokens each (plus the end-of-turn tokens the template writes)
        filler = [""] * (len(p.turns) - 1)
        n = len(engine.prompt_tokens(p.messages(filler), params))
        need = max(need, n + len(p.turns) * (m.max_new_tokens + 8) + 16)
    return min(max(256, int(math.ceil(need / 256.0)) * 256), m.anchor_n_ctx)


def run_bench(m: Matrix, progress: Progress | None = None, on_loaded: Callable[[BenchRun], None] | None = None,
              prompts: Sequence[BenchPrompt] | None = None) -> BenchRun:
    """The whole benchmark: load once (timed), run every unit, return the run (partial on Ctrl-C)."""
    from .identity import collect_identity

    m = m.validate()
    prompts = list(prompts) if prompts is not None else collect_prompts(m)
    plan = plan_engine(m.configs)
    run = BenchRun(matrix=m, started_at=time.time())
    t0 = time.perf_counter()
    engine = load_engine(m, plan)
    run.load_seconds["target"] = time.perf_counter() - t0
    anchors: dict = {}
    try:
        if m.anchor_configs:
            from .. import backend
            n_ctx = anchor_context(m, engine, prompts)
            for cfg in m.anchor_configs:
                t0 = time.perf_counter()
                anchors[cfg.label] = backend.anchor_prompt_lookup(
                    engine.target.path, n_ctx=n_ctx, threads=m.threads,
                    num_pred_tokens=int(cfg.knob_dict["num_pred_tokens"]))
                run.load_seconds[cfg.label] = time.perf_counter() - t0
        run.identity = collect_identity(m, engine, anchors, plan.control)
        if on_loaded is not None:
            on_loaded(run)
        Runner(m, engine, anchors, plan.request_name, progress, plan.control).run(prompts, run)
    except KeyboardInterrupt:
        run.interrupted = True
        run.finished_at = time.time()
    finally:
        for a in anchors.values():
            a.close()
        engine.close()
    return run
