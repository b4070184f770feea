"""Run the matrix: load the target once, interleave configurations prompt by prompt.

Protocol (why each rule exists):

* One engine serves every engine configuration through the per-request
  ``proposer=`` override, so all of them share the same weights, context and
  page cache; the plain path is simply ``proposer="none"``. Exact configurations run on
  a second engine with exact mode's batch-invariant kernel (the default engine runs the
  fastest one measured, planner.kernels), beside its own plain path ``none[exact=True]``
  whose text they must reproduce; their speed is still paired with our plain path.
* A *unit* is one turn of one prompt. Each unit runs every configuration back to
  back, the order rotating from unit to unit (A B C, B C A, ...) and from round to round
  (a prompt's unit starts one place further on each round), so slow drift of a shared
  machine and any first-or-last position effect fall on every configuration alike.
* Multi-turn prompts carry each configuration's *own* earlier answers, as a user's
  conversation would; with exact decoding those answers are identical anyway.
* A warm-up request per configuration runs first and is thrown away (page faults,
  allocator growth, the first graph build).
* Anchors (:mod:`edgespec.lab.bench.anchors`) are configurations like any other: llama-cpp-python
  runs in-process, llama.cpp's programs once per request on the prompt text whose
  tokenization is the engine's prompt tokens; a failing one is an error record, not the end.
* After each unit, every greedy divergence from the plain path is attributed
  (near-tie or defect) from a re-run of the plain path with logprobs, outside the timings.
* Then the unit's records go whole to the sink (``records.jsonl``) and the run keeps them
  compacted (records.compact: no token times, tokens or text), so its memory grows by a
  bounded record per request, never by its tokens (docs/bench.md, "Memory").
* Other processes' CPU share is measured before the load and over every unit
  (calibration.cpu.CpuWatch); a busy start or busy units are warned about as they happen and
  kept in the run (``busy``) for the report.
* Ctrl-C stops at once; what was measured is kept and marked ``interrupted``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from ...errors import EdgespecError, InvalidInputError
from ...api.events import Finished, Step
from ...api.params import GenerationParams, SamplingParams
from . import tools
from .anchors.trace import trace_to_stats
from .anchors import ANCHORS
from . import grounded
from .engines import control_settings, load_engine, plan_engine, renew_clones
from .oracle import References, settle
from .matrix import ANCHOR_KIND, BASELINE, ConfigSpec, Matrix
from .prompts import (BenchPrompt, bucket_label, load_humanevalfix, load_jsonl_prompts,
                      load_long, load_spec_bench)
from .records import (compact, error_record, mark_parity, process, rss_of, stats_record,
                      tool_prompt_text, tool_record)
from ...calibration.cpu import BUSY_LIMIT, CpuWatch, machine_busy
from ..analysis.parity import TOP_N, attribute_divergence
from .identity import collect_identity
from ..replay import depth_cache
from ..replay.depth import depths_for
from ..replay.record import Recorder

# Not one of the measured prompts: a proposer that learns across requests (the suffix tree)
# must not see the start of a measured answer before it is measured.
WARMUP_MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]

Progress = Callable[[int, int, dict | None], None]  # (done, total, record or None for warm-up)
Warn = Callable[[str], None]  # one line for the console, as it happens
Sink = Callable[[list[dict]], None]  # a unit's full records, before they are compacted


def collect_prompts(m: Matrix) -> list[BenchPrompt]:
    prompts: list[BenchPrompt] = []
    if m.spec_bench:
        prompts += load_spec_bench(categories=m.spec_bench, per_category=m.per_category,
                                   max_turns=m.max_turns)
    if m.humanevalfix:
        prompts += load_humanevalfix(n=m.humanevalfix)
    if m.long:
        prompts += load_long(m.long)
    if m.grounded:
        prompts += grounded.build(m.grounded).prompts
    for path in m.jsonl:
        prompts += load_jsonl_prompts(path, field=m.prompt_field, n=m.jsonl_n)
    if m.max_turns:
        prompts = [BenchPrompt(p.id, p.category, p.turns[: m.max_turns], p.source) for p in prompts]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise InvalidInputError("two prompts share an id; give JSONL records distinct 'id' fields")
    return prompts


def total_requests(m: Matrix, prompts: Sequence[BenchPrompt]) -> int:
    """Requests a run makes, warm-ups included (for progress and ETA)."""
    units = sum(len(p.turns) for p in prompts) * m.repeats
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
    recorder: object | None = None  # an edgespec.lab.replay.record.Recorder with --record
    load_rss_bytes: dict = field(default_factory=dict)  # what loading each one added to RSS
    # other processes' CPU share: at start, the most over one unit, units above BUSY_LIMIT
    busy: dict = field(default_factory=lambda: {"limit": BUSY_LIMIT, "at_start": None,
                                                "max_unit": 0.0, "busy_units": 0, "units": 0})

    def trace_lines(self) -> list[dict]:
        """traces.jsonl: a header, then every recorded engine request (none without --record)."""
        r = self.recorder
        return [] if r is None else [r.header(self.matrix.to_dict()), *r.requests]

    def to_dict(self) -> dict:
        return {"schema": 1, "identity": self.identity, "matrix": self.matrix.to_dict(),
                "load_seconds": self.load_seconds, "warmup_discarded": self.warmup_discarded,
                "interrupted": self.interrupted, "started_at": self.started_at,
                "finished_at": self.finished_at, "load_rss_bytes": self.load_rss_bytes,
                "busy": self.busy, "records": self.records}


class Runner:
    """Runs the units of a matrix on an already loaded engine (and anchors)."""

    def __init__(self, m: Matrix, engine, anchors: dict | None = None,
                 request_name: dict[str, str] | None = None, progress: Progress | None = None,
                 control: dict[str, dict] | None = None, exact_engine=None,
                 recorder=None, references: dict[str, References] | None = None,
                 sink: Sink | None = None, warn: Warn | None = None) -> None:
        self.m = m
        self.sink = sink or (lambda records: None)
        self.warn = warn or (lambda line: None)
        # oracle configuration -> its references, filled before the warm-ups (bench.oracle)
        self.references = references or {}
        self.recorder = recorder  # edgespec.lab.replay.record.Recorder, or None
        self.engine = engine
        self.exact_engine = exact_engine  # runs the exact configurations when given
        self.control = control or {}
        self.anchors = anchors or {}
        self.request_name = request_name or {c.label: c.proposer for c in m.engine_configs}
        self.progress = progress or (lambda done, total, rec: None)
        self._proc = process()

    def run(self, prompts: Sequence[BenchPrompt], run: BenchRun) -> BenchRun:
        total = total_requests(self.m, prompts)
        done = 0
        pending: list[dict] = []  # the current unit's records, kept also when interrupted
        run.started_at = run.started_at or time.time()
        plain_messages: dict[int, list[dict]] = {}  # unit -> what the plain path was asked
        baseline = {c.label: c.parity_baseline for c in self.m.configs}
        try:
            if prompts and self.references:
                self._reference_answers(prompts)
            if prompts:
                for _ in range(self.m.warmup):
                    for cfg in self.m.configs:
                        self._request(cfg, WARMUP_MESSAGES, self.m.warmup_tokens, seed=0)
                        run.warmup_discarded += 1
                        done += 1
                        self.progress(done, total, None)
            unit = 0
            per_round = sum(len(p.turns) for p in prompts)  # units
            for rnd, prompt in ((r, p) for r in range(self.m.repeats) for p in prompts):
                if rnd > 0 and prompt is prompts[0]:
                    self._renew_learners()
                answers: dict[str, list[str] | None] = {c.label: [] for c in self.m.configs}
                for turn in range(len(prompt.turns)):
                    watch = CpuWatch()
                    # the place within the round, + rnd: each round shifts every unit's order
                    # by one. The global unit number kept an order whenever the units a round
                    # were a multiple of the configurations (unit % n), or one short of one
                    # (unit + rnd: 14 units, 5 configurations)
                    k = (unit - rnd * per_round + rnd) % len(self.m.configs)
                    order = list(self.m.configs[k:]) + list(self.m.configs[:k])
                    unit_records = pending = []
                    for pos, cfg in enumerate(order):
                        history = answers[cfg.label]
                        if history is None:  # an earlier turn failed: no history to continue
                            rec = error_record("skipped: an earlier turn of this prompt failed")
                        else:
                            messages = prompt.messages(history)
                            if cfg.label == BASELINE:
                                plain_messages[unit] = messages
                            rec = self._request(cfg, messages, self.m.max_new_tokens,
                                                seed=self.m.seed + unit)
                            if "error" in rec:
                                answers[cfg.label] = None
                            else:
                                history.append(rec["text"])
                        rec.update(config=cfg.label, kind=cfg.kind, prompt_id=prompt.id,
                                   category=prompt.category, source=prompt.source, turn=turn,
                                   n_turns=len(prompt.turns), unit=unit, position=pos,
                                   round=rnd)
                        trace = rec.pop("_trace", None)
                        if trace is not None:
                            trace.update(unit=unit, prompt_id=prompt.id, turn=turn,
                                         category=prompt.category, round=rnd)
                        if "prompt_tokens" in rec:
                            rec["bucket"] = bucket_label(rec["prompt_tokens"], self.m.buckets)
                        unit_records.append(rec)
                        done += 1
                        self.progress(done, total, rec)
                    mark_parity(unit_records, greedy=self.m.temperature == 0, baseline=baseline)
                    self._note_busy(run, watch.share(), unit)
                    self._attribute(unit_records, {unit: plain_messages.pop(unit)}
                                    if unit in plain_messages else {})
                    self._keep(run, unit_records)
                    pending = []
                    unit += 1
        except KeyboardInterrupt:
            run.interrupted = True
            self._keep(run, pending)  # the interrupted unit's finished requests
        run.finished_at = time.time()
        return run

    def _keep(self, run: BenchRun, records: list[dict]) -> None:
        """Whole records to the sink; the run keeps compacted copies."""
        if records:
            self.sink(records)
            run.records.extend(compact(dict(r)) for r in records)

    def _note_busy(self, run: BenchRun, share: float, unit: int) -> None:
        b = run.busy
        b["units"] += 1
        b["max_unit"] = max(b["max_unit"], round(share, 3))
        if share > BUSY_LIMIT:
            b["busy_units"] += 1
            if b["busy_units"] == 1:  # said once; the report counts them all
                self.warn(f"warning: other processes took {share:.0%} of the CPUs during unit "
                          f"{unit + 1}; timings of busy units are noise (the report counts them)")

    def _reference_answers(self, prompts: Sequence[BenchPrompt]) -> None:
        """Every oracle configuration's reference for every turn of every prompt, untimed
        (bench.oracle.settle, from the plain path's answer); a later turn continues the
        oracle's own answers, as its timed conversation will."""
        params = self._params(self.m.max_new_tokens, 0)
        plain: dict[tuple[int, ...], tuple[int, ...]] = {}
        for label, refs in self.references.items():
            ctl = control_settings(self.engine.control, self.control.get(label, {}))
            for prompt in prompts:
                answers: list[str] = []
                for _ in prompt.turns:
                    messages = prompt.messages(answers)
                    key = tuple(self.engine.prompt_tokens(messages, params))
                    if key not in plain:
                        plain[key] = tuple(self.engine.generate(messages, params,
                                                                proposer=BASELINE).tokens)
                    last: list = []

                    def run(messages=messages, last=last):
                        last[:] = [self.engine.generate(messages, params, proposer=label,
                                                        control=ctl)]
                        return last[0].tokens

                    settle(refs, key, plain[key], run)
                    answers.append(last[0].text)

    # --- divergences ---------------------------------------------------------------
    def _exact(self, label: str) -> bool:
        knobs = self.control.get(label, {})
        return bool(knobs["exact"]) if "exact" in knobs else bool(getattr(self.engine, "exact", False))

    def _attribute(self, records: list[dict], plain_messages: dict[int, list[dict]]) -> None:
        """Near-tie or defect, for every engine configuration whose greedy output left the
        plain path's (parity.attribute_divergence), from one untimed plain re-run with
        logprobs per unit that needs it (on the engine the configuration ran on)."""
        if self.m.temperature > 0:
            return
        units: dict[int, list[dict]] = {}
        for r in records:
            units.setdefault(r["unit"], []).append(r)
        by_label = {c.label: c for c in self.m.configs}
        for unit, recs in units.items():
            diverged = [r for r in recs if r.get("parity") is False and r["kind"] == "engine"]
            if diverged and unit in plain_messages:
                for cfg in {by_label[r["config"]] for r in diverged if r["config"] in by_label}:
                    self._attribute_against(cfg, [r for r in diverged if r["config"] == cfg.label],
                                            recs, plain_messages[unit])

    def _attribute_against(self, cfg: ConfigSpec, diverged: list[dict], recs: list[dict],
                           messages: list[dict]) -> None:
        base = next((r for r in recs if r["config"] == cfg.parity_baseline and "tokens" in r), None)
        if base is None:
            return
        params = GenerationParams(max_tokens=self.m.max_new_tokens, logprobs=TOP_N,
                                  sampling=SamplingParams(temperature=0.0))
        try:
            again = self._engine_for(cfg).generate(messages, params, proposer=BASELINE)
        except EdgespecError as e:
            for r in diverged:
                r["divergence"] = {"kind": "unattributed", "reason": str(e)}
            return
        same = list(again.tokens) == list(base["tokens"])
        for r in diverged:
            if not same:
                r["divergence"] = {"kind": "unattributed",
                                   "reason": "the plain path did not reproduce its tokens"}
                continue
            r["divergence"] = attribute_divergence(
                base["tokens"], r["tokens"], again.logprobs, exact=self._exact(r["config"])) or {
                "kind": "unattributed", "reason": "same tokens, different length (one run "
                "stopped earlier)"}

    def _renew_learners(self) -> None:
        """Every configuration starts a round of ``--repeats`` with fresh learning proposers:
        the rounds are replicas of one run, not one long run that has seen the answers."""
        for cfg in self.m.engine_configs:
            renew_clones(self._engine_for(cfg), cfg.label, self.request_name.get(cfg.label, ""))

    def _engine_for(self, cfg: ConfigSpec):
        return self.exact_engine if cfg.exact and self.exact_engine is not None else self.engine

    # --- one request ---------------------------------------------------------------
    def _request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int, seed: int) -> dict:
        try:
            if cfg.kind == ANCHOR_KIND:
                return self._anchor_request(cfg, messages, max_tokens, seed)
            return self._engine_request(cfg, messages, max_tokens, seed)
        except EdgespecError as e:
            return error_record(str(e))

    def _params(self, max_tokens: int, seed: int) -> GenerationParams:
        return GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(
            temperature=self.m.temperature, seed=seed if self.m.temperature > 0 else None))

    def _engine_request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int,
                        seed: int) -> dict:
        rss = rss0 = rss_of(self._proc)
        t0 = time.perf_counter()
        fin = None
        ctl = self.control.get(cfg.label)
        engine = self._engine_for(cfg)
        kw = {}
        if ctl:
            kw["control"] = control_settings(engine.control, ctl)
            if "exact" in ctl:
                kw["exact"] = bool(ctl["exact"])
        rr = None
        if self.recorder is not None:  # tokenized before the clock starts
            rr = self.recorder.begin(
                engine="exact" if engine is self.exact_engine else "default", config=cfg.label,
                prompt_tokens=engine.prompt_tokens(messages, self._params(max_tokens, seed)),
                max_tokens=max_tokens, n_ctx=engine.ctx.n_ctx, warmup=messages is WARMUP_MESSAGES)
            t0 = time.perf_counter()
        stream: Iterator = engine.stream(messages, self._params(max_tokens, seed),
                                              proposer=self.request_name[cfg.label], **kw)
        sizes: dict[int, list[float]] = {}  # tokens in the target pass -> [passes, seconds]
        try:
            for ev in stream:
                if rr is not None:
                    rr.on_event(ev)
                if isinstance(ev, Step):
                    rss = max(rss, rss_of(self._proc))
                    # a pass holds the pending token plus the drafts (a plain step is 1)
                    cell = sizes.setdefault(ev.drafted + 1, [0, 0.0])
                    cell[0] += 1
                    cell[1] += ev.verify_seconds
                elif isinstance(ev, Finished):
                    fin = ev
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            if rr is not None:
                self.recorder.end(rr)
        wall = time.perf_counter() - t0
        if fin is None:
            raise EdgespecError("the engine stream ended without a Finished event")
        rss = max(rss, rss_of(self._proc))
        rec = stats_record(fin.stats, list(fin.tokens), fin.text, wall, rss)
        rec["rss_growth_bytes"] = max(rss - rss0, 0)
        rec["pass_size_hist"] = {str(k): int(v[0]) for k, v in sorted(sizes.items())}
        rec["pass_seconds"] = {str(k): v[1] for k, v in sorted(sizes.items())}
        if rr is not None and "passes" in rr.rec:
            rec["_trace"] = rr.rec  # run() labels it with the unit, then drops this key
        return rec

    def _anchor_request(self, cfg: ConfigSpec, messages: list[dict], max_tokens: int,
                        seed: int = 0) -> dict:
        anchor = self.anchors.get(cfg.label)
        if anchor is None:
            return error_record("anchor not loaded (is llama-cpp-python's high-level API available?)")
        if isinstance(anchor, tools.ToolAnchor):
            return self._tool_request(anchor, messages, max_tokens, seed)
        # Tokenized by the engine, so the anchor sees exactly the plain path's prompt.
        tokens = self.engine.prompt_tokens(messages, self._params(max_tokens, 0))
        rss0 = rss_of(self._proc)
        t0 = time.perf_counter()
        trace = anchor.generate(tokens, max_tokens, temperature=self.m.temperature)
        wall = time.perf_counter() - t0
        rss = max(rss0, rss_of(self._proc))
        text = self.engine.target.detokenize(trace.tokens).decode("utf-8", "replace")
        rec = stats_record(trace_to_stats(trace, cfg.label), list(trace.tokens), text, wall, rss)
        rec["rss_growth_bytes"] = rss - rss0
        return rec

    def _tool_request(self, anchor: "tools.ToolAnchor", messages: list[dict], max_tokens: int,
                      seed: int) -> dict:
        tokens = self.engine.prompt_tokens(messages, self._params(max_tokens, seed))
        text = tool_prompt_text(self.engine.target, tokens)
        run = tools.run_tool(anchor.tool, anchor.setup, text, max_tokens,
                             temperature=self.m.temperature, seed=seed, draft_max=anchor.draft_max)
        if run.timing.prompt_tokens != len(tokens):
            raise EdgespecError(f"{anchor.tool} read {run.timing.prompt_tokens} prompt tokens where "
                                f"the engine has {len(tokens)}: not the same prompt")
        return tool_record(run, max_tokens)


