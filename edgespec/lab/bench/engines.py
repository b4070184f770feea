"""How a matrix's engine configurations map onto one loaded engine (and, for exact ones, a
second engine with exact mode's batch-invariant kernel): the Engine.load arguments, the
proposer name each configuration requests with, its control knobs, and its own instances
of the free proposers it consults.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...api.labels import AUTO
from ...errors import EdgespecError, InvalidInputError
from ...proposers import REGISTRY, free_proposer
from .matrix import BASELINE, ConfigSpec, Matrix
from . import oracle as oracles
from dataclasses import replace

# Knobs that configure the engine as a whole (Engine.load arguments), not one proposer.
# Knobs of the speculation controller: per request (Engine.stream(control=...)), so fixed
# draft lengths and adaptive control compare on one loaded model. Besides these three, the
# controller's tunables (TUNABLE_KNOBS) can be A/B-tested against the default in one run.
TUNABLE_KNOBS = ("margin", "extend_margin", "window", "min_draft", "position_calibration", "ramp",
                 "floor_early", "policy")
CONTROL_KNOBS = ("max_draft", "adaptive", "exact", *TUNABLE_KNOBS)

@dataclass(frozen=True)
class EnginePlan:
    """Engine.load arguments and the proposer name each configuration requests with."""

    proposer_options: dict[str, dict]  # for the engine's own instance of each proposer
    extra: dict[str, tuple[str, dict]]  # label -> (proposer, options) loaded under the label
    request_name: dict[str, str | None]  # label -> stream(proposer=...); None: the engine's default
    control: dict[str, dict] = field(default_factory=dict)  # label -> CONTROL_KNOBS it sets
    auto: bool = False  # load the engine as `--proposer auto` (the planner picks its default)
    # a second engine with exact mode's batch-invariant kernel for the exact configurations
    # (the default engine runs the fastest kernel, on which exact mode cannot speculate)
    exact: bool = False
    oracles: dict[str, str] = field(default_factory=dict)  # label -> oracle kind (bench.oracle)


def plan_engine(configs: Sequence[ConfigSpec]) -> EnginePlan:
    """The first configuration of each proposer uses the engine's instance (with its knobs);
    every later one gets its own instance under its label, so a proposer that learns across
    requests (the suffix tree) never sees another configuration's answer to the same prompt."""
    options: dict[str, dict] = {}
    extra: dict[str, tuple[str, dict]] = {}
    names: dict[str, str] = {}
    control: dict[str, dict] = {}
    found: dict[str, str] = {}
    for c in configs:
        if c.kind != "engine":
            continue
        own = {k: v for k, v in c.knob_dict.items() if k not in CONTROL_KNOBS}
        ctl = {k: v for k, v in c.knob_dict.items() if k in CONTROL_KNOBS}
        if c.proposer in oracles.KINDS:
            if own or set(ctl) - {"max_draft"} or c.exact:
                raise InvalidInputError(f"{c.label}: an oracle takes only max_draft (the longest "
                                        "draft it offers; it cuts each draft on the cost curve)")
            # the oracle cuts its own drafts: the controller verifies what it offers
            control[c.label] = {"adaptive": False, "max_draft": oracles.MAX_DRAFT, **ctl}
            found[c.label] = c.proposer
            names[c.label] = c.label
            continue
        if ctl:
            control[c.label] = ctl
        if c.proposer == BASELINE:
            if set(c.knob_dict) - {"exact"}:
                raise InvalidInputError("the plain path ('none') takes no knobs but exact")
            names[c.label] = BASELINE
        elif c.proposer == AUTO or "+" in c.proposer:
            # the engine's default ("auto") or several free proposers consulted together
            if own:
                raise InvalidInputError(f"{c.label}: a combined configuration takes only control "
                                        f"knobs ({', '.join(CONTROL_KNOBS)}); set proposer "
                                        "options on a single-proposer configuration")
            names[c.label] = None if c.proposer == AUTO else c.proposer
            # an opt-in free proposer named in the combination is built only when asked for
            for part in c.proposer.split("+"):
                if part in REGISTRY and REGISTRY[part].opt_in and not REGISTRY[part].costly:
                    options.setdefault(part, {})
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

    # self, lookahead: the engine builds an asked-only proposer only when its options name it
    return EnginePlan(proposer_options={k: v for k, v in options.items()
                                        if v or (k in REGISTRY and REGISTRY[k].asked_only)},
                      extra=extra, request_name=names, control=control,
                      auto=any(c.proposer == AUTO for c in configs if c.kind == "engine"),
                      exact=any(c.exact for c in configs), oracles=found)


