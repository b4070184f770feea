"""Entry points: an EngineConfig (or names and paths) in, a :class:`Plan` out.

``plan_engine`` is what ``Engine.from_config`` and ``edgespec plan`` call with the same
EngineConfig, so the plan shown is the plan that runs: ``Plan.config`` is that config
with every "auto" resolved (proposer, draft, offload, context, kernel with KV type and
batch).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..runtime import device as devmod
from ..api.labels import AUTO
from ..config import EngineConfig
from ..runtime.kernel import KernelConfig
from ..runtime.device import Device
from ..calibration.curve import Calibration
from ..runtime.gguf_facts import ModelFacts, read_facts
from .lookup import cached_calibration, registered_draft, resolve_model
from .result import Exactness, KernelOption, Plan
from .search import plan
from . import kernels
from .memory import K_MAX, estimate_memory
from .remote import RpcPlacement, place
from .search import DEFAULT_CTX
from ..runtime.rpc import probe_all
from .. import proposers
from ..errors import EdgespecError
from ..registry import spec_file
from ..registry.spec import ModelSpec
from . import optimized_copy

#: exact mode's cap before a probe has run (the engine's fallback: 3-token passes with
#: repacked CPU weights, docs/parity.md)
UNPROBED_EXACT_CAP = 2

#: exact mode under one weight layout: its kernel, calibration (None: none cached) and cap
Layout = tuple[KernelConfig, "Calibration | None", "int | None"]


def plan_engine(config: EngineConfig, *, device: Device | None = None, calibrate: bool = False,
                recalibrate: bool = False, kv_type: str | None = None) -> Plan:
    """Resolve what ``config`` leaves open for this device, and say why.

    Uses cached calibrations when present and trustworthy (``calibrate=True`` measures
    missing ones first, ``recalibrate=True`` re-measures: tens of seconds on a small CPU)
    and priors otherwise. A registered target's own draft is weighed for ``proposer="auto"``
    when it is already pulled. ``n_gpu_layers == 0`` means "as many as fit"; ``kv_type``
    forces the KV cache type (no quantizing further to fit).
    """
    cfg = config.validate()
    tpath, tname, tsha, tfacts = _model(cfg.target, cfg.pull)
    dpath, dname, dsha, dfacts = _draft(cfg, tname, tsha, tfacts)
    dev = device or devmod.probe()

    def calib(path: Path | None, sha: str | None, kernel: KernelConfig,
              measure: bool) -> Calibration | None:
        if dev.synthetic or path is None:
            return None  # a described machine cannot be measured here
        return cached_calibration(path, sha, cfg.threads, measure, recalibrate and measure, kernel)

    measure = calibrate or recalibrate
    draft_cal = calib(dpath, dsha, KernelConfig(), measure)
    # exact mode runs the asked kernel or the batch-invariant one; the default runs the asked
    # one or the fastest measured here (planner.kernels), whose step `plan` shows
    exact_kernel = cfg.layout()
    choice = None
    if cfg.kernel is None and kv_type is None:
        choice = _kernel_choice(tpath, tsha, cfg, measure and not dev.synthetic,
                                recalibrate and not dev.synthetic)
    default_kernel = cfg.loaded_as(cfg.kernel or (choice.kernel if choice is not None
                                                  else exact_kernel))
    base = replace(cfg, draft=dname if dname else cfg.draft, kernel=cfg.kernel)

    def plan_with(kernel: KernelConfig, exact: bool, cap: int | None,
                  cal: Calibration | None) -> Plan:
        cals = {k: v for k, v in (("target", cal), ("draft", draft_cal)) if v is not None}
        return plan(tfacts, dfacts, device=dev, budget=cfg.budget, ctx=cfg.n_ctx, kernel=kernel,
                    kv_type=kv_type, exact=exact, exact_cap=cap, proposer=cfg.proposer,
                    n_gpu_layers=cfg.n_gpu_layers or None,
                    # a path or reference too: qualification records are kept by digest
                    target_name=tname or str(cfg.target), draft_name=dname,
                    calibrations=cals, base=base)

    # Exact mode under each weight layout (the asked one first): its probed cap, and the
    # plan it would give.
    layouts = _exact_layouts(exact_kernel, lambda k, m: calib(tpath, tsha, k, m), measure,
                             cfg.exact)
    exact_plans = {k.repack: plan_with(k, True, cap, cal) for k, cal, cap in layouts if cap is not None}
    asked_cal = layouts[0][1]
    if not cfg.exact:
        dcal = asked_cal if default_kernel == exact_kernel else calib(tpath, tsha, default_kernel, measure)
        chosen = plan_with(default_kernel, False, None, dcal)
    elif exact_plans:
        # the faster layout; on a tie the repacked one (cheaper passes beyond the cap)
        chosen = max(exact_plans.values(), key=lambda p: (round(p.predicted_speedup, 3), p.kernel.repack))
    else:
        chosen = plan_with(exact_kernel, True, UNPROBED_EXACT_CAP, asked_cal)
    chosen = replace(chosen, exactness=_exactness(layouts, exact_plans, chosen, cfg.exact),
                     kernel_choice=tuple(choice.describe()) if choice is not None else ())
    # the target's Q8_0 copy (`edgespec models optimize`): proposed, or compared on the
    # calibrations both have here (the kernel the chosen plan's calibration is cached under)
    cal_kernel = chosen.kernel if cfg.exact else default_kernel
    runs, kernel = chosen.config.proposer, chosen.kernel

    def plan_copy(copy: ModelSpec) -> Plan | None:
        cpath = spec_file(copy)
        cal = calib(cpath, copy.sha256, cal_kernel, False)
        if cal is None:
            return None
        cap = getattr(cal, "exact_max_drafts", None)
        cals = {k: v for k, v in (("target", cal), ("draft", draft_cal)) if v is not None}
        try:
            return plan(read_facts(cpath), dfacts, device=dev, budget=cfg.budget, ctx=cfg.n_ctx,
                        kernel=kernel, kv_type=kv_type, exact=cfg.exact,
                        exact_cap=cap if cap is not None else UNPROBED_EXACT_CAP, proposer=runs,
                        n_gpu_layers=cfg.n_gpu_layers or None, target_name=copy.name,
                        draft_name=dname, calibrations=cals, base=replace(base, target=copy.name))
        except EdgespecError:  # e.g. the larger copy does not fit the budget
            return None

    chosen = replace(chosen, reasons=chosen.reasons + optimized_copy.notes(
        tname or str(tpath), tsha, tfacts, chosen,
        calib(tpath, tsha, cal_kernel, False) is not None, plan_copy))
    if cfg.rpc:
        chosen = _with_rpc(chosen, tfacts, dfacts)
    return chosen


def _exact_layouts(exact_kernel: KernelConfig,
                   calib: Callable[[KernelConfig, bool], Calibration | None], measure: bool,
                   exact: bool) -> list[Layout]:
    """(kernel, calibration, probed cap) under each weight layout, the asked one first;
    the other layout is measured only when exact mode may pick it."""
    layouts: list[Layout] = []
    for repack in (exact_kernel.repack, not exact_kernel.repack):
        kernel = replace(exact_kernel, repack=repack)
        cal = calib(kernel, measure and (repack == exact_kernel.repack or exact))
        layouts.append((kernel, cal, getattr(cal, "exact_max_drafts", None)))
    return layouts


def _model(name: str | os.PathLike[str],
           pull: bool) -> tuple[Path, str | None, str | None, ModelFacts]:
    """(path, registry name or None, sha256, facts) of a model named or given by path."""
    path, registered, sha = resolve_model(name, pull=pull)
    return path, registered, sha, read_facts(path)


def _draft(cfg: EngineConfig, tname: str | None, tsha: str | None, tfacts: ModelFacts
           ) -> tuple[Path | None, str | None, str | None, ModelFacts | None]:
    """(path, name, sha256, facts) of the draft to weigh: the one asked, or for "auto" the
    registered target's own draft when pulled; for "self" the facts of the model derived
    from the target (no path). All None without one."""
    draft_arg = cfg.draft
    if draft_arg is None and cfg.proposer == AUTO and tname is not None:
        draft_arg = registered_draft(tname)
    dfacts: ModelFacts | None = None
    dname: str | None = None
    dpath: Path | None = None
    dsha: str | None = None
    if draft_arg is not None:
        dpath, dname, dsha, dfacts = _model(draft_arg, cfg.pull)
        dname = dname or str(draft_arg)
    if dfacts is None and "self" in cfg.proposer.split("+"):
        # self-speculation loads a model made of some of the target's blocks: counted as
        # its draft (memory, speed), never loaded as one
        from ..proposers.self_draft_choice import layers_for
        from .self_draft import self_draft_facts
        layers = layers_for(tsha, tfacts.n_layers,
                            str(cfg.proposer_options.get("self", {}).get("layers", "") or ""))
        dfacts = self_draft_facts(tfacts, layers.layers)
    return dpath, dname, dsha, dfacts


def _kernel_choice(path: Path, sha: str | None, cfg: EngineConfig, measure: bool,
                   force: bool) -> kernels.KernelChoice:
    """The default mode's kernel choice for this target: cached, or measured when asked
    (``edgespec plan --calibrate``), else llama.cpp's CPU default until it is."""
    repack = cfg.layout().repack
    if not measure:
        return kernels.cached(path, n_threads=cfg.threads, repack=repack, sha256=sha)
    from ..runtime.model import load_model  # deferred: it loads llama.cpp
    model = load_model(path, use_extra_bufts=repack)
    try:
        return kernels.load_or_measure(model, n_threads=cfg.threads, sha256=sha, force=force)
    finally:
        model.close()


