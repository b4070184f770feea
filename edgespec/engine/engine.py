"""The engine: built once from an :class:`~edgespec.config.EngineConfig`, serves requests
as typed event streams (the loop itself is :mod:`edgespec.loop.request`).

    engine = Engine.from_config(EngineConfig(target="qwen-1.5b"))   # or Engine.load(...)
    for ev in engine.stream("prompt", GenerationParams(max_tokens=64)):
        ...   # RequestStarted, PrefillDone, Step..., Control..., Finished

Construction is a short builder over an ``ExitStack`` (edgespec.engine.build): whatever
fails releases what was already loaded, in reverse order, before the error reaches the
caller. Exact mode's policy is edgespec.engine.exactness, prompt rendering
edgespec.engine.prompt, the canary's events edgespec.engine.canary.
"""
from __future__ import annotations

import itertools
import threading
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping, Sequence

from .. import proposers as registry_of_proposers
from ..api.events import Event, Finished, TokenLogprob
from ..api.labels import AUTO, PLAIN
from ..api.params import GenerationParams
from ..api.stats import RequestStats, StatsSink
from ..control import ControlSettings, GoodputGuard, make_controller, reproducible
from ..decoding import sampling
from ..decoding.kvcache import PrefixCache, StateCache
from ..loop.request import Loop
from ..loop.state import Request
from ..decoding.textstream import TextAssembler
from ..errors import ContextOverflowError, InvalidInputError
from ..grammar.state import GrammarState
from ..identity import identity as release_identity
from ..proposers import BuildContext, Proposer
from ..runtime.context import Context
from ..runtime.kernel import KernelConfig
from ..runtime.model import Model
from . import build, exactness
from .build import DEFAULT_CTX, trusted_calibration
from .canary import canary_events
from ..config import EngineConfig, split_proposers
from .prompt import prompt_tokens


@dataclass
class Result:
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    stats: RequestStats
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Prepared:
    """A validated, tokenized request that has not run yet (see :meth:`Engine.prepare`)."""

    tokens: list[int]
    params: GenerationParams
    label: str
    control: ControlSettings
    reuse: bool
    traffic: str
    grammar: GrammarState | None
    exact: bool
    logits_processor: Callable | None = None  # plain path only (Request.logits_processor)

    def close(self) -> None:
        """Release what a request that never runs holds (its grammar)."""
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None


