"""The engine: built once from an :class:`~edgespec.engine.config.EngineConfig`, serves requests
as typed event streams (the loop itself is :mod:`edgespec.decoding.request`).

    engine = Engine.from_config(EngineConfig(target="qwen-1.5b"))   # or Engine.load(...)
    for ev in engine.stream("prompt", GenerationParams(max_tokens=64)):
        ...   # RequestStarted, PrefillDone, Step..., Control..., Finished

Construction is a short builder over an ``ExitStack``: whatever fails (a corrupt
draft, an incompatible vocabulary, a context that does not fit) releases what was
already loaded, in reverse order, before the error reaches the caller.
"""
from __future__ import annotations

import itertools
import warnings
import threading
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Sequence

from .. import planner, registry
from ..calibration import calibration
from ..calibration.calibration import Calibration, prior_step_seconds
from ..control import ControlSettings, GoodputGuard, make_controller
from ..decoding.kvcache import PrefixCache, StateCache
from ..identity import identity as release_identity
from ..planner import calibration_trust, kernels, usable_shape
from ..registry import bridges
from ..runtime import backend
from ..runtime.rpc import probe_all
from ..chat import chat
from .. import proposers as registry_of_proposers
from ..decoding import sampling
from ..api.labels import AUTO, PLAIN
from .config import EngineConfig
from ..runtime.kernel import KernelConfig
from ..errors import ContextOverflowError, EdgespecError, InvalidInputError, UnsupportedError
from ..api.events import Control, Event, Finished, RequestStarted, TokenLogprob
from ..grammar.state import GrammarState
from ..api.params import GenerationParams
from ..proposers import BuildContext, Proposer
from ..decoding.request import Loop, Request
from ..api.stats import RequestStats, StatsSink
from ..decoding.textstream import TextAssembler

DEFAULT_CTX = 4096


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

    def close(self) -> None:
        """Release what a request that never runs holds (its grammar)."""
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None


def split_proposers(label: str) -> tuple[str, ...]:
    """``"ngram+suffix"`` -> ("ngram", "suffix"); ``"none"`` -> ()."""
    if label == PLAIN:
        return ()
    return tuple(p for p in label.split("+") if p)