# --- load everything, run, close ---------------------------------------------------
def anchor_context(m: Matrix, engine, prompts: Sequence[BenchPrompt]) -> int:
    """A context just big enough for the longest conversation (the anchor's KV cache grows
    with n_ctx), rounded up to 256 and capped by the matrix."""
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
              prompts: Sequence[BenchPrompt] | None = None, sink: Sink | None = None,
              warn: Warn | None = None) -> BenchRun:
    """The whole benchmark: load once (timed), run every unit, return the run (partial on
    Ctrl-C). ``sink`` receives each unit's full records; the run keeps them compacted."""
    m = m.validate()
    warn = warn or (lambda line: None)
    prompts = list(prompts) if prompts is not None else collect_prompts(m)
    plan = plan_engine(m.configs)
    tool_names = sorted({c.proposer for c in m.anchor_configs if ANCHORS[c.proposer].tool})
    bin_dir = tools.check_built(tool_names) if tool_names else None  # before any load
    run = BenchRun(matrix=m, started_at=time.time())
    # the stdlib texts the grounded prompts come from (the same build as collect_prompts':
    # a pure function of this Python), and the ones skipped, said by name
    gset = grounded.build(m.grounded) if m.grounded else None
    for skipped in gset.skipped if gset is not None else ():
        warn(skipped.line())
    share = machine_busy(0.5)
    run.busy["at_start"] = round(share, 3)
    if share > BUSY_LIMIT:
        warn(f"warning: other processes are using {share:.0%} of the CPUs at the start; this "
             "run's timings will be noise (the report says so)")
    proc = process()
    rss0 = rss_of(proc)
    t0 = time.perf_counter()
    references = {label: References() for label in plan.oracles}
    engines, request_names = load_engine(m, plan, references)
    engine = engines[False]
    run.load_seconds["target"] = time.perf_counter() - t0
    run.load_rss_bytes["target"] = rss_of(proc) - rss0
    anchors: dict = {}
    pld_model = None  # the model the llama-pld anchors share (they do not close it)
    try:
        pld = [c for c in m.anchor_configs if not ANCHORS[c.proposer].tool]
        if pld:
            from .anchors.llama_api import anchor_prompt_lookup  # deferred: it loads llama.cpp
            n_ctx = anchor_context(m, engine, prompts)
            t0 = time.perf_counter()
            rss0 = rss_of(proc)
            # one llama-cpp-python model for every llama-pld:N (PromptLookupAnchor.drafting),
            # computing with the engine's loaded weights where they are what it would load
            pld_model = anchor_prompt_lookup(engine.target.path, n_ctx=n_ctx, threads=m.threads,
                                             loaded=engine.target)
            run.load_seconds[pld[0].label] = time.perf_counter() - t0
            run.load_rss_bytes[pld[0].label] = rss_of(proc) - rss0
            for cfg in pld:
                anchors[cfg.label] = pld_model.drafting(int(cfg.knob_dict["num_pred_tokens"]))
        if bin_dir is not None:
            setup = tools.setup_from_engine(engine, bin_dir, _draft_path(m))
            for cfg in m.anchor_configs:
                if ANCHORS[cfg.proposer].tool:
                    anchors[cfg.label] = tools.ToolAnchor(cfg.proposer, setup,
                                                          cfg.knob_dict.get("draft_max"))
        run.identity = collect_identity(m, engine, anchors, plan.control)
        if gset is not None:
            run.identity["grounded"] = gset.to_dict()
        if m.record:
            run.recorder = _recorder(m, engines, prompts, warn)
        if on_loaded is not None:
            on_loaded(run)
        Runner(m, engine, anchors, request_names, progress, plan.control,
               exact_engine=engines.get(True), recorder=run.recorder,
               references=references, sink=sink, warn=warn).run(prompts, run)
    except KeyboardInterrupt:
        run.interrupted = True
        run.finished_at = time.time()
    finally:
        for a in anchors.values():
            a.close()
        if pld_model is not None:
            pld_model.close()
        for eng in engines.values():
            eng.close()
    return run


