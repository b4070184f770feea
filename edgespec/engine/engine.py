"""The engine: built once from an :class:`~edgespec.config.EngineConfig`, serves requests
as typed event streams (the loop itself is :mod:`edgespec.loop.request`).

    engine = Engine.from_config(EngineConfig(target="qwen-1.5b"))   # or Engine.load(...)
    for ev in engine.stream("prompt", GenerationParams(max_tokens=64)):
        ...   # RequestStarted, PrefillDone, Step..., Control..., Finished

Construction is a short builder over an ``ExitStack`` (edgespec.engine.build): whatever
fails releases what was already loaded, in reverse order, before the error reaches the
caller. The engine's parts, one job each: the loaded proposers (proposer_set.py), what it
measures once and keeps (upkeep.py: calibration, exact cap, identity), a request before and
around the loop (requests.py: Prepared, its controller, Result), exact mode's policy
(exactness.py), prompt rendering (prompt.py), the canary's events (canary.py).
"""
from __future__ import annotations

import itertools
import threading
from contextlib import ExitStack
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from ..api.events import Event, Finished
from ..api.labels import AUTO, PLAIN
from ..api.params import GenerationParams
from ..api.stats import StatsSink
from ..calibration.curve import Calibration
from ..config import EngineConfig, split_proposers
from ..control import ControlSettings, GoodputGuard
from ..control.guard import Route
from ..decoding import sampling
from ..decoding.kvcache import PrefixCache, StateCache
from ..decoding.textstream import TextAssembler
from ..errors import ContextOverflowError, InvalidInputError
from ..grammar.constraint import constraint_for
from ..grammar.state import GrammarState
from ..identity import identity as release_identity
from ..loop.request import Loop
from ..loop.state import Request
from ..proposers import Proposer
from ..runtime.context import Context
from ..runtime.kernel import KernelConfig
from ..runtime.model import Model
from . import build, exactness
from .build import DEFAULT_CTX
from .canary import canary_events
from .prompt import prompt_tokens
from .proposer_set import ProposerSet
from .requests import ControllerHook, LogitsProcessor, Prepared, Result, attach_controller
from .upkeep import Upkeep

if TYPE_CHECKING:
    from ..identity.identity import Identity
    from ..planner import Plan

#: a request's prompt: text, chat messages, or token ids (a completions or FIM prompt)
Prompt = str | Sequence[dict[str, Any]] | tuple[int, ...]