def resolve_rpc(config: EngineConfig, facts: ModelFacts | None = None
                ) -> tuple[EngineConfig, RpcPlacement | None]:
    """``config`` with its RPC split decided (layers and shares, :func:`.remote.place`,
    after probing every server), and the placement; ``(config, None)`` without ``--rpc``."""
    if not config.rpc:
        return config, None
    if facts is None:
        facts = read_facts(resolve_model(config.target, pull=config.pull)[0])
    n_ctx = config.n_ctx or min(DEFAULT_CTX, facts.n_ctx_train)
    placement = place(facts, probe_all(config.rpc), n_ctx=n_ctx * config.parallel,
                      kernel=config.layout(), n_gpu_layers=config.n_gpu_layers or None,
                      split=config.tensor_split)
    return replace(config, n_gpu_layers=placement.n_gpu_layers, tensor_split=placement.split), placement


def _with_rpc(p: Plan, tfacts: ModelFacts, dfacts: ModelFacts | None) -> Plan:
    """The plan with the target's last layers on the RPC servers: what each holds, and the
    host memory without them (the draft, if any, stays here)."""
    cfg, placement = resolve_rpc(p.config, tfacts)
    assert placement is not None  # only called with --rpc
    rows = 1 if p.proposer == "none" else K_MAX + 1
    head = any(n in proposers.REGISTRY and proposers.REGISTRY[n].nextn_head
               for n in cfg.proposer.split("+"))
    mem = estimate_memory(tfacts, n_ctx=p.n_ctx * cfg.parallel, kernel=p.kernel,
                          n_gpu_layers=placement.n_gpu_layers,
                          draft=dfacts if p.draft else None, verify_rows=rows, isa=p.device.isa,
                          mtp_head=head)
    mem = mem.without("GPU runtime")
    note = (f"{placement.n_gpu_layers} of {tfacts.n_layers + 1} target layers on "
            f"{len(placement.shares)} RPC device{'s' if len(placement.shares) != 1 else ''}; "
            "speed predicted for this machine alone (the first run measures the split)")
    return replace(p, config=cfg, n_gpu_layers=placement.n_gpu_layers, memory=mem, rpc=placement,
                   budget_device=sum(s.budget for s in placement.shares),
                   reasons=p.reasons + (note,))


