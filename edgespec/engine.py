"""The speculative engine: load once, serve many requests as typed event streams.

One request is one pass of this loop (all state in a ``_Request``):

    prefill the prompt once -> the target's first token is *pending*
    repeat:
        the controller picks a proposer (or none) and a draft length k
        the proposer drafts d1..dk
        ONE target pass over [pending, d1..dk] with logits at every position
        verification accepts a prefix d1..dn and yields the target's own token y
        rejected positions are trimmed from the target's KV cache (and the draft's)
        d1..dn, y are emitted; y becomes pending

With k = 0 this is exactly the plain path, so ``--proposer none`` and the
speculative modes share every line except the proposal.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from . import backend, chat, sampling, verify
from .errors import ContextOverflowError, EdgespecError, InvalidInputError, UnsupportedError
from .events import Control, Event, Finished, PrefillDone, RequestStarted, Step, TokenLogprob
from .params import GenerationParams
from .proposers import EMPTY_DRAFT, Proposer, free_proposer
from .stats import RequestStats, StatsSink
from .textstream import TextAssembler

DEFAULT_CTX = 4096
PLAIN = "none"
#: In exact mode a verify pass holds at most this many drafts (plus the pending token):
#: llama.cpp's CPU kernels (repacked weights, flash attention, Q8_0 KV) give a position
#: bitwise the same logits alone or in a batch of up to 3 tokens (docs/parity.md).
EXACT_MAX_DRAFT = 2


@dataclass
class Result:
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    stats: RequestStats
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class _Request:
    """Everything one request owns, so that several can later share one context."""

    id: int
    params: GenerationParams
    proposer_name: str
    tokens: list[int]  # prompt + generated, as the target has them (pending included)
    n_prompt: int
    seq_id: int = 0
    n_past: int = 0  # positions of `tokens` already in the target's KV cache
    session: object | None = None
    controller: object | None = None
    control: object | None = None  # ControlSettings for this request
    rng: np.random.Generator | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    text: TextAssembler = field(default_factory=TextAssembler)
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    t0: float = 0.0
    stop_reason: str = ""


class Engine:
    """A loaded target (plus proposers) that serves requests.

    Thread safety: an engine runs one request at a time; concurrent calls to
    :meth:`stream`/:meth:`generate` from a GUI thread pool wait their turn.
    :meth:`cancel` may be called from any thread and ends the running request
    at the next step boundary with ``stop_reason == "cancelled"``.
    """

    def __init__(self, target: backend.Model, ctx: backend.Context, *, target_name: str,
                 proposers: dict[str, Proposer], default_proposer: str, control=None,
                 calibration=None, draft_name: str | None = None,
                 sinks: Sequence[StatsSink] = (), exact: bool = True) -> None:
        from .control import ControlSettings, GoodputGuard

        if default_proposer != PLAIN and default_proposer not in proposers:
            raise EdgespecError(f"proposer {default_proposer!r} is not loaded")
        self.target = target
        self.ctx = ctx
        self.target_name = target_name
        self.draft_name = draft_name
        self.proposers = proposers
        self.default_proposer = default_proposer
        self.exact = exact
        self.control = (control or ControlSettings(adaptive=False)).validate()
        self._calibration = calibration
        self.guard = GoodputGuard(self.control, plain_seconds_prior=(
            calibration.step_seconds if calibration is not None else None))
        self.sinks = list(sinks)
        self.plan = None  # set by load() when --proposer auto consulted the planner
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._ids = itertools.count(1)
        self._template = target.chat_template()

    # --- construction -----------------------------------------------------------
    @classmethod
    def load(cls, target: str, draft: str | None = None, proposer: str = "auto", *,
             n_ctx: int | None = None, threads: int | None = None, draft_len: int | None = None,
             proposer_options: dict | None = None, n_gpu_layers: int = 0,
             draft_gpu_layers: int = 0, adaptive: bool = True, control_settings=None,
             sinks: Sequence[StatsSink] = (), pull: bool = True,
             budget: str | int | None = None, exact: bool = True) -> "Engine":
        """Load a target (registry name or .gguf path) and the proposers a request may use.

        The free proposers (ngram, suffix) are always loaded; a draft model only
        when ``draft`` is given (or the planner picks one for ``proposer="auto"``).

        ``exact`` (the default) keeps every verify pass within the batch sizes whose
        logits are bitwise those of the plain path, so greedy speculative output is the
        plain output token for token; ``exact=False`` allows longer drafts whose verify
        logits may differ in the last bits, which can flip a near-tie.
        """
        from . import registry

        options = {name: dict(o) for name, o in (proposer_options or {}).items()}
        if adaptive:
            # The controller cuts drafts itself; a suffix draft capped at its match length
            # would leave long copied spans on the table.
            options.setdefault("suffix", {}).setdefault("factor", 3.0)
        plan = None
        kv_type = None
        n_batch = 512
        if proposer == "auto":
            from . import planner
            plan = planner.plan_for(target, draft, ctx=n_ctx, n_threads=threads, budget=budget,
                                    kv_type="q8_0" if exact else None)
            proposer = plan.proposer
            draft = plan.draft if proposer == "draft" else None
            n_gpu_layers, draft_gpu_layers = plan.n_gpu_layers, plan.draft_gpu_layers
            kv_type = plan.kv_ggml_type
            n_batch = plan.n_batch
        if proposer == "draft" and draft is None:
            raise InvalidInputError("--proposer draft needs --draft NAME|PATH (a model that shares "
                                    "the target's vocabulary, see `edgespec models list`)")
        if proposer not in (PLAIN, "draft") and proposer not in _free_names():
            raise InvalidInputError(f"unknown proposer {proposer!r}; choose one of "
                                    f"auto, none, draft, {', '.join(_free_names())}")
        target_path = registry.resolve(target, pull=pull)
        registry.check_gguf(target_path)
        tmodel = backend.load_model(target_path, n_gpu_layers=n_gpu_layers)
        if n_ctx is None:
            n_ctx = plan.n_ctx if plan is not None and getattr(plan, "n_ctx", None) else \
                min(DEFAULT_CTX, tmodel.n_ctx_train)
        if n_ctx > tmodel.n_ctx_train:
            raise InvalidInputError(f"--ctx {n_ctx} exceeds what {target_path.name} was trained for "
                                    f"({tmodel.n_ctx_train})")
        ctx = tmodel.new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, type_k=kv_type,
                                 type_v=kv_type)
        proposers: dict[str, Proposer] = {}
        for name in _free_names():
            try:
                proposers[name] = free_proposer(name, **options.get(name, {}))
            except ImportError as e:
                if name == proposer:
                    raise EdgespecError(f"the {name} proposer needs the native library, which is not "
                                        f"built ({e}); run `make install`") from None
        draft_name = None
        if draft is not None:
            from .proposers.draft import DraftModelProposer, check_compatible
            dpath = registry.resolve(draft, pull=pull)
            registry.check_gguf(dpath)
            dmodel = backend.load_model(dpath, n_gpu_layers=draft_gpu_layers)
            check_compatible(tmodel, dmodel)
            proposers["draft"] = DraftModelProposer(dmodel, n_ctx=n_ctx, n_threads=threads)
            draft_name = str(draft)
        if control_settings is None:
            from .control import ControlSettings
            length = draft_len if draft_len is not None else _default_draft_len(plan, proposer)
            if exact and draft_len is None:
                length = min(length, EXACT_MAX_DRAFT)
            control_settings = ControlSettings(
                adaptive=adaptive, draft_length=length,
                # with adaptive control a user's --draft-len is the longest draft allowed
                **({"max_draft": draft_len} if draft_len is not None and adaptive else {}))
        control_settings = control_settings.validate()
        if exact and not control_settings.adaptive and control_settings.draft_length > EXACT_MAX_DRAFT:
            tmodel.close()
            raise UnsupportedError(
                f"--draft-len {control_settings.draft_length} with --no-adaptive cannot be verified "
                f"exactly (at most {EXACT_MAX_DRAFT} drafts a pass keep llama.cpp's logits equal to "
                "the plain path's); lower it, or add --no-exact to accept near-tie differences")
        cal = _calibration(tmodel, threads) if control_settings.adaptive else None
        eng = cls(tmodel, ctx, target_name=str(target), proposers=proposers,
                  default_proposer=proposer, control=control_settings, calibration=cal,
                  draft_name=draft_name, sinks=sinks, exact=exact)
        eng.plan = plan
        return eng

    def close(self) -> None:
        with self._lock:
            for p in self.proposers.values():
                p.close()
            self.ctx.close()
            self.target.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
            text = chat.render(self._template, msgs, bos_token=bos, eos_token=eos)
            # The template writes BOS itself where the model wants one.
            return self.target.tokenize(text, add_special=False, parse_special=True)
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

    def generate(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                 proposer: str | None = None, control=None, exact: bool | None = None) -> Result:
        fin = None
        for ev in self.stream(prompt, params, proposer=proposer, control=control, exact=exact):
            if isinstance(ev, Finished):
                fin = ev
        assert fin is not None
        return Result(text=fin.text, tokens=fin.tokens, stop_reason=fin.stop_reason,
                      stats=fin.stats, logprobs=tuple(fin.logprobs))

    def stream(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
               proposer: str | None = None, control=None,
               exact: bool | None = None) -> Iterator[Event]:
        """Run one request, yielding RequestStarted, PrefillDone, Step..., Control..., Finished.

        ``proposer`` and ``control`` (a :class:`edgespec.control.ControlSettings`) override
        the engine's defaults for this request only, so a benchmark can compare the plain
        path, fixed draft lengths and adaptive control on one loaded model; so does
        ``exact`` (see :meth:`load`).
        """
        if params.grammar is not None:
            # Never silently unconstrained: until the grammar state is advanced over accepted
            # tokens only (and drafts it forbids are cut), constrained decoding is refused.
            raise UnsupportedError(
                "grammar-constrained decoding (GBNF / JSON schema) is not supported by edgespec "
                "yet, on the plain or the speculative path; run without --grammar, or use "
                "llama.cpp's own grammar sampling")
        exact = self.exact if exact is None else exact
        control = self._within_exact((control or self.control).validate(), exact)
        params = (params or GenerationParams()).validate()
        name = proposer or self.default_proposer
        if name != PLAIN and name not in self.proposers:
            raise InvalidInputError(f"proposer {name!r} is not loaded in this engine "
                                    f"(loaded: {', '.join([PLAIN, *self.proposers])})")
        prompt_tokens = self.prompt_tokens(prompt, params)
        if not prompt_tokens:
            raise InvalidInputError("the prompt tokenized to nothing")
        if len(prompt_tokens) + 1 > self.ctx.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt_tokens)} tokens but the context holds {self.ctx.n_ctx}; "
                "raise --ctx (up to the model's trained context) or shorten the prompt")
        return self._run(prompt_tokens, params, name, control)

    def _within_exact(self, control, exact: bool):
        """Exact mode bounds the adaptive controller's drafts and refuses a longer fixed one."""
        if not exact:
            return control
        if not control.adaptive and control.draft_length > EXACT_MAX_DRAFT:
            raise UnsupportedError(
                f"a fixed draft length of {control.draft_length} cannot be verified exactly: "
                f"llama.cpp's logits match the plain path only for verify passes of up to "
                f"{EXACT_MAX_DRAFT} drafts; use --draft-len {EXACT_MAX_DRAFT} or less, adaptive "
                "control, or --no-exact (greedy output may then differ at near-ties)")
        from dataclasses import replace
        return replace(control, max_draft=min(control.max_draft, EXACT_MAX_DRAFT),
                       min_draft=min(control.min_draft, EXACT_MAX_DRAFT))

    def add_proposer(self, name: str, proposer: Proposer) -> None:
        """Make another proposer (e.g. the same kind with other knobs) available to requests."""
        if name == PLAIN or name in self.proposers:
            raise InvalidInputError(f"a proposer named {name!r} is already loaded")
        self.proposers[name] = proposer

    def calibration(self, threads: int | None = None):
        """This device's verify-cost curve for the target (measured once, cached on disk)."""
        if self._calibration is None:
            self._calibration = _calibration(self.target, threads or self.ctx.n_threads)
            self.guard.plain_seconds_prior = self._calibration.step_seconds
        return self._calibration

    def _controller(self, proposer_name: str, control):
        from .control import engine_controller_factory
        cal = self.calibration() if control.adaptive else None
        return engine_controller_factory(control, cal, self.guard)(proposer_name, self.proposers)

    def _run(self, prompt_tokens: list[int], params: GenerationParams, name: str,
             control) -> Iterator[Event]:
        with self._lock:
            self._cancel.clear()
            req = _Request(id=next(self._ids), params=params, proposer_name=name,
                           tokens=list(prompt_tokens), n_prompt=len(prompt_tokens),
                           text=TextAssembler(params.stop), control=control)
            req.stats.proposer = name
            if not params.sampling.greedy:
                req.rng = sampling.make_rng(params.sampling.seed)
            try:
                yield from self._serve(req)
            finally:
                if req.session is not None:
                    req.session.close(completed=req.stop_reason not in ("", "cancelled"))

    def _serve(self, req: _Request) -> Iterator[Event]:
        p = req.params
        req.t0 = time.perf_counter()
        yield RequestStarted(req.id, req.n_prompt, req.proposer_name, self.target_name,
                             self.draft_name if req.proposer_name == "draft" else None)
        self.ctx.clear()
        logits = self.ctx.decode(req.tokens, 0, req.seq_id, logits="last")
        req.n_past = len(req.tokens)
        t_prefill = time.perf_counter() - req.t0
        req.stats.observe_prefill(req.n_prompt, t_prefill)
        yield PrefillDone(req.id, req.n_prompt, t_prefill)
        if req.proposer_name != PLAIN:
            req.session = self.proposers[req.proposer_name].open(req.tokens, p.sampling)
            req.controller = self._controller(req.proposer_name, req.control)

        first = self._choose_plain(req, logits[0])
        step = self._emit(req, [first], [logits[0]], n_acc=0, proposer=None, drafted=0,
                          draft_s=0.0, verify_s=0.0)
        if req.session is not None:
            req.session.accept([first], 0)
        yield step

        while not req.stop_reason:
            if self._cancel.is_set():
                req.stop_reason = "cancelled"
                break
            remaining = p.max_tokens - len(req.generated)
            room = self.ctx.n_ctx - req.n_past - 1  # positions left after the pending token
            if room < 0:
                req.stop_reason = "context"
                break
            k, use = 0, None
            if req.controller is not None:
                use, k = req.controller.decide(req)
                for kind, reason in req.controller.drain_events():
                    req.stats.observe_control(kind)
                    yield Control(req.id, kind, reason, draft_length=k, proposer=use)
                k = max(0, min(k, remaining - 1, room))
            t_a = time.perf_counter()
            draft = req.session.propose(k) if (use is not None and k > 0) else EMPTY_DRAFT
            t_b = time.perf_counter()
            batch = [req.tokens[-1], *draft.tokens]
            rows = self.ctx.decode(batch, req.n_past, req.seq_id,
                                   logits="all" if draft.tokens else "last")
            n_acc, nxt = self._verify(req, draft, rows)
            req.n_past += 1 + n_acc
            if n_acc < len(draft.tokens):
                self.ctx.trim(req.seq_id, req.n_past)
            t_c = time.perf_counter()
            new = [*draft.tokens[:n_acc], nxt]
            if req.session is not None:
                req.session.accept(new, n_acc)
            if req.controller is not None:
                req.controller.observe(use if draft.tokens else None, len(draft.tokens), n_acc,
                                       t_b - t_a, t_c - t_b, draft)
            yield self._emit(req, new, rows[: n_acc + 1], n_acc=n_acc,
                             proposer=use if draft.tokens else None, drafted=len(draft.tokens),
                             draft_s=t_b - t_a, verify_s=t_c - t_b)

        tail = req.text.flush()
        total = time.perf_counter() - req.t0
        req.stats.finish(req.stop_reason, total)
        for sink in self.sinks:
            sink.emit(req.stats)
        if tail:
            yield Step(req.id, (), tail, (), None, 0, 0, 0.0, 0.0, total)
        yield Finished(req.id, req.text.text, tuple(req.generated), req.stop_reason, req.stats,
                       logprobs=tuple(req.logprobs))

    # --- verification ----------------------------------------------------------------
    def _choose_plain(self, req: _Request, row: np.ndarray) -> int:
        s = req.params.sampling
        if s.greedy:
            return sampling.greedy_token(row, req.tokens, s)
        return sampling.sample(sampling.distribution(row, req.tokens, s), req.rng)

    def _verify(self, req: _Request, draft, rows: np.ndarray) -> tuple[int, int]:
        s = req.params.sampling
        d = draft.tokens
        if not d:
            return 0, self._choose_plain(req, rows[0])
        if s.greedy:
            # Row i predicts the token after d[:i]; stop at the first disagreement.
            ys = []
            for i in range(len(d) + 1):
                ys.append(sampling.greedy_token(rows[i], [*req.tokens, *d[:i]], s))
                if i < len(d) and ys[i] != d[i]:
                    break
            return verify.verify_greedy(d, ys)
        return verify.verify_sampling(d, draft.probs, _TargetRows(rows, req.tokens, d, s), req.rng)

    # --- emission -----------------------------------------------------------------------
    def _emit(self, req: _Request, new: list[int], rows, *, n_acc: int, proposer: str | None,
              drafted: int, draft_s: float, verify_s: float) -> Step:
        """Append verified tokens one by one, honouring EOG, stop strings and max_tokens."""
        p = req.params
        out_tokens: list[int] = []
        origins: list[str] = []
        lps: list[TokenLogprob] = []
        pieces: list[str] = []
        for i, tok in enumerate(new):
            if self.target.is_eog(tok):
                req.stop_reason = "eos"
                break
            req.tokens.append(tok)
            req.generated.append(tok)
            out_tokens.append(tok)
            origins.append("draft" if i < n_acc else "target")
            if p.logprobs is not None:
                lp = _logprob(rows[i], tok, p.logprobs)
                lps.append(lp)
                req.logprobs.append(lp)
            pieces.append(req.text.push(self.target.token_piece(tok)))
            if req.text.stopped:
                req.stop_reason = "stop"
                break
            if len(req.generated) >= p.max_tokens:
                req.stop_reason = "length"
                break
        # The pending token is the last of `new`; it is in `tokens` but not yet in the KV cache
        # (it was emitted above, or the request ended).
        elapsed = time.perf_counter() - req.t0
        req.stats.observe_step(proposer=proposer, drafted=drafted, accepted=n_acc,
                               emitted=len(out_tokens), draft_seconds=draft_s,
                               verify_seconds=verify_s, elapsed=elapsed)
        return Step(req.id, tuple(out_tokens), "".join(pieces), tuple(origins), proposer, drafted,
                    n_acc, draft_s, verify_s, elapsed, logprobs=tuple(lps), pieces=tuple(pieces))