class Engine:
    """A loaded target (plus proposers) that serves requests.

    Thread safety: an engine runs one request at a time; concurrent calls to
    :meth:`stream`/:meth:`generate` from a GUI thread pool wait their turn.
    :meth:`cancel` may be called from any thread and ends the running request
    at the next step boundary with ``stop_reason == "cancelled"``.
    """

    def __init__(self, target: backend.Model, ctx: backend.Context, *, config: EngineConfig,
                 proposers: Mapping[str, Proposer], calibration=None,
                 sinks: Sequence[StatsSink] = (), plan=None, resources: ExitStack | None = None,
                 default_proposer: str | None = None) -> None:
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
        #: make_controller was given. The bench's recorder (edgespec.replay.record) wraps
        #: the controller this way to keep every decision for an offline replay.
        self.controller_hook = None
        self._loop = Loop(target, ctx, target_name=self.target_name, draft_name=self.draft_name,
                          sinks=self.sinks, cancelled=self._cancel, kv=self.kv_cache)

    # --- construction -----------------------------------------------------------
    @classmethod
    def from_config(cls, config: EngineConfig, sinks: Sequence[StatsSink] = ()) -> "Engine":
        """Load what ``config`` names (after the planner resolves ``proposer="auto"``)."""
        config = config.validate()
        # the default mode measures its kernel configuration once the target is loaded
        # (planner.kernels); exact mode and an asked configuration keep theirs
        pick_kernel = config.kernel is None and not config.exact
        plan = None
        if config.proposer == AUTO:
            plan = planner.plan_engine(config)
            config = plan.config
        elif config.rpc:
            config, _ = planner.resolve_rpc(config)
        with ExitStack() as stack:
            tmodel = _load(config.target, config, config.n_gpu_layers, stack, rpc=config.rpc)
            tpath = tmodel.path
            tsha = calibration.model_identity(tpath)["sha256"]  # digested once: the kernel cache and proposers
            config = replace(config, kernel=_default_kernel(tmodel, tsha, config, pick_kernel,
                                                            plan.kernel if plan else None))
            n_ctx = config.n_ctx or min(DEFAULT_CTX, tmodel.n_ctx_train)
            if n_ctx > tmodel.n_ctx_train:
                raise InvalidInputError(f"--ctx {n_ctx} exceeds what {tpath.name} was trained for "
                                        f"({tmodel.n_ctx_train})")
            k = config.kernel
            ctx = tmodel.new_context(n_ctx=n_ctx, n_batch=k.n_batch, n_threads=config.threads,
                                     n_seq_max=config.parallel + config.tree_width,
                                     full_seqs=config.parallel,
                                     # several requests: exact mode keeps each one's KV
                                     # cells in order (backend.new_context says why)
                                     kv_unified=not (config.exact and config.parallel > 1),
                                     flash_attn=int(k.flash_attn), type_k=k.kv_ggml_type,
                                     type_v=k.kv_ggml_type)
            stack.callback(ctx.close)
            dmodel = None
            if config.draft is not None:
                dmodel = _load(config.draft, config, config.draft_gpu_layers, stack)
                # same vocabulary, unless the draft is only bridged (its pair pin is checked then)
                registry_of_proposers.check_draft(tmodel, dmodel, config.proposer)
            user_len = config.control is not None or config.draft_len is not None
            options = _proposer_options(config)
            layout = config.layout()
            loaded = _build_proposers(config, options, stack, BuildContext(
                target=tmodel, draft_model=dmodel, n_ctx=n_ctx, threads=config.threads,
                kernel=config.kernel,
                target_digest=tsha, check_bridge_pair=bridges.check_pair,
                # a proposer that derives its own draft (self) loads it as a draft is loaded
                load_model=lambda path: backend.load_model(
                    path, n_gpu_layers=config.draft_gpu_layers, use_extra_bufts=layout.repack,
                    use_mmap=layout.use_mmap)))
            default = config.proposer  # never "auto" here: the plan resolved it
            config = replace(config, n_ctx=n_ctx,
                             control=(config.control or
                                      _control_from_flags(config, plan, default)).validate())
            cal = _calibration(tmodel, config.threads, k) if config.control.adaptive else None
            eng = cls(tmodel, ctx, config=config, proposers=loaded, calibration=cal, sinks=sinks,
                      plan=plan, default_proposer=default)
            eng._proposer_options = options
            # the sequences past the request slots are the draft trees' scratch branches
            eng._loop.tree_seqs = tuple(range(config.parallel,
                                              config.parallel + config.tree_width))
            if not user_len and config.exact:
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
        if self._exact_cap is None and not self.config.layout().exact_capable:
            self._exact_cap = 0  # an F16 KV cache or no flash attention: never bitwise at length
        if self._exact_cap is None:
            self._exact_cap = int(calibration.exact_cap(self.target, self.config.kernel,
                                                        self.ctx.n_threads))
        return self._exact_cap

    def check_exact(self, control, exact: bool, label: str | None = None):
        """Exact mode bounds the adaptive controller's drafts and refuses what it cannot
        verify bitwise (a longer fixed draft; any draft where no batch is invariant)."""
        if not exact:
            return control
        cap = self.exact_max_draft()
        k = self.config.layout()
        if cap == 0 and split_proposers(label or self.default_proposer) and not k.exact_capable:
            raise UnsupportedError(
                f"this engine runs the default mode's kernel configuration (KV {k.kv_type}, flash "
                f"attention {'on' if k.flash_attn else 'off'}), whose verify passes are not bitwise "
                "single-token decoding: exact requests need an engine built for them (--exact, "
                "Engine.load(..., exact=True)), or --proposer none")
        if cap == 0 and split_proposers(label or self.default_proposer):
            raise UnsupportedError(
                "exact mode cannot speculate here: no verify batch on this device gives logits "
                "bitwise equal to single-token decoding (edgespec plan shows the probe); use "
                "--proposer none, or drop --exact (the default is lossless)")
        if split_proposers(label or self.default_proposer) and not control.adaptive \
                and control.draft_length > cap:
            raise UnsupportedError(
                f"a fixed draft length of {control.draft_length} cannot be verified exactly: on "
                f"this device llama.cpp's logits match the plain path only for verify passes of "
                f"up to {cap} drafts; use --draft-len {cap} or less, adaptive control, or drop "
                "--exact (the default is lossless; greedy output may then differ at near-ties)")
        if cap == 0:
            return control
        return replace(control, max_draft=min(control.max_draft, cap),
                       min_draft=min(control.min_draft, cap))

    # --- requests -----------------------------------------------------------------
    def cancel(self) -> None:
        """End the running request at the next step boundary (thread-safe)."""
        self._cancel.set()

    def prompt_tokens(self, prompt: str | Sequence[dict], params: GenerationParams) -> list[int]:
        """Tokenize a prompt (a string or a list of chat messages) the way a request will."""
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidInputError(f"the prompt is not valid UTF-8 text ({e.reason} at "
                                        f"character {e.start})") from None
            if not prompt.strip():
                raise InvalidInputError("the prompt is empty")
        if params.chat or not isinstance(prompt, str):
            if self._template is None:
                raise UnsupportedError(
                    f"{self.target.path.name} has no chat template; use --raw to send the prompt as "
                    "plain text")
            msgs = chat.normalise_messages(prompt, params.system)
            for m in msgs:
                try:
                    m["content"].encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidInputError("a chat message is not valid UTF-8 text") from None
            bos = self.target.detokenize([self.target.bos], special=True).decode("utf-8", "replace")
            eos = self.target.detokenize([self.target.eos], special=True).decode("utf-8", "replace")
            text = chat.render(self._template, msgs, bos_token=bos, eos_token=eos,
                               extra=params.template_vars)
            # The template writes BOS itself where the model wants one.
            return self.target.tokenize(text, add_special=False, parse_special=True)
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

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

    def create_chat_completion(self, messages: Sequence[dict], **kwargs):
        """``llama_cpp.Llama.create_chat_completion``: its arguments, its ``chat.completion``
        dict (or with ``stream=True`` its chunks), over :meth:`stream` (edgespec.apps)."""
        from ..apps.completions import create_chat_completion  # deferred: apps builds on the engine; these are its llama-cpp-python names
        return create_chat_completion(self, messages, **kwargs)

    def create_completion(self, prompt: str, **kwargs):
        """``llama_cpp.Llama.create_completion``: its arguments, its ``text_completion``
        dict (or with ``stream=True`` its chunks), over :meth:`stream` (edgespec.apps)."""
        from ..apps.completions import create_completion  # deferred: apps builds on the engine; these are its llama-cpp-python names
        return create_completion(self, prompt, **kwargs)

    def stream(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
               proposer: str | None = None, control=None,
               exact: bool | None = None, reuse: bool | None = None,
               traffic: str = "default") -> Iterator[Event]:
        """Run one request, yielding RequestStarted, PrefillDone, Step..., Control..., Finished.

        ``proposer`` (a loaded name, several joined by ``+``, or ``"none"``), ``control``
        (a :class:`edgespec.control.ControlSettings`) and ``exact`` override the engine's
        defaults for this request only, so a benchmark can compare the plain path, fixed
        draft lengths and adaptive control on one loaded model. ``reuse`` (default: the
        engine's ``reuse``) starts from the longest token prefix of the prompt that the KV
        cache already holds and prefills only the rest (edgespec.decoding.kvcache). ``traffic`` names
        the request's traffic slice: the goodput guard and the canary judge per slice.
        Everything is validated before this returns (the events come when iterated).
        """
        return self._run(self.prepare(prompt, params, proposer=proposer, control=control,
                                      exact=exact, reuse=reuse, traffic=traffic))

    def prepare(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                proposer: str | None = None, control=None,
                exact: bool | None = None, reuse: bool | None = None,
                traffic: str = "default") -> "Prepared":
        """Validate and tokenize a request without running it (what :meth:`stream` and the
        serving scheduler admit); every user error is raised here."""
        params = (params or GenerationParams()).validate()
        exact = self.exact if exact is None else exact
        label = proposer or self.default_proposer
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
                        self.reuse if reuse is None else reuse, traffic, state, exact)

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
            self._calibration = _calibration(self.target, threads or self.ctx.n_threads,
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
                      exact=prep.exact)
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
                             token_seconds={n: s for n, s in token_seconds.items() if s} or None)
                req.controller = make_controller(
                    built["settings"], built["proposers"], cal, self.guard, traffic,
                    built["token_seconds"])
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
        """The canary's part of a request's event: a Control event saying why it runs the
        plain path (or probes) after RequestStarted, and at Finished its decode rate
        reported to the guard, with a Control event when that switches speculation off or
        on for the slice."""
        out: list[Event] = []
        if isinstance(ev, Finished):
            rec = self.guard.observe_request(traffic, route, ev.stats.decode_tokens,
                                             ev.stats.decode_seconds)
            if rec is not None:
                req.stats.observe_control(rec.kind)
                out.append(Control(req.id, rec.kind, rec.reason, proposer=rec.proposer))
        out.append(ev)
        if isinstance(ev, RequestStarted) and route.reason:
            kind = "canary" if route.arm == "canary" else f"canary_{route.arm}"
            req.stats.observe_control(kind)
            out.append(Control(req.id, kind, route.reason, proposer=route.label))
        return out

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