def _exactness(layouts: list[Layout], exact_plans: dict[bool, Plan], chosen: Plan,
               exact: bool) -> Exactness:
    runs = chosen.kernel.repack if exact else max(
        exact_plans, key=lambda r: (round(exact_plans[r].predicted_speedup, 3), r), default=None)
    rows = []
    for kernel, _cal, cap in layouts:
        p = exact_plans.get(kernel.repack)
        rows.append(KernelOption(kernel=kernel, cap=cap,
                                 speedup=p.predicted_speedup if p else None,
                                 tokens_per_second=p.predicted_tokens_per_second if p else None,
                                 chosen=p is not None and kernel.repack == runs))
    if exact_plans:
        src = ("probed at calibration: the longest verify pass whose logits are bitwise those of "
               "single-token decoding; * marks the layout " + ("that runs" if exact else "--exact would run"))
        if len(exact_plans) < len(layouts):
            src += "; `edgespec plan --exact --calibrate` probes the other layout too"
    else:
        src = ("cap not measured on this device yet (exact mode assumes "
               f"{UNPROBED_EXACT_CAP} drafts a pass until it is): `edgespec plan --calibrate` "
               "measures it (a few seconds), or the first --exact run does")
    return Exactness(options=tuple(rows), source=src)


def plan_for(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None = None,
             device: Device | None = None, budget: str | int | None = None,
             ctx: int | None = None, *, kv_type: str | None = None, calibrate: bool = False, recalibrate: bool = False,
             n_threads: int | None = None, exact: bool = False) -> Plan:
    """Registry names or paths in, a :class:`Plan` out (a thin wrapper over :func:`plan_engine`).

    ``kv_type`` forces the KV cache type of the engine's kernel configuration."""
    cfg = EngineConfig(target=str(target_path), draft=None if draft_path is None else str(draft_path),
                       exact=exact, n_ctx=ctx, threads=n_threads, budget=budget)
    return plan_engine(cfg, device=device, calibrate=calibrate, recalibrate=recalibrate,
                       kv_type=kv_type)
