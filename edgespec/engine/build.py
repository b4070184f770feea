"""The engine's builder: what :meth:`Engine.from_config <edgespec.engine.engine.Engine.from_config>`
loads, step by step, over an ``ExitStack``. Whatever fails (a corrupt draft, an
incompatible vocabulary, a context that does not fit) releases what was already loaded,
in reverse order, before the error reaches the caller.

    parts = load_parts(config, stack)   # the target, its context, proposers, calibration
"""
from __future__ import annotations

import warnings
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Mapping

from .. import planner, registry
from .. import proposers as registry_of_proposers
from ..api.labels import AUTO
from ..calibration import cache as calibration_cache, cpu
from ..calibration.curve import Calibration, CalibrationWarning, prior_step_seconds
from ..control import ControlSettings
from ..errors import InvalidInputError
from ..registry import digests
from ..planner import calibration_trust, kernels, usable_shape
from ..proposers import BuildContext, Proposer
from ..registry import bridge_pins as bridges
from ..runtime import model as runtime_model
from ..runtime.context import Context
from ..runtime.kernel import KernelConfig
from ..runtime.model import Model
from ..runtime.rpc import probe_all
from ..config import EngineConfig, split_proposers
from ..planner import Plan
from . import exactness

DEFAULT_CTX = 4096


@dataclass
class Parts:
    """What the builder loaded, for the engine to own (the stack closes it on failure)."""

    config: EngineConfig  # resolved: the plan's proposer, the kernel, n_ctx and control
    target: Model
    ctx: Context
    proposers: dict[str, Proposer]
    options: dict[str, dict[str, Any]]  # what each proposer kind was built with
    calibration: Calibration | None
    plan: Plan | None  # the planner's plan when the proposer was "auto", else None
    tree_seqs: tuple[int, ...]  # the sequences past the request slots: draft-tree scratch
    user_len: bool  # the user set a draft length (exact mode refuses, not shrinks, a long one)


def load_parts(config: EngineConfig, stack: ExitStack) -> Parts:
    """Load what a validated ``config`` names (after the planner resolves
    ``proposer="auto"``), each part registered on ``stack``."""
    # the default mode measures its kernel configuration once the target is loaded
    # (planner.kernels); exact mode and an asked configuration keep theirs
    pick_kernel = config.kernel is None and not config.exact
    plan = None
    if config.proposer == AUTO:
        plan = planner.plan_engine(config)
        config = plan.config
    elif config.rpc:
        config, _ = planner.resolve_rpc(config)
    tmodel = _load(config.target, config, config.n_gpu_layers, stack, rpc=config.rpc,
                   load_mtp="mtp" in split_proposers(config.proposer))
    tsha = digests.model_identity(tmodel.path)["sha256"]  # digested once: the kernel cache and proposers
    config = replace(config, kernel=config.loaded_as(
        _default_kernel(tmodel, tsha, config, pick_kernel, plan.kernel if plan else None)))
    ctx, n_ctx = _context(tmodel, config, stack)
    dmodel = None
    if config.draft is not None:
        dmodel = _load(config.draft, config, config.draft_gpu_layers, stack)
        # same vocabulary, unless the draft is only bridged (its pair pin is checked then)
        registry_of_proposers.check_draft(tmodel, dmodel, config.proposer)
    user_len = config.control is not None or config.max_draft is not None
    options = _proposer_options(config)
    loaded = _build_proposers(config, options, stack, _build_context(config, tmodel, dmodel,
                                                                    n_ctx, tsha, ctx))
    default = config.proposer  # never "auto" here: the plan resolved it
    control = (config.control or _control_from_flags(config, plan, default)).validate()
    config = replace(config, n_ctx=n_ctx, control=control)
    cal = (trusted_calibration(tmodel, config.threads, config.layout())
           if control.adaptive else None)
    _price_heads(loaded, cal)
    _price_drafts(loaded, cal, tmodel, config)
    return Parts(config, tmodel, ctx, loaded, options, cal, plan,
                 tree_seqs=tuple(range(config.parallel, config.parallel + config.tree_width)),
                 user_len=user_len)