# --- builder steps -------------------------------------------------------------------
def _load(name: str, config: EngineConfig, gpu_layers: int, stack: ExitStack,
          rpc: tuple[str, ...] = ()) -> backend.Model:
    """Resolve (pull), check the header, load with the engine's kernel configuration (the
    last ``gpu_layers`` layers on the ``rpc`` servers, probed again first: llama.cpp aborts
    on one that went away); the stack frees it if a later step fails."""
    path = registry.resolve(name, pull=config.pull)
    registry.check_gguf(path)
    split = {}
    if rpc:
        probe_all(rpc)
        split = {"rpc": rpc, "tensor_split": config.tensor_split}
    layout = config.layout()
    model = backend.load_model(path, n_gpu_layers=gpu_layers, use_extra_bufts=layout.repack,
                               use_mmap=layout.use_mmap, **split)
    stack.callback(model.close)
    return model


def _default_kernel(model: backend.Model, sha: str, config: EngineConfig, pick: bool,
                    planned: KernelConfig | None) -> KernelConfig:
    """The kernel configuration the context is made with. ``pick`` (the default mode, no
    configuration asked): the fastest candidate measured on this device, measured now when
    the engine calibrates anyway (adaptive control) and nothing is cached, else the cached
    choice or llama.cpp's CPU default (planner.kernels). A plan that had to quantize the KV
    cache to fit the budget (``planned`` differs from what it was offered) is kept."""
    if not pick:
        return config.layout()
    repack = bool(getattr(model, "use_extra_bufts", True))
    offered = kernels.cached(model.path, n_threads=config.threads, sha256=sha, repack=repack).kernel
    if planned is not None and (planned.kv_type, planned.flash_attn) != (offered.kv_type, offered.flash_attn):
        return planned
    # a split across RPC servers runs what this machine measured for itself: timing the
    # candidates over the network would measure the network, and the split's output must
    # equal the local run's
    local = not getattr(model, "placement", "")
    if local and (config.control.adaptive if config.control is not None else config.adaptive):
        offered = kernels.load_or_measure(model, n_threads=config.threads, sha256=sha).kernel
    base = planned or config.layout()
    return replace(base, kv_type=offered.kv_type, flash_attn=offered.flash_attn)