def _draft_path(m: Matrix):
    """The bench's --draft as a file, for a tool anchor that needs one (None without one)."""
    if m.draft is None:
        return None
    from ...registry import resolve  # deferred: the registry reads its files on first use
    return resolve(m.draft, pull=False)


def deepest_pass(m: Matrix, engine, prompts: Sequence[BenchPrompt]) -> int:
    """The most cached cells any pass of the run can have: the longest conversation's
    prompt plus every answer's max_new_tokens."""
    params = GenerationParams(max_tokens=m.max_new_tokens)
    need = 0
    for p in prompts:
        n = len(engine.prompt_tokens(p.messages([""] * (len(p.turns) - 1)), params))
        need = max(need, n + len(p.turns) * (m.max_new_tokens + 8))
    return need


def _recorder(m: Matrix, engines: dict, prompts: Sequence[BenchPrompt], warn: Warn):
    """--record: the pass-time curve at the depths this run's passes have, on each engine's
    kernel configuration (measured before any request, or cached from an earlier run on
    this machine: edgespec.lab.replay.depth_cache), and the hooks that keep each pass."""
    rec = Recorder()
    for exact, eng in engines.items():
        depths = depths_for(deepest_pass(m, eng, prompts), eng.ctx.n_ctx)
        curve, measured_at = depth_cache.load_or_measure(
            eng.target, depths, n_threads=eng.ctx.n_threads, kernel=eng.config.layout())
        if measured_at is not None:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(measured_at))
            warn(f"--record: the {'exact' if exact else 'default'} engine's pass-time curve at "
                 f"{', '.join(map(str, depths))} cached tokens is the one measured {when} "
                 f"(cached: delete {depth_cache.pattern(eng.target.path)} to measure it again)")
        rec.attach("exact" if exact else "default", eng, curve)
    return rec