def exact_control(parts: Parts) -> tuple[ControlSettings, int | None]:
    """The control settings an exact engine starts with, and the probed cap (None when the
    engine is not exact, where nothing is probed): a default fixed draft length shrinks to
    what exact mode verifies; a user's longer one, or any draft where no batch is bitwise
    invariant, is refused here, before the engine exists."""
    config = parts.config
    control = config.control
    assert control is not None  # load_parts settles it
    if not config.exact:
        return control, None
    cap = exactness.max_drafts(parts.target, config, parts.ctx.n_threads)
    if not parts.user_len:
        control = replace(control, max_draft=min(control.max_draft, max(1, cap)))
    # raises what cannot be verified bitwise; the bound itself applies per request
    exactness.bound(control, cap, config.layout(), bool(split_proposers(config.proposer)))
    return control, cap


def _price_heads(loaded: Mapping[str, Proposer], cal: Calibration | None) -> None:
    """A proposer drafting with the target's NextN head starts priced at the head's decode
    measured at calibration (the controller's seconds per draft token), not at a guess."""
    head_s = getattr(cal, "mtp_step_seconds", None)
    for name, p in loaded.items():
        spec = registry_of_proposers.REGISTRY.get(name)
        if head_s and spec is not None and spec.nextn_head \
                and not getattr(p, "seconds_per_token", 0.0):
            setattr(p, "seconds_per_token", float(head_s))
            setattr(p, "setup_seconds_per_token", float(head_s))


def _price_drafts(loaded: Mapping[str, Proposer], cal: Calibration | None, tmodel: Model,
                  config: EngineConfig) -> None:
    """The price of a draft model's token that reproducible requests use
    (``setup_seconds_per_token``; requests.attach_controller): a function of the setup, not
    of earlier requests' timings, so the same greedy or seeded request gets the same passes
    (docs/parity.md). The draft's own cached calibration step when one is trusted, else the
    target's step scaled by the two models' weight bytes (decode streams the weights)."""
    for p in loaded.values():
        model = getattr(p, "model", None)
        priced = float(getattr(p, "setup_seconds_per_token", 0.0) or 0.0) > 0.0
        if priced or not p.costly or not isinstance(model, Model):
            continue
        dcal = calibration_cache.cached(model.path, n_threads=config.threads,
                                        kernel=config.layout())
        if dcal is not None and calibration_trust(dcal, prior_step_seconds(model.size_bytes))[0]:
            setattr(p, "setup_seconds_per_token", float(dcal.step_seconds))
        elif cal is not None:
            setattr(p, "setup_seconds_per_token",
                    float(cal.step_seconds * model.size_bytes / max(tmodel.size_bytes, 1)))


def _context(tmodel: Model, config: EngineConfig, stack: ExitStack) -> tuple[Context, int]:
    """The target's context: its size checked against the model's, its kernels the
    configuration's, one sequence per request slot plus the draft trees' scratch ones."""
    n_ctx = config.n_ctx or min(DEFAULT_CTX, tmodel.n_ctx_train)
    if n_ctx > tmodel.n_ctx_train:
        raise InvalidInputError(f"--ctx {n_ctx} exceeds what {tmodel.path.name} was trained for "
                                f"({tmodel.n_ctx_train})")
    k = config.layout()  # the kernel chosen for this target (load_parts set it)
    ctx = tmodel.new_context(n_ctx=n_ctx, n_batch=k.n_batch, n_threads=config.threads,
                             n_seq_max=config.parallel + config.tree_width,
                             full_seqs=config.parallel,
                             # several requests: exact mode keeps each one's KV
                             # cells in order (Model.new_context says why)
                             kv_unified=not (config.exact and config.parallel > 1),
                             flash_attn=int(k.flash_attn), type_k=k.kv_ggml_type,
                             type_v=k.kv_ggml_type)
    stack.callback(ctx.close)
    return ctx, n_ctx


