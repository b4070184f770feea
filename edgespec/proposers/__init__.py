"""The proposer registry: the one place that knows which proposers exist.

A :class:`ProposerSpec` says what a proposer is (its name, whether it costs a
model, what it needs, its options and their types) and how to build it. The
CLI, the planner, the TUI, the bench and the engine all read :data:`REGISTRY`;
no other module lists proposer names. The plain path is :data:`PLAIN`.

    spec("suffix").check_options({"factor": "3"})   # typed, validated, or InvalidInputError
    p = spec("suffix").build(BuildContext(...), {"factor": 3.0})
"""
from __future__ import annotations

import difflib

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..api.labels import AUTO, PLAIN
from ..errors import InvalidInputError
from ..runtime.kernel import KernelConfig
from .base import EMPTY_DRAFT, Draft, Proposer, ProposerSession

if TYPE_CHECKING:
    from ..runtime.context import Context
    from ..runtime.model import Model

#: a proposer's options, typed by its :class:`Option` specs (int, float, bool or str values)
Options = dict[str, Any]

__all__ = ["AUTO", "BuildContext", "check_draft", "check_label", "Draft", "EMPTY_DRAFT", "Option", "PLAIN", "Proposer",
           "ProposerSession", "ProposerSpec", "REGISTRY", "free_names", "names", "needs_model",
           "spec"]


@dataclass(frozen=True)
class Option:
    """One knob of a proposer: its type (int, float, bool or str), default and meaning."""

    type: type
    default: Any
    help: str

    def coerce(self, proposer: str, key: str, value: Any) -> Any:
        if self.type is bool and isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise InvalidInputError(f"{proposer} option {key}={value!r} is not a boolean "
                                    "(use true or false)")
        try:
            if self.type is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return self.type(value)
        except (TypeError, ValueError):
            raise InvalidInputError(f"{proposer} option {key}={value!r} is not a "
                                    f"{self.type.__name__} ({self.help})") from None


@dataclass(frozen=True)
class BuildContext:
    """What a factory may use: the loaded target, the loaded draft model (if any), sizes."""

    target: Model | None = None
    draft_model: Model | None = None
    n_ctx: int = 4096
    threads: int | None = None
    target_digest: str | None = None  # sha256 of the target file, keys persisted statistics
    kernel: KernelConfig | None = None  # the engine's (a draft model's context follows it)
    #: loads a GGUF file as the engine loads a draft (for a proposer deriving its own model)
    load_model: Callable[[Path], Model] | None = None
    #: the registry's pin check of a cross-tokenizer pair (target, draft, bridge version) ->
    #: its PairSpec or UnqualifiedBridgeError (edgespec.registry.bridge_pins.check_pair); handed
    #: in by the engine so that the proposers need not import the model registry
    check_bridge_pair: Callable[[Model, Model, str], object] | None = None
    #: the target's context (the mtp and eagle3 proposers read its hidden states from the
    #: verify pass)
    target_ctx: Context | None = None


@dataclass(frozen=True)
class ProposerSpec:
    name: str
    description: str
    #: True when proposing costs real compute (a draft model): the controller weighs its time
    costly: bool
    #: what it needs besides the target: "draft_model" (a GGUF sharing the vocabulary),
    #: "native" (the C library built by `make install`)
    needs: tuple[str, ...]
    options: Mapping[str, Option] = field(default_factory=dict)
    factory: Callable[[BuildContext, Options], Proposer] | None = None
    #: False for a draft model with its own tokenizer (bridged): the engine then skips the
    #: same-vocabulary check (:func:`check_draft`)
    same_vocab: bool = True
    #: True for a proposer not yet measured to pay (lookahead): built only when asked for,
    #: and never weighed by auto, like a proposer deriving its own model
    opt_in: bool = False
    #: False when its --draft is no model of its own but a head for the target (EAGLE-3):
    #: pickers then offer no registry model for it (the user names the head's file)
    registry_drafts: bool = True
    #: True for a proposer drafting with the target's own NextN (MTP) layers: auto weighs
    #: it on a target whose header has some (the planner counts their weights and KV, the
    #: calibration measures their cost per draft token), and never on any other
    nextn_head: bool = False

    def weighable(self, nextn_layers: int = 0) -> bool:
        """Whether auto weighs it for a target with ``nextn_layers`` NextN layers."""
        return nextn_layers > 0 if self.nextn_head else not self.asked_only

    @property
    def own_model(self) -> bool:
        """It costs a model it derives itself (self), not one the user loads: built only
        when asked for, and never weighed by auto."""
        return self.costly and not self.needs

    @property
    def asked_only(self) -> bool:
        """Built only when a request names it, and never weighed by auto."""
        return self.own_model or self.opt_in

    def check_options(self, raw: Mapping[str, Any]) -> Options:
        """Typed options, or an error naming the unknown key and the known ones."""
        out: Options = {}
        for key, value in raw.items():
            opt = self.options.get(key)
            if opt is None:
                known = ", ".join(sorted(self.options)) or "none"
                raise InvalidInputError(f"unknown {self.name} option {key!r}; known: {known}")
            out[key] = opt.coerce(self.name, key, value)
        return out

    def build(self, ctx: BuildContext, options: Mapping[str, Any] | None = None) -> Proposer:
        opts = self.check_options(options or {})
        if "draft_model" in self.needs and ctx.draft_model is None:
            raise InvalidInputError(f"the {self.name} proposer needs a draft model (--draft NAME|PATH)")
        if self.factory is None:
            raise InvalidInputError(f"the {self.name} proposer has no factory to build it")
        try:
            return self.factory(ctx, opts)
        except ImportError as e:
            raise InvalidInputError(f"the {self.name} proposer needs the native library, which is "
                                    f"not built ({e}); run `make install`") from None