def _control_from_flags(config: EngineConfig, plan, label: str):
    """ControlSettings from --adaptive/--draft-len: with adaptive control a user's
    --draft-len is the longest draft allowed; without, the length of every draft."""
    if config.draft_len is not None:
        return ControlSettings(adaptive=config.adaptive, draft_length=config.draft_len,
                               **({"max_draft": config.draft_len} if config.adaptive else {}))
    length = _planned_draft_len(plan) or (4 if "draft" in split_proposers(label) else 3)
    return ControlSettings(adaptive=config.adaptive, draft_length=length)


def _planned_draft_len(plan) -> int | None:
    dl = getattr(plan, "draft_len", None) if plan is not None else None
    if not dl:
        return None
    return int(dl[1] if isinstance(dl, (tuple, list)) else dl)


def _proposer_options(config: EngineConfig) -> dict[str, dict]:
    options = {name: dict(o) for name, o in config.proposer_options.items()}
    if (config.control.adaptive if config.control is not None else config.adaptive):
        # The controller cuts drafts itself; a suffix draft capped at its match length
        # would leave long copied spans on the table.
        options.setdefault("suffix", {}).setdefault("factor", 3.0)
    return options


def _build_proposers(config: EngineConfig, options: Mapping[str, dict], stack: ExitStack,
                     ctx: BuildContext) -> dict[str, Proposer]:
    """Every free proposer (cheap), plus the draft model's when one was loaded. A free one
    that cannot be built (no native library) is an error only if it was asked for."""
    wanted = set(split_proposers(config.proposer)) if config.proposer != AUTO else set()
    out: dict[str, Proposer] = {}
    for name, spec in registry_of_proposers.REGISTRY.items():
        if "draft_model" in spec.needs and ctx.draft_model is None:
            continue
        if spec.own_model and name not in wanted \
                and name not in config.proposer_options:
            continue  # it derives a model of its own (self): built only when asked for
        try:
            p = spec.build(ctx, options.get(name, {}))
        except InvalidInputError:
            if name in wanted:
                raise
            continue
        stack.callback(p.close)
        out[name] = p
    return out