def _build_context(config: EngineConfig, tmodel: Model, dmodel: Model | None, n_ctx: int,
                   tsha: str, ctx: Context | None = None) -> BuildContext:
    layout = config.layout()
    return BuildContext(
        target=tmodel, draft_model=dmodel, n_ctx=n_ctx, threads=config.threads,
        kernel=config.kernel, target_ctx=ctx,
        target_digest=tsha, check_bridge_pair=bridges.check_pair,
        # a proposer that derives its own draft (self) loads it as a draft is loaded
        load_model=lambda path: runtime_model.load_model(
            path, n_gpu_layers=config.draft_gpu_layers, use_extra_bufts=layout.repack,
            use_mmap=layout.use_mmap))


def _load(name: str, config: EngineConfig, gpu_layers: int, stack: ExitStack,
          rpc: tuple[str, ...] = (), load_mtp: bool = False) -> Model:
    """Resolve (pull), check the header, load with the engine's kernel configuration (the
    last ``gpu_layers`` layers on the ``rpc`` servers, probed again first: llama.cpp aborts
    on one that went away); the stack frees it if a later step fails."""
    path = registry.resolve(name, pull=config.pull)
    registry.check_gguf(path)
    split: dict[str, Any] = {"load_mtp": True} if load_mtp else {}  # a NextN head (mtp)
    if rpc:
        probe_all(rpc)
        split.update(rpc=rpc, tensor_split=config.tensor_split)
    layout = config.layout()
    model = runtime_model.load_model(path, n_gpu_layers=gpu_layers, use_extra_bufts=layout.repack,
                               use_mmap=layout.use_mmap, **split)
    stack.callback(model.close)
    return model


def _default_kernel(model: Model, sha: str, config: EngineConfig, pick: bool,
                    planned: KernelConfig | None) -> KernelConfig:
    """The kernel configuration the context is made with. ``pick`` (the default mode, no
    configuration asked): the fastest candidate measured on this device, measured now when
    the engine calibrates anyway (adaptive control) and nothing is cached, else the cached
    choice or llama.cpp's CPU default (planner.kernels). A plan that had to quantize the KV
    cache to fit the budget (``planned`` differs from what it was offered) is kept."""
    if not pick:
        return config.layout()
    repack = bool(getattr(model, "use_extra_bufts", True))
    offered_choice = kernels.cached(model.path, n_threads=config.threads, sha256=sha,
                                    repack=repack)
    offered = offered_choice.kernel
    if planned is not None and (planned.kv_type, planned.flash_attn) != (offered.kv_type, offered.flash_attn):
        return planned
    # a split across RPC servers runs what this machine measured for itself: timing the
    # candidates over the network would measure the network, and the split's output must
    # equal the local run's
    local = not getattr(model, "placement", "")
    adaptive = config.control.adaptive if config.control is not None else config.adaptive
    # nothing cached and a busy machine: timing the candidates now would take minutes and
    # be measured again later anyway; llama.cpp's default runs until then
    if local and adaptive and not (offered_choice.source == "default"
                                   and cpu.machine_busy() > cpu.BUSY_LIMIT):
        offered = kernels.load_or_measure(model, n_threads=config.threads, sha256=sha).kernel
    base = planned or config.layout()
    return replace(base, kv_type=offered.kv_type, flash_attn=offered.flash_attn)


def _control_from_flags(config: EngineConfig, plan: Plan | None, label: str) -> ControlSettings:
    """ControlSettings from --adaptive/--max-draft: with adaptive control a user's
    --max-draft is the longest draft allowed; without, the length of every draft."""
    if config.max_draft is not None:
        return ControlSettings(adaptive=config.adaptive, max_draft=config.max_draft)
    if config.adaptive:  # the controller sizes every draft, up to its default cap
        return ControlSettings(adaptive=True)
    length = _planned_max_draft(plan) or (4 if "draft" in split_proposers(label) else 3)
    return ControlSettings(adaptive=False, max_draft=length)


def _planned_max_draft(plan: Plan | None) -> int | None:
    dl = plan.draft_range if plan is not None else None
    if not dl:
        return None
    return int(dl[1] if isinstance(dl, (tuple, list)) else dl)


def _proposer_options(config: EngineConfig) -> dict[str, dict[str, Any]]:
    options = {name: dict(o) for name, o in config.proposer_options.items()}
    if (config.control.adaptive if config.control is not None else config.adaptive):
        # The controller cuts drafts itself; a suffix draft capped at its match length
        # would leave long copied spans on the table.
        options.setdefault("suffix", {}).setdefault("factor", 3.0)
    return options