def _ngram(ctx: BuildContext, opts: Options) -> Proposer:
    # deferred, as in each factory: reading the registry builds nothing, and without the
    # native library only the proposers that need it are refused (build() says so)
    from .ngram import NgramProposer
    # Statistics of past generations only mean something under the same vocabulary:
    # they persist keyed by the target's digest.
    opts = {**opts, "stats_path": opts.get("stats_path") or None}
    if opts["stats_path"] is None and ctx.target_digest:
        opts["model_digest"] = ctx.target_digest
    return NgramProposer(**opts)


def _suffix(ctx: BuildContext, opts: Options) -> Proposer:
    from .suffix import SuffixProposer  # deferred: see _ngram
    return SuffixProposer(**opts)


def _realign(ctx: BuildContext, opts: Options) -> Proposer:
    from .realign import RealignProposer  # deferred: see _ngram
    return RealignProposer(**opts)


def _lookahead(ctx: BuildContext, opts: Options) -> Proposer:
    from .lookahead import LookaheadProposer  # deferred: see _ngram
    return LookaheadProposer(**opts)


def _loaded(model: Model | None, what: str, proposer: str) -> Model:
    """The model a factory needs (build() refuses a missing draft model before this)."""
    if model is None:
        raise InvalidInputError(f"the {proposer} proposer needs {what}")
    return model


def _not_eagle3(draft: Model, proposer: str) -> Model:
    """An EAGLE-3 head is no standalone model: only the eagle3 proposer can run it."""
    if draft.meta("general.architecture") == "eagle3":
        raise InvalidInputError(f"draft {draft.path.name} is an EAGLE-3 head, not a model the "
                                f"{proposer} proposer can run; use --proposer eagle3")
    return draft


def _draft(ctx: BuildContext, opts: Options) -> Proposer:
    from .draft import DraftModelProposer  # deferred: see _ngram
    from .vocab_check import vocab_mismatch  # deferred: see _ngram
    draft = _not_eagle3(_loaded(ctx.draft_model, "a draft model (--draft NAME|PATH)", "draft"),
                        "draft")
    if ctx.target is not None and vocab_mismatch(ctx.target, draft) is not None:
        # loaded for the bridge: this draft's token ids mean nothing to the target
        raise InvalidInputError(f"draft {draft.path.name} does not share the target's "
                                "vocabulary; use --proposer bridge")
    return DraftModelProposer(draft, n_ctx=ctx.n_ctx, n_threads=ctx.threads,
                              kernel=ctx.kernel, **opts,
                              target_vocab=ctx.target.n_vocab if ctx.target is not None else None)