class _TargetRows:
    """The target's distributions at each draft position, computed only when read
    (verification stops at the first rejection)."""

    def __init__(self, rows: np.ndarray, history: list[int], draft: Sequence[int], params) -> None:
        self.rows, self.history, self.draft, self.params = rows, history, draft, params

    def __len__(self) -> int:
        return len(self.draft) + 1

    def __getitem__(self, i: int) -> np.ndarray:
        return sampling.distribution(self.rows[i], [*self.history, *self.draft[:i]], self.params)


def _logprob(row: np.ndarray, tok: int, top_n: int) -> TokenLogprob:
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.argsort(-x[idx])]
        top = tuple((int(i), float(x[i] - lse)) for i in idx)
    return TokenLogprob(int(tok), float(x[tok] - lse), top)


def _free_names() -> list[str]:
    from .proposers import free_names
    return free_names()


def _calibration(model: backend.Model, threads: int | None):
    """The measured verify-cost curve, or the documented CPU prior when the measurement is
    not trustworthy (timed on an oversubscribed machine)."""
    from . import calibration
    from .calibration import Calibration, prior_step_seconds
    from .planner import calibration_trust

    cal = calibration.load_or_measure(model.path, n_threads=threads, model=model,
                                      n_gpu_layers=model.n_gpu_layers)
    expected = prior_step_seconds(model.size_bytes)
    if not calibration_trust(cal, expected)[0]:
        cal = Calibration.prior_cpu(step_seconds=expected)
    return cal


def _default_draft_len(plan, proposer: str) -> int:
    if plan is not None and getattr(plan, "draft_len", None):
        dl = plan.draft_len
        return int(dl[1] if isinstance(dl, (tuple, list)) else dl)
    return 4 if proposer == "draft" else 3