def _build_proposers(config: EngineConfig, options: Mapping[str, dict[str, Any]], stack: ExitStack,
                     ctx: BuildContext) -> dict[str, Proposer]:
    """Every free proposer (cheap), plus the draft model's when one was loaded. A free one
    that cannot be built (no native library) is an error only if it was asked for."""
    wanted = set(split_proposers(config.proposer)) if config.proposer != AUTO else set()
    out: dict[str, Proposer] = {}
    for name, spec in registry_of_proposers.REGISTRY.items():
        if "draft_model" in spec.needs and ctx.draft_model is None:
            continue
        if spec.asked_only and name not in wanted \
                and name not in config.proposer_options:
            continue  # self (its own model), lookahead (opt-in): built only when asked for
        try:
            p = spec.build(ctx, options.get(name, {}))
        except InvalidInputError:
            if name in wanted:
                raise
            continue
        stack.callback(p.close)
        out[name] = p
    return out


def trusted_calibration(model: Model, threads: int | None, kernel: KernelConfig) -> Calibration:
    """The measured verify-cost curve: trusted, or jittery but quiet (its shape is still the
    device's); a noise curve is measured again on a quiet machine; the CPU prior stands in
    only when neither gives a usable one."""
    expected = prior_step_seconds(model.size_bytes)
    busy = _busy_before_first_measure(model, threads, kernel)
    if busy is not None:
        # Timings taken now would be rejected afterwards (a busy curve is not trusted), so
        # the minutes they take would buy nothing: price with the prior for this run.
        warnings.warn(f"other processes are using {busy:.0%} of the CPUs, so this machine's "
                      "verify cost is not measured now (timings under load are not usable); "
                      "this run prices drafts with the CPU prior, and a later run on a quiet "
                      "machine measures it (or `edgespec plan --recalibrate`)",
                      CalibrationWarning, stacklevel=2)
        return Calibration.prior_cpu(step_seconds=expected)
    cal = calibration_cache.load_or_measure(model.path, n_threads=threads, model=model,
                                      n_gpu_layers=model.n_gpu_layers, kernel=kernel)
    ok, why = calibration_trust(cal, expected)
    ok = ok or usable_shape(cal, expected)
    if not ok and cpu.machine_busy() <= cpu.BUSY_LIMIT / 2:
        # A cached curve that is noise stays wrong for every later load unless it is
        # measured again; the prior it would otherwise fall back to is another CPU's
        # curve, far flatter than a compute-bound one (a 16-token pass priced at 3.4
        # steps where this CPU takes 8), which sends the controller into long drafts.
        # A merely jittery one (a VM's) keeps the device's shape and is used as it is.
        warnings.warn(f"the calibration of {model.path} is not trusted ({why}); the machine "
                      "is quiet now, measuring it again", CalibrationWarning,
                      stacklevel=2)
        cal = calibration_cache.load_or_measure(model.path, n_threads=threads, model=model,
                                          n_gpu_layers=model.n_gpu_layers, kernel=kernel,
                                          force=True)
        ok, why = calibration_trust(cal, expected)
        ok = ok or usable_shape(cal, expected)
    if not ok:
        warnings.warn(f"the calibration of {model.path} is not usable ({why}); pricing drafts "
                      "with the CPU prior until `edgespec plan --recalibrate` on a quiet "
                      "machine", CalibrationWarning, stacklevel=2)
        cal = Calibration.prior_cpu(step_seconds=expected)
    return cal


def _busy_before_first_measure(model: Model, threads: int | None,
                               kernel: KernelConfig) -> float | None:
    """Other processes' CPU share when nothing is cached for this model and configuration
    and the machine is too busy to time it; None when a curve is cached or it is quiet."""
    with warnings.catch_warnings():  # a stale file is reported once, by the measuring
        warnings.simplefilter("ignore", CalibrationWarning)
        if calibration_cache.cached(model.path, n_threads=threads, kernel=kernel,
                                    n_gpu_layers=model.n_gpu_layers) is not None:
            return None
    busy = cpu.machine_busy()
    return busy if busy > cpu.BUSY_LIMIT else None