def control_settings(base, knobs: dict):
    """The engine's default ControlSettings with a configuration's control knobs applied
    (each tunable converted to the type of the default it replaces)."""
    if not knobs:
        return None
    adaptive = bool(knobs.get("adaptive", base.adaptive))
    changes: dict = {"adaptive": adaptive}
    if "max_draft" in knobs:
        n = int(knobs["max_draft"])
        changes.update(max_draft=n)
    for k in TUNABLE_KNOBS:
        if k in knobs:
            kind = type(getattr(base, k))
            v = knobs[k]
            if kind is bool and isinstance(v, str):
                if v.lower() not in ("true", "false", "1", "0"):
                    raise InvalidInputError(f"control knob {k} takes true or false (got {v!r})")
                v = v.lower() in ("true", "1")
            try:
                changes[k] = kind(v)
            except (TypeError, ValueError):
                raise InvalidInputError(f"control knob {k} takes a {kind.__name__} (got {v!r})") from None
    return replace(base, **changes).validate()


def load_engine(m: Matrix, plan: EnginePlan,
                references: "dict[str, oracles.References] | None" = None
                ) -> tuple[dict, dict[str, str]]:
    """Load the engine (and, for exact configurations, an exact one beside it), then give
    every configuration its own instances of the free proposers it consults: a proposer
    that learns across requests (suffix trees, n-gram statistics) must not see another
    configuration's answer to the same prompt, nor the statistics an earlier run saved on
    disk. Returns the engines by exactness and, per configuration, the proposer label its
    requests use."""
    from ...engine.engine import Engine  # deferred: it loads llama.cpp

    kw = dict(draft=m.draft, proposer=AUTO if plan.auto else BASELINE, n_ctx=m.n_ctx,
              threads=m.threads, proposer_options=plan.proposer_options,
              n_gpu_layers=m.n_gpu_layers, draft_gpu_layers=m.n_gpu_layers,
              tree_width=m.tree_width,
              # the weights read into RAM: the bench may hold a second engine and an anchor's
              # copy, and a mapped load that repacks keeps the file's pages resident beside the
              # repacked copy; it moves memory, not what is computed (KernelConfig.key)
              use_mmap=False)
    engines = {False: Engine.load(m.target, **kw)}
    names = dict(plan.request_name)
    try:
        if plan.exact:
            engines[True] = Engine.load(m.target, exact=True, **kw)
        for label, (name, options) in plan.extra.items():
            for eng in engines.values():
                eng.add_proposer(label, _free(name, options))
        for label, kind in plan.oracles.items():
            if references is None or label not in references:
                raise InvalidInputError(f"oracle configuration {label} needs its references")
            eng = engines[False]
            eng.add_proposer(label, oracles.OracleProposer(
                kind, references[label], eng.calibration(),
                max_draft=int(plan.control[label]["max_draft"])))
        for c in m.engine_configs:
            if c.label in plan.oracles:
                continue
            if plan.request_name[c.label] != BASELINE:
                names[c.label] = _own_instances(engines[c.exact and plan.exact], c,
                                                plan.request_name[c.label])
    except BaseException:
        for eng in engines.values():
            eng.close()
        raise
    return engines, names


def _free(name: str, options: dict):
    return free_proposer(name, **options)


def _clone_prefix(label: str) -> str:
    """What a configuration's own instances are named by: its label (a combination's '+'
    would read as several proposers in a request label)."""
    return label.replace("+", "_") + "/"


def _own_instances(engine, c: ConfigSpec, asked: str | None) -> str:
    from ...engine.engine import split_proposers  # deferred: it loads llama.cpp
    label = asked or engine.default_proposer
    missing = [n for n in split_proposers(label) if n not in engine.proposers]
    if missing:
        raise EdgespecError(
            f"the engine could not load {c.label} ({', '.join(missing)}; loaded: "
            f"{', '.join(engine.proposers) or 'none'}); is the native library built "
            "(`make install`)?")
    parts = []
    for n in split_proposers(label):
        if engine.proposers[n].costly:
            parts.append(n)  # one model; it learns nothing across requests
        else:
            parts.append(engine.clone_proposer(n, _clone_prefix(c.label) + n, **_no_persistence(
                getattr(engine.proposers[n], "name", n))))
    return "+".join(parts) if parts else BASELINE


def renew_clones(engine, label: str, request_name: str) -> int:
    """Fresh instances of configuration ``label``'s own proposers (those `_own_instances`
    cloned as ``label/name``), so a new round of ``--repeats`` drafts from nothing the last
    round taught them: a suffix tree that holds the previous round's answer to the same
    prompt would make every round after the first look better than a user's first request.
    Returns how many were renewed."""
    prefix = _clone_prefix(label)
    renewed = 0
    for part in request_name.split("+"):
        if not part.startswith(prefix):
            continue  # the plain path, or a model proposer (it learns nothing across requests)
        source = part[len(prefix):]
        engine.remove_proposer(part)
        engine.clone_proposer(source, part, **_no_persistence(
            getattr(engine.proposers[source], "name", source)))
        renewed += 1
    return renewed


def _no_persistence(kind: str) -> dict:
    """Options that keep a fresh instance from reading or writing statistics on disk."""
    return {"stats_path": ""} if kind == "ngram" else {}