def _calibration(model: backend.Model, threads: int | None, kernel: KernelConfig):
    """The measured verify-cost curve: trusted, or jittery but quiet (its shape is still the
    device's); a noise curve is measured again on a quiet machine; the CPU prior stands in
    only when neither gives a usable one."""
    cal = calibration.load_or_measure(model.path, n_threads=threads, model=model,
                                      n_gpu_layers=model.n_gpu_layers, kernel=kernel)
    expected = prior_step_seconds(model.size_bytes)
    ok, why = calibration_trust(cal, expected)
    ok = ok or usable_shape(cal, expected)
    if not ok and calibration.machine_busy() <= calibration.BUSY_LIMIT / 2:
        # A cached curve that is noise stays wrong for every later load unless it is
        # measured again; the prior it would otherwise fall back to is another CPU's
        # curve, far flatter than a compute-bound one (a 16-token pass priced at 3.4
        # steps where this CPU takes 8), which sends the controller into long drafts.
        # A merely jittery one (a VM's) keeps the device's shape and is used as it is.
        warnings.warn(f"the calibration of {model.path} is not trusted ({why}); the machine "
                      "is quiet now, measuring it again", calibration.CalibrationWarning,
                      stacklevel=2)
        cal = calibration.load_or_measure(model.path, n_threads=threads, model=model,
                                          n_gpu_layers=model.n_gpu_layers, kernel=kernel,
                                          force=True)
        ok, why = calibration_trust(cal, expected)
        ok = ok or usable_shape(cal, expected)
    if not ok:
        warnings.warn(f"the calibration of {model.path} is not usable ({why}); pricing drafts "
                      "with the CPU prior until `edgespec plan --recalibrate` on a quiet "
                      "machine", calibration.CalibrationWarning, stacklevel=2)
        cal = Calibration.prior_cpu(step_seconds=expected)
    return cal


__all__ = ["DEFAULT_CTX", "Engine", "EngineConfig", "Result", "split_proposers"]