def _self(ctx: BuildContext, opts: Options) -> Proposer:
    from .self_draft_choice import layers_for  # deferred: see _ngram
    from .self_draft import SelfDraftProposer, ensure_self_draft  # deferred: see _ngram
    if ctx.target is None or ctx.load_model is None:
        raise InvalidInputError("the self proposer drafts with the loaded target's layers; "
                                "it cannot be built without one")
    # layers=... when given, else the choice `edgespec self-draft` measured, else a default
    layers = layers_for(ctx.target_digest, int(ctx.target.n_layer), opts.get("layers", ""))
    path = ensure_self_draft(Path(ctx.target.path), ctx.target_digest or "nodigest", layers)
    model = ctx.load_model(path)
    try:
        return SelfDraftProposer(model, layers, n_ctx=ctx.n_ctx, n_threads=ctx.threads,
                                 n_batch=opts.get("n_batch", 0), kernel=ctx.kernel,
                                 target_vocab=ctx.target.n_vocab)
    except BaseException:
        model.close()
        raise


def _mtp(ctx: BuildContext, opts: Options) -> Proposer:
    from .mtp import build_mtp  # deferred: see _ngram
    return build_mtp(ctx.target, ctx.target_ctx, ctx.kernel, max_draft=opts.get("max_draft", 3))


def _eagle3(ctx: BuildContext, opts: Options) -> Proposer:
    from .eagle3 import build_eagle3  # deferred: see _ngram
    return build_eagle3(ctx.target, ctx.target_ctx, ctx.draft_model, ctx.kernel,
                        max_draft=opts.get("max_draft", 3))


def _bridge(ctx: BuildContext, opts: Options) -> Proposer:
    from .bridged_draft import BridgedDraftProposer  # deferred: see _ngram
    return BridgedDraftProposer(_not_eagle3(_loaded(ctx.draft_model,
                                                    "a draft model (--draft NAME|PATH)",
                                                    "bridge"), "bridge"),
                                _loaded(ctx.target, "the loaded target", "bridge"), n_ctx=ctx.n_ctx,
                                n_threads=ctx.threads, kernel=ctx.kernel,
                                pin_check=ctx.check_bridge_pair, **opts)


REGISTRY: dict[str, ProposerSpec] = {s.name: s for s in (
    ProposerSpec(
        "ngram", "prompt lookup: what followed the latest earlier occurrence of the context's tail",
        costly=False, needs=("native",), factory=_ngram, options={
            "min_n": Option(int, 2, "shortest n-gram order counted and matched"),
            "max_n": Option(int, 6, "longest n-gram order (at most 8)"),
            "max_draft": Option(int, 10, "most tokens per draft"),
            "max_bytes": Option(int, 64 << 20, "memory cap of each request's statistics, bytes"),
            "min_count": Option(int, 1, "samples an n-gram needs behind the first draft token"),
            "count_step": Option(int, 0, "more samples needed per later draft position"),
            "min_share": Option(float, 0.5, "share the best continuation needs at position 1"),
            "share_step": Option(float, 0.1, "share bar added per later draft position"),
            "dynamic_count": Option(int, 2, "samples needed from past generations' statistics"),
            "dynamic_share": Option(float, 0.66, "share needed from past generations' statistics"),
            "use_dynamic": Option(bool, True, "learn from past generations across requests"),
            "dynamic_bytes": Option(int, 32 << 20, "memory cap of past generations' statistics"),
            "statistics": Option(bool, True, "off: plain prompt lookup (the baseline)"),
            "stats_path": Option(str, "", "file for past generations' statistics "
                                 "(default: keyed by the target's digest)"),
        }),
    ProposerSpec(
        "suffix", "suffix decoding: the most frequent continuation in per-request and global "
        "suffix trees", costly=False, needs=("native",), factory=_suffix, options={
            "factor": Option(float, 1.0, "draft length per matched token"),
            "offset": Option(float, 0.0, "draft length added to factor x match length"),
            "min_token_prob": Option(float, 0.1, "stop before a token rarer than this"),
            "max_draft": Option(int, 16, "most tokens per draft"),
            "max_depth": Option(int, 64, "longest suffix indexed"),
            "cache_bytes": Option(int, 64 << 20, "global tree memory cap, bytes"),
            "use_global": Option(bool, True, "learn across requests"),
        }),
    ProposerSpec(
        "realign", "copy tracking: follows the text an edit copies and re-enters it after a "
        "changed token (opt-in: auto does not weigh it until measured)", costly=False,
        needs=("native",), factory=_realign, opt_in=True, options={
            "min_match": Option(int, 3, "tail tokens that must match to follow or re-enter a copy"),
            "window": Option(int, 64, "how far past the broken-off position re-entry looks"),
            "substitution": Option(int, 3, "tokens after a change drafted as a same-length "
                                   "replacement (0: off)"),
            "max_draft": Option(int, 16, "most tokens per draft"),
        }),
    ProposerSpec(
        "lookahead", "lookahead decoding: an n-gram pool fed by Jacobi iterations on the verify "
        "pass's rows (opt-in: auto does not weigh it until measured)", costly=False, needs=(),
        factory=_lookahead, opt_in=True, options={
            "n": Option(int, 5, "n-gram size N (candidates are N-1 tokens), 2 to 8"),
            "window": Option(int, 15, "lookahead window W: guessed positions kept, 1 to 64"),
            "pool": Option(int, 15, "candidates kept per first token G, 1 to 64"),
            "max_draft": Option(int, 15, "most tokens per draft"),
            "max_keys": Option(int, 1 << 16, "memory cap of the pool, in first tokens"),
        }),
    ProposerSpec(
        "draft", "a GGUF draft model sharing the target's vocabulary", costly=True,
        needs=("draft_model",), factory=_draft, options={
            "n_batch": Option(int, 0, "draft context batch size (0: the engine's)"),
        }),
    ProposerSpec(
        "self", "self-speculation: a draft made of a subset of the target's own layers (no "
        "second model; built from the target and cached)", costly=True, needs=(),
        factory=_self, options={
            "layers": Option(str, "", "the kept layers: first:N, skip:A-B or a list such as "
                             "0-5,22-27 (default: the measured choice, `edgespec self-draft`)"),
            "n_batch": Option(int, 0, "draft context batch size (0: the engine's)"),
        }),
    ProposerSpec(
        "mtp", "the target's own multi-token-prediction (NextN) head, for GGUFs that carry "
        "one (no second model; its KV follows the target's verify pass)", costly=True,
        needs=(), factory=_mtp, nextn_head=True, options={
            "max_draft": Option(int, 3, "most tokens per draft"),
        }),
    ProposerSpec(
        "eagle3", "an EAGLE-3 head (--draft FILE, arch eagle3) fed by three of the target's "
        "layers from its verify pass (opt-in: auto does not weigh it until measured)",
        costly=True, needs=("draft_model",), factory=_eagle3, opt_in=True,
        registry_drafts=False, options={
            "max_draft": Option(int, 3, "most tokens per draft"),
        }),
    ProposerSpec(
        "bridge", "a GGUF draft model with another tokenizer, through the vocabulary bridge "
        "(point-mass proposals; pairs pinned in models.toml)", costly=True,
        needs=("draft_model",), factory=_bridge, same_vocab=False, options={
            "n_batch": Option(int, 0, "draft context batch size (0: the engine's)"),
            "max_ratio": Option(float, 2.0, "most draft tokens decoded per target token asked"),
        }),
)}


