"""Where the TUI's events come from: the real engine, or a script.

The app only ever sees ``edgespec.api.events`` objects coming out of
:meth:`EventSource.start`; everything model-related (loading, llama.cpp,
the proposer registry) stays behind this protocol. ``start`` is called from a
worker thread, so an implementation may block (load a model, decode) while the
UI keeps drawing; ``cancel`` is called from the UI thread and must only ask.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Protocol, Sequence, Union

from ..api.labels import AUTO, PLAIN
from ..errors import InvalidInputError
from ..api.events import Event, Finished, PrefillDone, RequestStarted, Step
from ..api.params import GenerationParams, SamplingParams
from ..config import EngineConfig
from ..proposers import REGISTRY, names, needs_model

from .metrics import fold_stats

Prompt = Union[str, list]  # plain text, or chat messages [{"role": ..., "content": ...}]

# The proposer names come from the one registry (edgespec.proposers); these are its
# pseudo-names for the plain path and the load-time plan.
NO_PROPOSER = PLAIN
AUTO_PROPOSER = AUTO


def default_proposer() -> str:
    """The engine's default (``EngineConfig.proposer``: auto, the planner's choice at load),
    the one ``edgespec generate``, ``Engine.load`` and ``edgespec serve`` start from."""
    return EngineConfig.proposer


@dataclass(frozen=True)
class Settings:
    """Everything the user chose in the settings panel, for one request.

    The defaults are the engine's (EngineConfig) and the request's (GenerationParams), read
    from those classes rather than copied, so the TUI opens on what every other adapter runs.
    """

    target: str  # registry name or path to a local .gguf
    proposer: str = EngineConfig.proposer
    draft: str | None = EngineConfig.draft  # registry name or path; for a proposer that needs one
    max_tokens: int = GenerationParams.max_tokens
    temperature: float = SamplingParams.temperature
    seed: int | None = SamplingParams.seed
    stop: tuple[str, ...] = GenerationParams.stop
    # None: the adaptive controller decides; N: always N
    max_draft: int | None = EngineConfig.max_draft
    exact: bool = EngineConfig.exact  # greedy output bitwise the plain path's (--exact)

    def params(self) -> GenerationParams:
        """The engine request, validated here so bad input fails before any model loads."""
        if self.max_draft is not None and self.max_draft < 1:
            raise InvalidInputError(f"draft length must be >= 1, or blank for adaptive "
                                    f"(got {self.max_draft})")
        return GenerationParams(
            max_tokens=self.max_tokens,
            stop=self.stop,
            sampling=SamplingParams(temperature=self.temperature, seed=self.seed),
        ).validate()

    @property
    def promises_text(self) -> bool:
        """Exact, greedy or seeded: its turns reuse only KV a prefill wrote (settle)."""
        return self.exact or SamplingParams(temperature=self.temperature,
                                            seed=self.seed).promises_text

    @property
    def label(self) -> str:
        return f"{_short(self.target)} + {self.how()}"

    def how(self, ran: str | None = None) -> str:
        """The proposer part of the label; with ``ran`` (the proposer a request reported in
        RequestStarted), "auto" also says what the plan chose: "auto→ngram"."""
        how = f"{self.proposer} {_short(self.draft)}" if needs_model(self.proposer) else self.proposer
        if self.proposer == AUTO_PROPOSER and ran and ran != AUTO_PROPOSER:
            how = f"{AUTO_PROPOSER}→{ran}"
        return f"{how}{' · exact' if self.exact else ''}"


def _short(name: str | None) -> str:
    """A registry name as is; a path by its file name."""
    return "" if name is None else name.replace("\\", "/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Choices:
    """What the pickers offer."""

    targets: tuple[str, ...]
    drafts: tuple[str, ...] = ()
    proposers: tuple[str, ...] = field(default_factory=lambda: proposer_names())
    default_target: str | None = None
    default_draft: str | None = None
    #: target -> the drafts known to share its tokenizer; a target not listed (a .gguf
    #: path, a scripted source) is offered every draft, and the engine checks at load
    compatible_drafts: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: target -> the drafts with another tokenizer pinned as bridge pairs in models.toml
    #: (a proposer with same_vocab=False, the vocabulary bridge, is offered only these)
    bridge_drafts: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: the drafts that can run now (pulled, or a local file); None: every draft is offered
    #: (a scripted source). A draft picked but not pulled would fail only at load time.
    runnable: frozenset[str] | None = field(default=None, hash=False)

    def drafts_for(self, target: str | None, same_vocab: bool = True) -> tuple[str, ...]:
        known = self.compatible_drafts if same_vocab else self.bridge_drafts
        if target is not None and target in known:
            out = known[target]
        elif target is not None and target in self.compatible_drafts:
            out = ()  # a registry target with no pinned bridge pair
        else:
            out = self.drafts
        return out if self.runnable is None else tuple(d for d in out if d in self.runnable)

    def proposer_options(self, target: str | None = None) -> list[tuple[str, tuple[str, str | None]]]:
        """(label, (proposer, draft)) pairs: a model proposer once per draft that fits ``target``."""
        out: list[tuple[str, tuple[str, str | None]]] = []
        for p in self.proposers:
            if needs_model(p):
                spec = REGISTRY[p]  # needs_model: registered
                if not spec.registry_drafts:
                    continue  # its draft is a head file (eagle3), not a model to pick
                out.extend((f"{p}: {d}", (p, d))
                           for d in self.drafts_for(target, spec.same_vocab))
            else:
                out.append((p, (p, None)))
        return out


class EventSource(Protocol):
    def models(self) -> Choices:
        """Picker contents; cheap, called on the UI thread."""
        ...

    def start(self, prompt: Prompt, settings: Settings) -> Iterator[Event]:
        """Run one request (on a worker thread). Raises EdgespecError for user errors."""
        ...

    def cancel(self) -> None:
        """Ask the running request to stop; its stream then ends with stop_reason 'cancelled'."""
        ...

    # optional: settle(settings, stop) -> int, idle-time work after a conversation turn (on
    # a worker thread, after the stream ended; ``stop()`` turns true when the next request
    # comes): the engine's exact-mode KV refresh. Returns the positions refreshed.


# --- scripted ----------------------------------------------------------------
Script = Union[Sequence[Union[Event, BaseException]],
               Callable[[Prompt, Settings], Iterable[Union[Event, BaseException]]]]


class ScriptedSource:
    """Replays a fixed event list (or one built per request) with a delay between events.

    An exception instance in the script is raised at that point, the way an
    engine error surfaces mid-stream. Cancelling stops the replay and ends the
    stream with a ``Finished(stop_reason="cancelled")`` whose stats cover what
    was replayed, as the engine does.
    """

    def __init__(self, script: Script, *, delay: float = 0.0, realtime: bool = False,
                 choices: Choices | None = None) -> None:
        self.script = script
        self.delay = delay
        self.realtime = realtime  # wait as long as the events' own times say, not `delay`
        self.choices = choices or Choices(targets=("scripted",), drafts=("scripted-draft",),
                                          default_target="scripted")
        self.requests: list[tuple[Prompt, Settings]] = []
        self.settled: list[Settings] = []
        self.settle_returns: list[int] = []
        self.settle_steps = 0
        self._cancel = threading.Event()

    def models(self) -> Choices:
        return self.choices

    def start(self, prompt: Prompt, settings: Settings) -> Iterator[Event]:
        settings.params()
        self._cancel.clear()
        self.requests.append((prompt, settings))
        return self._replay(prompt, settings)

    def _replay(self, prompt: Prompt, settings: Settings) -> Iterator[Event]:
        items = self.script(prompt, settings) if callable(self.script) else self.script
        seen: list[Event] = []
        clock = 0.0
        for item in items:
            wait = self.delay
            if self.realtime:
                at = _event_time(item)
                wait, clock = (max(at - clock, 0.0), at) if at is not None else (0.0, clock)
            if self._cancel.wait(wait) if wait > 0 else self._cancel.is_set():
                yield _cancelled(seen)
                return
            if isinstance(item, BaseException):
                raise item
            seen.append(item)
            yield item

    def cancel(self) -> None:
        self._cancel.set()

    def settle(self, settings: Settings, stop: Callable[[], bool]) -> int:
        """Records the call; ``settle_steps`` polls ``stop`` that many times, ``delay`` apart
        (an engine's refresh passes), then returns the positions it "refreshed"."""
        self.settled.append(settings)
        n = self.settle_steps
        for i in range(self.settle_steps):
            if stop():
                n = i
                break
            threading.Event().wait(self.delay or 0.01)
        self.settle_returns.append(16 * n)
        return 16 * n


def _event_time(ev: object) -> float | None:
    if isinstance(ev, Step):
        return ev.elapsed
    if isinstance(ev, PrefillDone):
        return ev.seconds
    return None


def _cancelled(seen: list[Event]) -> Finished:
    steps = [e for e in seen if isinstance(e, Step)]
    started = next((e for e in seen if isinstance(e, RequestStarted)), None)
    stats = fold_stats(seen)
    last = steps[-1].elapsed if steps else next(
        (e.seconds for e in seen if isinstance(e, PrefillDone)), 0.0)
    stats.finish("cancelled", last)
    return Finished(
        request_id=started.request_id if started else 0,
        text="".join(s.text for s in steps),
        tokens=tuple(t for s in steps for t in s.tokens),
        stop_reason="cancelled",
        stats=stats,
    )


# --- the real engine -----------------------------------------------------------
@dataclass
class EngineSource:
    """Drives ``edgespec.engine.Engine``; loads lazily, on the worker thread.

    One engine is kept loaded. The engine always carries the free proposers, so
    switching among none / ngram / suffix reuses it; another target, another
    draft model, "auto" (a load-time plan) or another draft length (the
    controller is built at load) loads a new one, after closing the old one so
    two models never sit in memory together.
    """

    # None: the engine's (4096, or what the model was trained for)
    n_ctx: int | None = EngineConfig.n_ctx
    threads: int | None = EngineConfig.threads
    #: Engine.load by default; tests pass a fake with the same signature
    loader: Callable[..., object] | None = None
    _engine: object | None = field(default=None, init=False, repr=False)
    _key: tuple | None = field(default=None, init=False, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def models(self) -> Choices:
        return registry_choices()

    def needs_load(self, settings: Settings) -> bool:
        return not self._serves(settings)

    def start(self, prompt: Prompt, settings: Settings) -> Iterator[Event]:
        params = settings.params()
        if isinstance(prompt, str) and not prompt.strip():
            raise InvalidInputError("the prompt is empty: type something first")
        self._cancel.clear()
        return self._run(prompt, settings, params)

    def _run(self, prompt: Prompt, settings: Settings, params: GenerationParams) -> Iterator[Event]:
        with self._lock:
            engine = self._ensure(settings)
        if self._cancel.is_set():
            return
        # "auto" was decided when the engine loaded: its default proposer is the plan's
        proposer = None if settings.proposer == AUTO_PROPOSER else settings.proposer
        forwarded = False
        # chat messages are a conversation: the engine reuses the KV of the turns so far
        stream = (engine.chat(prompt, params, proposer=proposer, exact=settings.exact)
                  if isinstance(prompt, list) else
                  engine.stream(prompt, params, proposer=proposer, exact=settings.exact))
        for ev in stream:
            # The engine clears its cancel flag when a request starts; a cancel that
            # came in before that would be lost, so forward it (once) from here.
            if self._cancel.is_set() and not forwarded:
                engine.cancel()
                forwarded = True
            yield ev

    def idle_note(self, stats) -> str | None:
        """Why the proposer the user picked stayed (mostly) off, in one plain line, priced on
        the loaded engine's curve (edgespec.engine.notes, the line `generate --stats` prints)."""
        from ..engine.notes import idle_reason  # deferred: the TUI starts before the engine

        engine = self._engine
        return idle_reason(engine, stats) if engine is not None else None

    def cancel(self) -> None:
        self._cancel.set()
        engine = self._engine
        if engine is not None:
            engine.cancel()

    def settle(self, settings: Settings, stop: Callable[[], bool]) -> int:
        """After a turn that promises its text (exact mode, greedy, seeded), prefill the
        last answer's KV again so the next turn reuses it (Engine.refresh_kv; such a turn
        reuses only what a prefill wrote); nothing to do for unseeded sampling."""
        engine = self._engine
        if engine is None or not settings.promises_text or not self._serves(settings):
            return 0  # a changed setting loads another engine on the next turn
        return engine.refresh_kv(stop=stop)

    def close(self) -> None:
        engine, self._engine, self._key = self._engine, None, None
        if engine is not None:
            engine.close()

    @staticmethod
    def _load_key(settings: Settings) -> tuple:
        p = settings.proposer
        model = needs_model(p)
        # exact mode runs a kernel configuration of its own (batch invariant), so ticking
        # "exact" loads an engine built for it
        return (settings.target, settings.draft if model else None,
                p if p == AUTO_PROPOSER or model else None, settings.max_draft, settings.exact)

    def _serves(self, settings: Settings) -> bool:
        if self._engine is None or self._key is None:
            return False
        if settings.proposer == AUTO_PROPOSER or needs_model(settings.proposer):
            return self._key == self._load_key(settings)
        loaded = getattr(self._engine, "proposers", {})
        return (self._key[0] == settings.target and self._key[3] == settings.max_draft
                and self._key[4] == settings.exact
                and (settings.proposer == NO_PROPOSER or settings.proposer in loaded))

    def _ensure(self, settings: Settings):
        if self._serves(settings):
            return self._engine
        self.close()
        load = self.loader
        if load is None:
            from ..engine.engine import Engine  # deferred: importing it loads llama.cpp
            load = Engine.load
        key = self._load_key(settings)
        fixed = {} if settings.max_draft is None else {"max_draft": settings.max_draft,
                                                         "adaptive": False}
        if settings.exact:
            fixed["exact"] = True
        self._engine = load(target=settings.target, draft=key[1], proposer=settings.proposer,
                            n_ctx=self.n_ctx, threads=self.threads, **fixed)
        self._key = key
        return self._engine


def registry_choices() -> Choices:
    """Picker contents from models.toml: targets first; drafts by role, and per target
    only those whose tokenizer is the target's (a draft must share the vocabulary), or,
    for the vocabulary bridge, the drafts pinned as its bridge pairs."""
    from ..registry import load_registry  # deferred: the registry is read when the pickers open

    registry = load_registry()
    models = dict(registry.models)
    roles = {name: getattr(spec, "role", "") for name, spec in models.items()}
    targets = tuple(sorted(models, key=lambda n: (roles[n] != "target", n)))
    drafts = tuple(sorted(models, key=lambda n: (roles[n] != "draft", n)))
    return Choices(
        targets=targets,
        drafts=drafts,
        proposers=proposer_names(),
        default_target=registry.default_target,
        default_draft=registry.default_draft,
        compatible_drafts={t: tuple(d for d in drafts if d != t and
                                    models[d].tokenizer == models[t].tokenizer)
                           for t in targets},
        bridge_drafts={t: tuple(p.draft for p in registry.pairs
                                if p.target == t and p.bridge_version and p.draft)
                       for t in targets},
        runnable=frozenset(n for n, spec in models.items() if _on_disk(spec)),
    )


def _on_disk(spec) -> bool:
    """A registry model the engine can load without a pull: its file is there."""
    from ..registry.store import spec_file  # deferred: with the registry, on first use
    try:
        return spec_file(spec).is_file()
    except OSError:  # an unreadable models directory: nothing is runnable from it
        return False


def proposer_names() -> tuple[str, ...]:
    """auto (the engine's default), the plain path and every registered proposer, as the
    pickers list them."""
    return tuple(names(plain=True, auto=True))