class Engine:
    """A loaded target (plus proposers) that serves requests.

    Thread safety: an engine runs one request at a time; concurrent calls to
    :meth:`stream`/:meth:`generate` from a GUI thread pool wait their turn.
    :meth:`cancel` may be called from any thread and ends the running request
    at the next step boundary with ``stop_reason == "cancelled"``.

    The engine owns ``resources`` from the moment it is constructed (a constructor that
    fails closes them), so a builder hands them over last.
    """

    def __init__(self, target: Model, ctx: Context, *, config: EngineConfig,
                 proposers: Mapping[str, Proposer], calibration: Calibration | None = None,
                 sinks: Sequence[StatsSink] = (), plan: Plan | None = None,
                 resources: ExitStack | None = None, default_proposer: str | None = None,
                 tree_seqs: Sequence[int] = (),
                 proposer_options: Mapping[str, Mapping[str, Any]] | None = None,
                 exact_cap: int | None = None) -> None:
        self._resources = resources or ExitStack()
        try:
            self._setup(target, ctx, config, proposers, calibration, sinks, plan,
                        default_proposer, tree_seqs, proposer_options or {}, exact_cap)
        except BaseException:
            self._resources.close()
            raise

    def _setup(self, target: Model, ctx: Context, config: EngineConfig,
               proposers: Mapping[str, Proposer], calibration: Calibration | None,
               sinks: Sequence[StatsSink], plan: Plan | None, default_proposer: str | None,
               tree_seqs: Sequence[int], proposer_options: Mapping[str, Mapping[str, Any]],
               exact_cap: int | None) -> None:
        self.target, self.ctx = target, ctx
        # what the context runs: from_config always sets it; a hand-built engine's is the layout's
        self.config = config if config.kernel is not None else replace(config, kernel=config.layout())
        self.target_name = str(config.target)
        self.draft_name = str(config.draft) if config.draft else None
        self.exact = config.exact
        self.control: ControlSettings = (config.control or ControlSettings()).validate()
        self.guard = GoodputGuard(self.control, plain_seconds_prior=(
            calibration.step_seconds if calibration is not None else None))
        #: what the engine measures once and keeps: calibration, exact cap, identity
        self.upkeep = Upkeep(target, self.config, ctx.n_threads, self.guard,
                             describe=lambda: release_identity.collect(self),
                             curve=calibration, exact_cap=exact_cap)
        self.proposer_set = ProposerSet(proposers, proposer_options, self._resources,
                                        on_change=self.upkeep.forget_identity)
        #: name -> loaded proposer (the proposer set's own dict)
        self.proposers: dict[str, Proposer] = self.proposer_set.loaded
        self.default_proposer = default_proposer or (
            config.proposer if config.proposer != AUTO else self.proposer_set.label())
        self.proposer_set.check(self.default_proposer)
        self.sinks = list(sinks)
        self.plan = plan  # the planner's plan when the proposer was "auto", else None
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._ids = itertools.count(1)
        if config.chat_template is not None:  # --chat-template FILE: the target's own replaced
            target.use_chat_template(config.chat_template)
        self._template = target.chat_template()
        # prefix reuse across requests: what the target's KV holds, plus earlier
        # conversations' states in RAM (EngineConfig.kv_cache_ram; 0 turns it off)
        self.kv_cache = PrefixCache(ctx, ram=StateCache() if config.kv_cache_ram is None
                                    else StateCache(config.kv_cache_ram))
        #: requests reuse the KV cache's longest common prefix unless they say otherwise;
        #: off by default so benchmarks and parity runs prefill every prompt
        self.reuse = False
        #: called as hook(req, controller, built) for every request that gets a controller,
        #: returning the controller the request runs with; ``built`` holds what
        #: make_controller was given. The bench's recorder (edgespec.lab.replay.record) wraps
        #: the controller this way to keep every decision for an offline replay.
        self.controller_hook: ControllerHook | None = None
        self._loop = Loop(target, ctx, target_name=self.target_name, draft_name=self.draft_name,
                          sinks=self.sinks, cancelled=self._cancel, kv=self.kv_cache)
        # the context's sequences set aside as draft trees' scratch branches (past the
        # request slots; edgespec.loop.treepass)
        self._loop.tree_seqs = tuple(tree_seqs)

    # --- what a scheduler drives -------------------------------------------------------
    @property
    def loop(self) -> Loop:
        """The request loop over the target's context: its steps (started, begin, plan,
        complete, end, release) are what edgespec.serving.scheduler batches."""
        return self._loop

    def exclusive(self) -> threading.Lock:
        """Hold the engine while driving its loop from outside (``with engine.exclusive():``):
        a direct :meth:`stream` or :meth:`refresh_kv` call waits until it is let go."""
        return self._lock

    # --- construction -----------------------------------------------------------
    @classmethod
    def from_config(cls, config: EngineConfig, sinks: Sequence[StatsSink] = ()) -> "Engine":
        """Load what ``config`` names (after the planner resolves ``proposer="auto"``)."""
        config = config.validate()
        with ExitStack() as stack:
            parts = build.load_parts(config, stack)
            # exact mode's cap settles the control settings before the engine exists
            control, cap = build.exact_control(parts)
            resources = stack.pop_all()
        return cls(parts.target, parts.ctx, config=replace(parts.config, control=control),
                   proposers=parts.proposers, calibration=parts.calibration, sinks=sinks,
                   plan=parts.plan, default_proposer=parts.config.proposer,
                   tree_seqs=parts.tree_seqs, proposer_options=parts.options, exact_cap=cap,
                   resources=resources)

    @classmethod
    def load(cls, target: str, draft: str | None = None, proposer: str = EngineConfig.proposer, *,
             n_ctx: int | None = None, threads: int | None = None, max_draft: int | None = None,
             proposer_options: Mapping[str, Mapping[str, Any]] | None = None,
             n_gpu_layers: int = 0, draft_gpu_layers: int = 0, adaptive: bool = True,
             control_settings: ControlSettings | None = None,
             sinks: Sequence[StatsSink] = (), pull: bool = True,
             budget: str | int | None = None, exact: bool = EngineConfig.exact,
             kernel: KernelConfig | None = None, parallel: int = 1,
             kv_cache_ram: int | None = None, tree_width: int = 0,
             use_mmap: bool | None = None) -> "Engine":
        """Keyword form of :meth:`from_config`.

        ``exact=False`` (the default) is lossless: every emitted token is the target's
        own choice in the pass that verifies it. ``exact=True`` adds that greedy output is
        bitwise the plain path's, by keeping verify passes within the probed batch size
        whose logits equal single-token decoding.
        """
        cfg = EngineConfig(target=str(target), draft=str(draft) if draft else None,
                           proposer=proposer, proposer_options=dict(proposer_options or {}),
                           kernel=kernel, exact=exact, n_ctx=n_ctx,
                           threads=threads, n_gpu_layers=n_gpu_layers,
                           draft_gpu_layers=draft_gpu_layers, adaptive=adaptive,
                           max_draft=max_draft, control=control_settings,
                           budget=budget, pull=pull, parallel=parallel, kv_cache_ram=kv_cache_ram,
                           tree_width=tree_width, use_mmap=use_mmap)
        return cls.from_config(cfg, sinks=sinks)

    def close(self) -> None:
        with self._lock:
            self._resources.close()

    def on_close(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` when the engine closes, before what was loaded earlier is freed
        (a context made from the target goes before the target)."""
        self._resources.callback(fn, *args)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- exactness -------------------------------------------------------------------
    def exact_max_draft(self) -> int:
        """Most drafts a verify pass may hold in exact mode: the probed bitwise-invariant
        batch size of this device and kernel configuration, minus the pending token."""
        return self.upkeep.exact_max_draft()

    def check_exact(self, control: ControlSettings, exact: bool,
                    label: str | None = None) -> ControlSettings:
        """Exact mode bounds the adaptive controller's drafts and refuses what it cannot
        verify bitwise (a longer fixed draft; any draft where no batch is invariant)."""
        if not exact:
            return control
        return exactness.bound(control, self.exact_max_draft(), self.config.layout(),
                               bool(split_proposers(label or self.default_proposer)))

    # --- the proposer set (edgespec.engine.proposer_set) ------------------------------
    @property
    def proposer_options(self) -> dict[str, dict[str, Any]]:
        """What each loaded proposer kind was built with."""
        return self.proposer_set.options

    def add_proposer(self, name: str, proposer: Proposer) -> None:
        """Make another proposer (e.g. the same kind with other knobs) available to requests."""
        self.proposer_set.add(name, proposer)

    def remove_proposer(self, name: str) -> None:
        """Close and drop a proposer added with :meth:`add_proposer` (its model is freed now,
        not when the engine closes; closing twice is harmless)."""
        self.proposer_set.remove(name, keep=self.default_proposer)

    def clone_proposer(self, name: str, as_name: str, **overrides: Any) -> str:
        """Load a fresh instance of loaded proposer ``name`` (the options the engine gave it,
        ``overrides`` on top) under ``as_name``. A benchmark gives each configuration its own
        instances, so a proposer that learns across requests (suffix trees, n-gram
        statistics) never sees another configuration's answer to the same prompt."""
        return self.proposer_set.clone(name, as_name, overrides)

    # --- what the engine keeps about itself (edgespec.engine.upkeep) -------------------
    @property
    def identity(self) -> Identity:
        """This engine's release identity (:mod:`edgespec.identity`): every component its
        speed and output depend on, and their hash. Computed once (about a second the
        first time a model is seen: its vocabulary is digested, then cached)."""
        return self.upkeep.identity()

    def calibration(self, threads: int | None = None) -> Calibration:
        """This device's verify-cost curve for the target (measured once, cached on disk)."""
        return self.upkeep.calibration(threads)

    # --- requests -----------------------------------------------------------------
    def cancel(self) -> None:
        """End the running request at the next step boundary (thread-safe)."""
        self._cancel.set()

    def prompt_tokens(self, prompt: Prompt, params: GenerationParams) -> list[int]:
        """Tokenize a prompt (a string or a list of chat messages) the way a request will."""
        return prompt_tokens(self.target, self._template, prompt, params)

    def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                 proposer: str | None = None, control: ControlSettings | None = None,
                 exact: bool | None = None, traffic: str = "default",
                 reuse: bool | None = None) -> Result:
        fin = None
        for ev in self.stream(prompt, params, proposer=proposer, control=control, exact=exact,
                              traffic=traffic, reuse=reuse):
            if isinstance(ev, Finished):
                fin = ev
        assert fin is not None
        return Result(text=fin.text, tokens=fin.tokens, stop_reason=fin.stop_reason,
                      stats=fin.stats, logprobs=tuple(fin.logprobs))

    def chat(self, messages: Sequence[dict[str, Any]], params: GenerationParams | None = None,
             proposer: str | None = None, control: ControlSettings | None = None,
             exact: bool | None = None, reuse: bool = True) -> Iterator[Event]:
        """Stream the assistant's answer to a conversation (``[{"role", "content"}, ...]``),
        reusing the KV of the longest prefix an earlier request left (the conversation so
        far). :class:`edgespec.chat.conversation.Conversation` keeps the history for you."""
        return self.stream(list(messages), replace(params or GenerationParams(), chat=True),
                           proposer=proposer, control=control, exact=exact, reuse=reuse)

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               proposer: str | None = None, control: ControlSettings | None = None,
               exact: bool | None = None, reuse: bool | None = None,
               traffic: str = "default",
               logits_processor: LogitsProcessor | None = None) -> Iterator[Event]:
        """Run one request, yielding RequestStarted, PrefillDone, Step..., Control..., Finished.

        ``proposer`` (a loaded name, several joined by ``+``, or ``"none"``), ``control``
        (a :class:`edgespec.control.ControlSettings`) and ``exact`` override the engine's
        defaults for this request only, so a benchmark can compare the plain path, fixed
        draft lengths and adaptive control on one loaded model. ``reuse`` (default: the
        engine's ``reuse``) starts from the longest token prefix of the prompt that the KV
        cache already holds and prefills only the rest (edgespec.decoding.kvcache). ``traffic`` names
        the request's traffic slice: the goodput guard and the canary judge per slice.
        ``logits_processor`` (llama-cpp-python's: ``(input_ids, logits) -> logits`` before
        each token is chosen) makes the request plain: verification cannot replay a callback.
        Everything is validated before this returns (the events come when iterated).
        """
        return self._run(self.prepare(prompt, params, proposer=proposer, control=control,
                                      exact=exact, reuse=reuse, traffic=traffic,
                                      logits_processor=logits_processor))

    def prepare(self, prompt: Prompt, params: GenerationParams | None = None,
                proposer: str | None = None, control: ControlSettings | None = None,
                exact: bool | None = None, reuse: bool | None = None,
                traffic: str = "default",
                logits_processor: LogitsProcessor | None = None) -> Prepared:
        """Validate and tokenize a request without running it (what :meth:`stream` and the
        serving scheduler admit); every user error is raised here."""
        params = (params or GenerationParams()).validate()
        exact = self.exact if exact is None else exact
        label = proposer or self.default_proposer
        if logits_processor is not None:
            label = PLAIN  # a Python callback on logits runs on the plain path only
        self.proposer_set.check(label)
        control = self.check_exact((control or self.control).validate(), exact, label)
        prompt_tokens = self.prompt_tokens(prompt, params)
        if not prompt_tokens:
            raise InvalidInputError("the prompt tokenized to nothing")
        if len(prompt_tokens) + 1 > self.ctx.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt_tokens)} tokens but the context holds {self.ctx.n_ctx}; "
                "raise --ctx (up to the model's trained context) or shorten the prompt")
        constraint = constraint_for(params)
        # opened here, so a grammar this vocabulary cannot start is refused before generation
        state = GrammarState.open(constraint, self.target) if constraint is not None else None
        return Prepared(prompt_tokens, params, label, control,
                        self.reuse if reuse is None else reuse, traffic, state, exact,
                        logits_processor)

    def _run(self, prep: Prepared) -> Iterator[Event]:
        with self._lock:
            self._cancel.clear()
            req, route = self.open_request(prep)
            try:
                for ev in self._loop.serve(req):
                    yield from self.canary(ev, req, route, prep.traffic)
            finally:
                req.close()

    def open_request(self, prep: Prepared) -> tuple[Request, Route]:
        """The :class:`Request` a prepared request runs as (its controller built, the
        canary's routing decided), and that route. The caller runs it and closes it."""
        params = prep.params
        route = self.guard.route(prep.traffic, prep.label)  # the canary decision (plain or as asked)
        label = route.label
        req = Request(id=next(self._ids), params=params, proposer_label=label,
                      tokens=list(prep.tokens), n_prompt=len(prep.tokens),
                      text=TextAssembler(params.stop), reuse=prep.reuse, grammar=prep.grammar,
                      exact=prep.exact, logits_processor=prep.logits_processor)
        prep.grammar = None  # the request owns it now
        req.stats.proposer = label
        if self.sinks:  # records leaving the process name the release they measured
            req.stats.identity = self._announce_identity()
        if not params.sampling.greedy:
            req.rng = sampling.make_rng(params.sampling.seed)
        try:
            attach_controller(req, prep, split_proposers(label), self.proposers,
                              self.calibration, self.guard, self.controller_hook)
        except BaseException:
            req.close()
            raise
        return req, route

    def canary(self, ev: Event, req: Request, route: Route, traffic: str) -> list[Event]:
        """The canary's part of a request's event (edgespec.engine.canary)."""
        return canary_events(self.guard, ev, req, route, traffic)

    def _announce_identity(self) -> str:
        """The identity's hash for a stats record; sinks that keep full records
        (``announce``) are shown the whole identity and write it once per run."""
        ident = self.identity
        for sink in self.sinks:
            announce = getattr(sink, "announce", None)
            if announce is not None:
                announce(ident)
        return ident.hash

    # --- idle time: conversations (edgespec.decoding.kvcache) ----------------------------------
    def refresh_kv(self, stop: Callable[[], object] | None = None) -> int:
        """After a turn that promises its text (exact, greedy, seeded: the caller knows):
        prefill the answer's positions again so the next turn, which reuses only what a
        prefill wrote, reuses them (PrefixCache.refresh). Call it once the answer is shown;
        :meth:`cancel` (or ``stop()`` turning true) ends it between chunks. Returns the
        positions refreshed."""
        with self._lock:
            self._cancel.clear()
            return self.kv_cache.refresh(
                lambda: self._cancel.is_set() or (stop is not None and bool(stop())))


__all__ = ["DEFAULT_CTX", "Engine", "EngineConfig", "Prepared", "Result", "split_proposers"]