def spec(name: str) -> ProposerSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        known = [AUTO, PLAIN, *REGISTRY]
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise InvalidInputError(f"unknown proposer {name!r}; {hint}choose one of "
                                f"{', '.join(known)}") from None


def check_label(label: str) -> str:
    """A request label: ``auto``, ``none``, or registered names joined by ``+``; an unknown
    name raises with the list of known ones."""
    if label not in (AUTO, PLAIN):
        for name in label.split("+"):
            spec(name)
    return label


def check_draft(target: Model, draft: Model, label: str) -> None:
    """A loaded draft model must share the target's vocabulary, unless every model-drafting
    proposer in ``label`` bridges vocabularies (``same_vocab=False``)."""
    drafting = [REGISTRY[n] for n in label.split("+") if needs_model(n)]
    if drafting and not any(s.same_vocab for s in drafting):
        return
    from .draft import check_compatible  # deferred: see _ngram
    check_compatible(target, draft)


def names(plain: bool = False, auto: bool = False) -> list[str]:
    """Registered proposer names, optionally with the ``auto`` and ``none`` pseudo-names."""
    return [*([AUTO] if auto else []), *([PLAIN] if plain else []), *REGISTRY]


def free_names() -> list[str]:
    """Proposers that need no model: cheap enough to load them all in every engine (an
    opt-in one is loaded only when asked for)."""
    return [n for n, s in REGISTRY.items() if not s.costly and not s.opt_in]


def needs_model(name: str) -> bool:
    return name in REGISTRY and "draft_model" in REGISTRY[name].needs


def free_proposer(name: str, **options: Any) -> Proposer:
    """Build a model-free proposer by name with its options (validated by its spec)."""
    s = spec(name)
    if s.costly:
        raise InvalidInputError(f"the {name} proposer needs a model; build it through the engine")
    return s.build(BuildContext(), options)