class Engine:
    """A loaded target (plus proposers) that serves requests.

    Thread safety: an engine runs one request at a time; concurrent calls to
    :meth:`stream`/:meth:`generate` from a GUI thread pool wait their turn.
    :meth:`cancel` may be called from any thread and ends the running request
    at the next step boundary with ``stop_reason == "cancelled"``.
    """

    def __init__(self, target: Model, ctx: Context, *, config: EngineConfig,
                 proposers: Mapping[str, Proposer], calibration=None,
                 sinks: Sequence[StatsSink] = (), plan=None, resources: ExitStack | None = None,
                 default_proposer: str | None = None, tree_seqs: Sequence[int] = ()) -> None:
        self.target, self.ctx = target, ctx
        # what the context runs: from_config always sets it; a hand-built engine's is the layout's
        self.config = config if config.kernel is not None else replace(config, kernel=config.layout())
        self.target_name = str(config.target)
        self.draft_name = str(config.draft) if config.draft else None
        self.proposers: dict[str, Proposer] = dict(proposers)
        self.default_proposer = default_proposer or (
            config.proposer if config.proposer != AUTO else "+".join(self.proposers) or PLAIN)
        self._check_loaded(self.default_proposer)
        self.exact = config.exact
        self.control = (config.control or ControlSettings()).validate()
        self._calibration = calibration
        self._exact_cap: int | None = None
        self.guard = GoodputGuard(self.control, plain_seconds_prior=(
            calibration.step_seconds if calibration is not None else None))
        self.sinks = list(sinks)
        self.plan = plan
        self._identity = None  # edgespec.identity.identity.Identity, computed on first use
        self._resources = resources or ExitStack()
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._ids = itertools.count(1)
        if config.chat_template is not None:  # --chat-template FILE: the target's own replaced
            target.use_chat_template(config.chat_template)
        self._template = target.chat_template()
        self._proposer_options: dict[str, dict] = {}  # what each loaded kind was built with
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
        self.controller_hook = None
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
            config = parts.config
            eng = cls(parts.target, parts.ctx, config=config, proposers=parts.proposers,
                      calibration=parts.calibration, sinks=sinks, plan=parts.plan,
                      default_proposer=config.proposer, tree_seqs=parts.tree_seqs)
            eng._proposer_options = parts.options
            if not parts.user_len and config.exact:
                # a default fixed length shrinks to what exact mode verifies; a user's is refused
                cap = max(1, eng.exact_max_draft())
                eng.control = replace(eng.control,
                                      draft_length=min(eng.control.draft_length, cap))
            eng.check_exact(eng.control, config.exact)
            eng._resources = stack.pop_all()
            return eng

    @classmethod
    def load(cls, target: str, draft: str | None = None, proposer: str = EngineConfig.proposer, *,
             n_ctx: int | None = None, threads: int | None = None, draft_len: int | None = None,
             proposer_options: dict | None = None, n_gpu_layers: int = 0,
             draft_gpu_layers: int = 0, adaptive: bool = True, control_settings=None,
             sinks: Sequence[StatsSink] = (), pull: bool = True,
             budget: str | int | None = None, exact: bool = EngineConfig.exact,
             kernel: KernelConfig | None = None, parallel: int = 1,
             kv_cache_ram: int | None = None, tree_width: int = 0) -> "Engine":
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
                           draft_len=draft_len, control=control_settings,
                           budget=budget, pull=pull, parallel=parallel, kv_cache_ram=kv_cache_ram,
                           tree_width=tree_width)
        return cls.from_config(cfg, sinks=sinks)

    def close(self) -> None:
        with self._lock:
            self._resources.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- exactness -------------------------------------------------------------------
    def exact_max_draft(self) -> int:
        """Most drafts a verify pass may hold in exact mode: the probed bitwise-invariant
        batch size of this device and kernel configuration, minus the pending token."""
        if self._exact_cap is None:
            self._exact_cap = exactness.max_drafts(self.target, self.config, self.ctx.n_threads)
        return self._exact_cap

    def check_exact(self, control, exact: bool, label: str | None = None):
        """Exact mode bounds the adaptive controller's drafts and refuses what it cannot
        verify bitwise (a longer fixed draft; any draft where no batch is invariant)."""
        if not exact:
            return control
        return exactness.bound(control, self.exact_max_draft(), self.config.layout(),
                               bool(split_proposers(label or self.default_proposer)))

    # --- requests -----------------------------------------------------------------
    def cancel(self) -> None:
        """End the running request at the next step boundary (thread-safe)."""
        self._cancel.set()

    def prompt_tokens(self, prompt: str | Sequence[dict], params: GenerationParams) -> list[int]:
        """Tokenize a prompt (a string or a list of chat messages) the way a request will."""
        return prompt_tokens(self.target, self._template, prompt, params)

    def generate(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                 proposer: str | None = None, control=None, exact: bool | None = None,
                 traffic: str = "default", reuse: bool | None = None) -> Result:
        fin = None
        for ev in self.stream(prompt, params, proposer=proposer, control=control, exact=exact,
                              traffic=traffic, reuse=reuse):
            if isinstance(ev, Finished):
                fin = ev
        assert fin is not None
        return Result(text=fin.text, tokens=fin.tokens, stop_reason=fin.stop_reason,
                      stats=fin.stats, logprobs=tuple(fin.logprobs))

    def chat(self, messages: Sequence[dict], params: GenerationParams | None = None,
             proposer: str | None = None, control=None, exact: bool | None = None,
             reuse: bool = True) -> Iterator[Event]:
        """Stream the assistant's answer to a conversation (``[{"role", "content"}, ...]``),
        reusing the KV of the longest prefix an earlier request left (the conversation so
        far). :class:`edgespec.chat.conversation.Conversation` keeps the history for you."""
        return self.stream(list(messages), replace(params or GenerationParams(), chat=True),
                           proposer=proposer, control=control, exact=exact, reuse=reuse)

    def stream(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
               proposer: str | None = None, control=None,
               exact: bool | None = None, reuse: bool | None = None,
               traffic: str = "default",
               logits_processor: Callable | None = None) -> Iterator[Event]:
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

    def prepare(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                proposer: str | None = None, control=None,
                exact: bool | None = None, reuse: bool | None = None,
                traffic: str = "default",
                logits_processor: Callable | None = None) -> "Prepared":
        """Validate and tokenize a request without running it (what :meth:`stream` and the
        serving scheduler admit); every user error is raised here."""
        params = (params or GenerationParams()).validate()
        exact = self.exact if exact is None else exact
        label = proposer or self.default_proposer
        if logits_processor is not None:
            label = PLAIN  # a Python callback on logits runs on the plain path only
        self._check_loaded(label)
        control = self.check_exact((control or self.control).validate(), exact, label)
        prompt_tokens = self.prompt_tokens(prompt, params)
        if not prompt_tokens:
            raise InvalidInputError("the prompt tokenized to nothing")
        if len(prompt_tokens) + 1 > self.ctx.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt_tokens)} tokens but the context holds {self.ctx.n_ctx}; "
                "raise --ctx (up to the model's trained context) or shorten the prompt")
        constraint = params.constraint()
        # opened here, so a grammar this vocabulary cannot start is refused before generation
        state = GrammarState.open(constraint, self.target) if constraint is not None else None
        return Prepared(prompt_tokens, params, label, control,
                        self.reuse if reuse is None else reuse, traffic, state, exact,
                        logits_processor)

    def add_proposer(self, name: str, proposer: Proposer) -> None:
        """Make another proposer (e.g. the same kind with other knobs) available to requests."""
        if name in (PLAIN, AUTO) or "+" in name or not name or name in self.proposers:
            raise InvalidInputError(f"a proposer named {name!r} is already loaded or reserved")
        self.proposers[name] = proposer
        self._identity = None  # the feature matrix changed
        self._resources.callback(proposer.close)

    def remove_proposer(self, name: str) -> None:
        """Close and drop a proposer added with :meth:`add_proposer` (its model is freed now,
        not when the engine closes; closing twice is harmless)."""
        if name not in self.proposers or name == self.default_proposer:
            raise InvalidInputError(f"proposer {name!r} is not an added proposer of this engine")
        self.proposers.pop(name).close()
        self._identity = None

    def clone_proposer(self, name: str, as_name: str, **overrides) -> str:
        """Load a fresh instance of loaded proposer ``name`` (the options the engine gave it,
        ``overrides`` on top) under ``as_name``. A benchmark gives each configuration its own
        instances, so a proposer that learns across requests (suffix trees, n-gram
        statistics) never sees another configuration's answer to the same prompt."""
        if name not in self.proposers:
            raise InvalidInputError(f"proposer {name!r} is not loaded in this engine")
        kind = getattr(self.proposers[name], "name", name)
        spec = registry_of_proposers.spec(kind)
        if spec.costly:
            raise InvalidInputError(f"the {kind} proposer holds a model and cannot be cloned")
        options = {**self._proposer_options.get(kind, {}), **overrides}
        self.add_proposer(as_name, spec.build(BuildContext(), options))
        return as_name

    @property
    def identity(self):
        """This engine's release identity (:mod:`edgespec.identity`): every component its
        speed and output depend on, and their hash. Computed once (about a second the
        first time a model is seen: its vocabulary is digested, then cached)."""
        if self._identity is None:
            self._identity = release_identity.collect(self)
        return self._identity

    def calibration(self, threads: int | None = None):
        """This device's verify-cost curve for the target (measured once, cached on disk)."""
        if self._calibration is None:
            self._calibration = trusted_calibration(self.target, threads or self.ctx.n_threads,
                                                    self.config.kernel)
            self.guard.plain_seconds_prior = self._calibration.step_seconds
        return self._calibration

    def _check_loaded(self, label: str) -> None:
        missing = [n for n in split_proposers(label) if n not in self.proposers]
        if missing:
            raise InvalidInputError(f"proposer {missing[0]!r} is not loaded in this engine "
                                    f"(loaded: {', '.join([PLAIN, *self.proposers])})")

    def _run(self, prep: "Prepared") -> Iterator[Event]:
        with self._lock:
            self._cancel.clear()
            req, route = self.open_request(prep)
            try:
                yield from self._canary_events(self._loop.serve(req), req, route, prep.traffic)
            finally:
                req.close()

    def open_request(self, prep: "Prepared") -> tuple[Request, object]:
        """The :class:`Request` a prepared request runs as (its controller built, the
        canary's routing decided), and that route. The caller runs it and closes it."""
        params, control, traffic = prep.params, prep.control, prep.traffic
        route = self.guard.route(traffic, prep.label)  # the canary decision (plain or as asked)
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
            names = split_proposers(label)
            req.proposers = {n: self.proposers[n] for n in names}
            req.costly = frozenset(n for n in names if self.proposers[n].costly)
            if names:
                cal = self.calibration() if control.adaptive else None
                token_seconds = {n: getattr(self.proposers[n], "seconds_per_token", 0.0)
                                 for n in req.costly}
                built = dict(settings=replace(control, proposer=names[0]) if not control.adaptive
                             else control, proposers={n: n in req.costly for n in names},
                             calibration=cal, slice=traffic,
                             token_seconds={n: s for n, s in token_seconds.items() if s} or None,
                             # a greedy or seeded request's passes follow neither the clock
                             # nor others (the replay builds its controller the same way)
                             deterministic=reproducible(params.sampling.greedy,
                                                        params.sampling.seed, prep.exact))
                req.controller = make_controller(
                    built["settings"], built["proposers"], cal, self.guard, traffic,
                    built["token_seconds"], deterministic=built["deterministic"])
                if self.controller_hook is not None:
                    req.controller = self.controller_hook(req, req.controller, built)
                req.max_draft = (control.max_draft if control.adaptive
                                 else control.draft_length)
        except BaseException:
            req.close()
            raise
        return req, route

    def _canary_events(self, events: Iterator[Event], req: Request, route,
                       traffic: str) -> Iterator[Event]:
        for ev in events:
            yield from self.canary(ev, req, route, traffic)

    def canary(self, ev: Event, req: Request, route, traffic: str) -> list[Event]:
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
    def refresh_kv(self, exact: bool | None = None, stop=None) -> int:
        """After a turn, in exact mode: prefill the answer's positions again so the next
        turn reuses them (PrefixCache.refresh); a no-op otherwise, where they are reused
        as they are. Call it once the answer is shown; :meth:`cancel` (or ``stop()``
        turning true) ends it between chunks. Returns the positions refreshed."""
        if not (self.exact if exact is None else exact):
            return 0
        with self._lock:
            self._cancel.clear()
            return self.kv_cache.refresh(
                lambda: self._cancel.is_set() or (stop is not None and bool(stop())))


__all__ = ["DEFAULT_CTX", "Engine", "EngineConfig", "Result", "split_proposers"]
