"""The search: for each proposer, the first configuration in preference order that fits the
memory budget, its offload and its predicted speed; the fastest proposer wins.

Preference order (what to give up first to fit): the batch (512 -> 256 -> 128, prompt
speed only), then mmap (read the weights into RAM instead, so repacked matrices are not
resident twice), then context (halving down to 512, unless --ctx was given), then KV
precision (q4_0, never in exact mode or when the KV type was forced).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..runtime import device as devmod
from ..api.labels import AUTO, PLAIN
from ..config import EngineConfig
from ..calibration.curve import Calibration
from ..runtime.kernel import KV_TYPES, KernelConfig
from ..runtime.device import Device, fmt_size
from ..errors import EdgespecError, InvalidInputError
from ..runtime.gguf_facts import ModelFacts
from .acceptance_priors import Acceptance, acceptance_for
from .memory import (SUFFIX_CACHE_CAP, MemoryEstimate, default_budgets,
                     estimate_memory)
from .reasons import explain_choice
from .result import Candidate, Plan
from .speed import K_MAX, SpeedModel, best_k, bridged, head_speed, speed_model
from .. import proposers
from ..proposers.vocab_check import SPEC_VOCAB_MAX_SIZE_DIFFERENCE

MIN_CTX = 512
DEFAULT_CTX = 4096
BATCH_CHOICES = (512, 256, 128)


class BudgetError(EdgespecError):
    """Even the target alone does not fit the memory budget; the message says what would."""


def _ctx_ladder(n_ctx: int, explicit: bool) -> list[int]:
    if explicit:
        return [n_ctx]
    out, c = [], n_ctx
    while c >= MIN_CTX:
        out.append(c)
        c //= 2
    return out or [n_ctx]


def _kernel_ladder(kernel: KernelConfig) -> list[KernelConfig]:
    """The asked kernel, then (if it maps a repacking load) the same reading weights into RAM."""
    out = [kernel]
    if kernel.use_mmap and kernel.repack:
        out.append(replace(kernel, use_mmap=False))
    return out


def _configs(n_ctx: int, explicit_ctx: bool, kernel: KernelConfig,
             may_quantize: bool) -> list[tuple[int, KernelConfig]]:
    """(ctx, kernel) in order of preference; the batch varies inside each (see the docstring)."""
    first = [kernel.kv_type] + (["q8_0"] if may_quantize and kernel.kv_type == "f16" else [])
    last = ["q4_0"] if may_quantize and kernel.kv_type != "q4_0" else []
    out = []
    for kvs in (first, last):
        for c in _ctx_ladder(n_ctx, explicit_ctx):
            for kv in kvs:
                out += [(c, k) for k in _kernel_ladder(replace(kernel, kv_type=kv))]
    return out


def _max_offload(facts: ModelFacts, fits: Callable[[int], bool]) -> int:
    """The most layers (0..n_layers+1) for which ``fits(n_gpu_layers)`` holds (monotone)."""
    lo, hi = 0, facts.n_layers + 1
    if fits(hi):
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Search:
    """One plan's fixed inputs, so the steps below take only what varies."""

    def __init__(self, target: ModelFacts, draft: ModelFacts | None, dev: Device,
                 budgets: tuple[int, int], suffix_cap: int, gpu_cap: int | None,
                 speed_for: Callable[[int, int, bool], SpeedModel], k_max: int) -> None:
        self.target, self.draft, self.dev = target, draft, dev
        self.budgets, self.suffix_cap, self.gpu_cap = budgets, suffix_cap, gpu_cap
        self.speed_for, self.k_max = speed_for, k_max
        self.sequences = 1  # --parallel: the context holds this many sequences of ctx cells

    def memory(self, ctx: int, kernel: KernelConfig, g_t: int, draft: ModelFacts | None, g_d: int,
               rows: int, head: bool = False) -> MemoryEstimate:
        return estimate_memory(self.target, n_ctx=ctx * self.sequences, kernel=kernel, n_gpu_layers=g_t, draft=draft,
                               draft_gpu_layers=g_d, verify_rows=rows, suffix_cap=self.suffix_cap,
                               isa=self.dev.isa, mtp_head=head)

    def place(self, ctx: int, kernel: KernelConfig, draft: ModelFacts | None,
              rows: int, head: bool = False) -> tuple[int, int]:
        """GPU layers for target then draft: the target gets the accelerator first."""
        vram = self.budgets[1]
        if vram <= 0 or self.gpu_cap == 0:
            return 0, 0

        def dev_mem(g_t: int, g_d: int) -> int:
            return self.memory(ctx, kernel, g_t, draft, g_d, rows, head).device

        g_t = _max_offload(self.target, lambda g: dev_mem(g, 0) <= vram)
        if self.gpu_cap is not None and self.gpu_cap > 0:
            g_t = min(g_t, self.gpu_cap)
        g_d = 0
        if draft is not None and g_t == self.target.n_layers + 1:
            g_d = _max_offload(draft, lambda g: dev_mem(g_t, g) <= vram)
        return g_t, g_d

    def evaluate(self, kind: str, costly: bool, configs: Sequence[tuple[int, KernelConfig]],
                 acc: Acceptance | None) -> Candidate:
        """The first (ctx, kernel) in preference order where ``kind`` fits, and its speed.

        Among the batch sizes that fit there, the one that offloads the most layers wins
        (offload is worth far more than a larger prompt batch), then the larger batch.
        """
        host_budget, vram = self.budgets
        use_draft = self.draft if costly else None
        head = _nextn_head(kind)
        rows = self.k_max + 1 if kind != PLAIN else 1
        for ctx, kernel in configs:
            fitting = []
            for nb in BATCH_CHOICES:
                k = replace(kernel, n_batch=nb)
                g_t, g_d = self.place(ctx, k, use_draft, rows, head)
                mem = self.memory(ctx, k, g_t, use_draft, g_d, rows, head)
                if mem.host <= host_budget and mem.device <= vram:
                    fitting.append((g_t, g_d, nb, mem, k))
            if not fitting:
                continue
            g_t, g_d, nb, mem, k = max(fitting, key=lambda f: (f[0], f[1], f[2]))
            sm = self.speed_for(g_t, g_d, head)
            if costly and _bridged(kind):
                sm = bridged(sm)
            if kind == PLAIN:
                best, s, rng = 0, 1.0, (0, 0)
            else:
                assert acc is not None  # every proposer but the plain path has an estimate
                best, s, rng = best_k(kind, acc, sm.cost, sm.draft_ratio or 0.0,
                                              _k_max(kind, self.k_max))
            return Candidate(kind, True, s, best, rng, acc, mem,
                             {"n_ctx": ctx, "kernel": k, "n_gpu_layers": g_t,
                              "draft_gpu_layers": g_d, "speed": sm})
        ctx, kernel = configs[-1]
        least = self.memory(ctx, replace(kernel, n_batch=BATCH_CHOICES[-1]), 0, use_draft, 0, rows,
                            head)
        what = f"the draft's weights are {fmt_size(use_draft.weight_bytes)}; " if use_draft else ""
        if head:
            what = f"the MTP head's weights are {fmt_size(self.target.mtp_bytes)}; "
        return Candidate(kind, False, acceptance=acc,
                         note=f"does not fit: {what}needs at least {fmt_size(least.host)} host "
                              f"(ctx {ctx}, KV {kernel.kv_type}) against a budget of {fmt_size(host_budget)}")

    def smallest_fit_message(self, n_ctx: int, explicit_ctx: bool, kernel: KernelConfig,
                             may_quantize: bool) -> str:
        host_budget = self.budgets[0]
        kv = "q4_0" if may_quantize else kernel.kv_type
        small = replace(kernel, kv_type=kv, n_batch=BATCH_CHOICES[-1], use_mmap=False)
        floor_ctx = n_ctx if explicit_ctx else MIN_CTX

        def need(c: int) -> int:
            return self.memory(c, small, 0, None, 0, 1).host

        name = Path(self.target.path).name
        msg = (f"{name} does not fit: even with context {floor_ctx}, a {kv} KV cache, batch "
               f"{BATCH_CHOICES[-1]} and the weights read into RAM it needs "
               f"{fmt_size(need(floor_ctx))} of host memory (weights "
               f"{fmt_size(self.target.weight_bytes)}), but the budget is {fmt_size(host_budget)}.")
        fixes = [f"raise --budget to at least {fmt_size(need(floor_ctx))} (or free "
                 f"{fmt_size(need(floor_ctx) - host_budget)} of RAM)"]
        if explicit_ctx and n_ctx > MIN_CTX and need(MIN_CTX) <= host_budget:
            c = n_ctx
            while c > MIN_CTX and need(c) > host_budget:
                c //= 2
            fixes.insert(0, f"lower --ctx to {max(c, MIN_CTX)}")
        if self.dev.gpu is None:
            fixes.append("use a smaller quantization of the model (fewer bits per weight)")
        else:
            fixes.append(f"free memory on {self.dev.gpu.name} so more layers can be offloaded")
        return msg + " Smallest change that fits: " + "; or ".join(fixes) + "."


def _nextn_head(kind: str) -> bool:
    """A proposer drafting with the target's own NextN layers (mtp): its memory and cost are
    the head's, never a draft model's."""
    return kind in proposers.REGISTRY and proposers.REGISTRY[kind].nextn_head


def _k_max(kind: str, k_max: int) -> int:
    """The longest draft weighed: a NextN head's is capped by its max_draft (what it runs)."""
    if not _nextn_head(kind):
        return k_max
    cap = proposers.REGISTRY[kind].options.get("max_draft")
    return min(k_max, int(cap.default)) if cap is not None else k_max


def _bridged(kind: str) -> bool:
    """A proposer that drafts with another tokenizer through the vocabulary bridge."""
    return kind in proposers.REGISTRY and not proposers.REGISTRY[kind].same_vocab


def _sizes_pair(target: ModelFacts, draft: ModelFacts) -> bool:
    """Whether the headers' vocabulary sizes allow a shared tokenizer (llama.cpp's rule: a
    padded vocabulary differs by up to 128 ids); the load checks every token."""
    return abs(target.n_vocab - draft.n_vocab) <= SPEC_VOCAB_MAX_SIZE_DIFFERENCE


def _draft_incompatibility(target: ModelFacts, draft: ModelFacts, kind: str = "draft") -> str:
    if _bridged(kind):
        if _sizes_pair(target, draft):
            return ("the draft shares the target's vocabulary size: the draft proposer needs no "
                    "bridge")
        return ""
    if not _sizes_pair(target, draft):
        return (f"vocabulary differs ({draft.n_vocab} vs the target's {target.n_vocab} tokens): "
                "not a draft for this target (--proposer bridge drafts across tokenizers for a "
                "pair pinned in models.toml)")
    return ""


def _kinds(proposer: str, has_draft: bool, nextn_layers: int = 0) -> list[tuple[str, bool]]:
    """(proposer, costs a draft model) to evaluate: for "auto" every registered one auto
    weighs for this target (``nextn_layers``: its header's NextN count), else those asked."""
    if proposer == AUTO:
        # self-speculation derives a model of its own, which the planner's draft memory and
        # speed model do not describe, and lookahead is not measured yet: they run when
        # asked for (--proposer self|lookahead), see docs/benchmarks.md. mtp is weighed on
        # a target that carries NextN layers (its head's memory and cost are described)
        names = [PLAIN] + [n for n in proposers.names()
                           if proposers.REGISTRY[n].weighable(nextn_layers)]
    elif proposer == PLAIN:
        names = [PLAIN]
    else:
        names = proposer.split("+")
    out = []
    for n in names:
        if _nextn_head(n):
            out.append((n, False))  # the target's own head: no draft model to count
            continue
        # a proposer deriving its own model (self) costs one too when the caller describes
        # it as the draft (plan_engine does: planner.self_draft); undescribed, it is weighed
        # without one rather than dropped
        if n in _own_model_names():
            out.append((n, has_draft))
            continue
        costly = n != PLAIN and proposers.needs_model(n)
        if costly and not has_draft:
            continue
        out.append((n, costly))
    return out


def plan(target: ModelFacts, draft: ModelFacts | None = None, *, device: Device | None = None,
         budget: int | str | None = None, ctx: int | None = None, kv_type: str | None = None,
         kernel: KernelConfig | None = None, exact: bool = False, exact_cap: int | None = None,
         proposer: str = AUTO, n_gpu_layers: int | None = None,
         target_name: str | None = None, draft_name: str | None = None,
         calibrations: Mapping[str, Calibration | None] | None = None,
         suffix_cap: int = SUFFIX_CACHE_CAP, base: EngineConfig | None = None) -> Plan:
    """Choose proposer, draft length, offload, context and kernel for ``target`` on ``device``.

    ``kernel`` is the configuration the engine would run (default: the engine's
    :class:`KernelConfig`); the plan departs from it only to fit the budget, and says so.
    ``kv_type`` forces the KV cache type. With ``exact`` verify passes hold at most
    ``exact_cap`` drafts (the calibration's probe). ``proposer`` is "auto" (weigh every
    registered proposer) or the label asked for. ``calibrations`` may hold measured
    :class:`edgespec.calibration.curve.Calibration` objects under "target" and "draft" (valid for
    this device, CPU-only layout). ``base`` is the EngineConfig the plan resolves
    (``Plan.config``). Raises :class:`BudgetError` when even the target alone cannot fit.
    """
    dev = device or devmod.probe()
    budgets = default_budgets(dev, budget)
    kernel = (kernel or (base.layout() if base is not None else KernelConfig())).validate()
    kernel, ctx, explicit_ctx = _checked(target, kernel, kv_type, ctx)
    may_quantize = not exact and kv_type is None
    configs = _configs(ctx, explicit_ctx, kernel, may_quantize)
    cals = dict(calibrations or {})
    k_max = K_MAX if not exact else max(exact_cap if exact_cap is not None else 2, 1)

    def speed_for(g_t: int, g_d: int, head: bool = False) -> SpeedModel:
        # a measured calibration holds for the CPU layout it was measured with
        tc = cals.get("target") if g_t == 0 and not dev.synthetic else None
        dc = cals.get("draft") if g_d == 0 and not dev.synthetic else None
        sm = speed_model(dev, target, draft, n_gpu_layers=g_t, draft_gpu_layers=g_d,
                         target_cal=tc, draft_cal=dc)
        return head_speed(sm, target, tc) if head else sm

    search = _Search(target, draft, dev, budgets, suffix_cap, n_gpu_layers, speed_for, k_max)
    search.sequences = base.parallel if base is not None else 1
    cands = _candidates(search, proposer, configs, target_name, draft_name)
    fitting = [c for c in cands if c.fits]
    if not fitting:
        raise BudgetError(search.smallest_fit_message(ctx, explicit_ctx, kernel, may_quantize))
    best, draft_range, free = _best(cands, fitting)
    cfg = best.config
    # a derived draft (self) is counted in memory and speed, but the engine builds it from
    # the target: it is no --draft to load (_costly is False for it)
    chosen_draft = draft if _costly(best.proposer) else None
    label, config = _engine_config(base, target, draft, draft_name, proposer, best, free,
                                   chosen_draft, exact)
    reasons = explain_choice(best, cands, dev, budgets, target, draft, ctx, explicit_ctx,
                             budget is not None, kernel, label)
    return Plan(
        target=target.path, draft=chosen_draft.path if chosen_draft is not None else None,
        proposer=best.proposer, draft_range=draft_range, n_gpu_layers=cfg["n_gpu_layers"],
        draft_gpu_layers=cfg["draft_gpu_layers"], n_ctx=cfg["n_ctx"], kernel=cfg["kernel"],
        predicted_speedup=best.speedup, memory=_fitting_memory(best), budget_host=budgets[0],
        budget_device=budgets[1], device=dev, candidates=tuple(cands), speed=cfg["speed"],
        reasons=tuple(reasons), config=config)


def _fitting_memory(c: Candidate) -> MemoryEstimate:
    """A fitting candidate's memory (estimated wherever it fits)."""
    assert c.memory is not None
    return c.memory


def _checked(target: ModelFacts, kernel: KernelConfig, kv_type: str | None,
             ctx: int | None) -> tuple[KernelConfig, int, bool]:
    """The kernel with the forced KV type, the context (default: DEFAULT_CTX within what
    the target was trained for) and whether it was given; bad values refused."""
    if kv_type is not None:
        if kv_type not in KV_TYPES:
            raise InvalidInputError(f"unknown KV cache type {kv_type!r}; choose one of {', '.join(KV_TYPES)}")
        kernel = replace(kernel, kv_type=kv_type)
    explicit_ctx = ctx is not None
    if ctx is None:
        ctx = min(DEFAULT_CTX, target.n_ctx_train)
    if ctx <= 0:
        raise InvalidInputError(f"context size must be positive (got {ctx})")
    if ctx > target.n_ctx_train:
        raise InvalidInputError(f"--ctx {ctx} exceeds what {Path(target.path).name} was trained for "
                                f"({target.n_ctx_train})")
    return kernel, ctx, explicit_ctx


def _candidates(search: _Search, proposer: str, configs: Sequence[tuple[int, KernelConfig]],
                target_name: str | None, draft_name: str | None) -> list[Candidate]:
    """Every proposer weighed, in the order _kinds gives (fitting or not, with its note)."""
    target, draft = search.target, search.draft
    cands: list[Candidate] = []
    for kind, costly in _kinds(proposer, draft is not None, target.nextn_predict_layers):
        if proposer == AUTO and costly and _bridged(kind) and draft is not None \
                and _sizes_pair(target, draft):
            continue  # a draft sharing the vocabulary needs no bridge: not a choice to weigh
        acc = acceptance_for(kind, target_name, draft_name) if kind != PLAIN else None
        bad = _draft_incompatibility(target, draft, kind) if costly and draft is not None else ""
        cands.append(Candidate(kind, False, acceptance=acc, note=bad) if bad else
                     search.evaluate(kind, costly, configs, acc))
    return cands


def _best(cands: Sequence[Candidate], fitting: Sequence[Candidate]
          ) -> tuple[Candidate, tuple[int, int], list[Candidate]]:
    """The winner, the draft length to run and the free proposers that fit."""
    # Highest predicted speedup wins; on a tie the cheaper one (plain, free, then costly).
    order = {c.proposer: i for i, c in enumerate(cands)}
    best = max(fitting, key=lambda c: (round(c.speedup, 3), -order[c.proposer]))
    draft_range = best.draft_range
    free = [c for c in fitting if c.proposer != PLAIN and not _drafts_per_step(c.proposer)]
    if best.proposer == PLAIN and free:
        # Requests may still name a free proposer (the engine loads them all): give them the
        # range their own prediction prefers rather than a draft length of zero.
        draft_range = max(free, key=lambda c: c.speedup).draft_range
    return best, draft_range, free


def _engine_config(base: EngineConfig | None, target: ModelFacts, draft: ModelFacts | None,
                   draft_name: str | None, proposer: str, best: Candidate,
                   free: Sequence[Candidate], chosen_draft: ModelFacts | None,
                   exact: bool) -> tuple[str, EngineConfig]:
    """The proposer label and the EngineConfig the plan resolves ``base`` to."""
    cfg = best.config
    base = base or EngineConfig(target=target.path, draft=draft.path if draft is not None
                                and not _own_model_names() & set(proposer.split("+")) else None)
    adaptive = base.control.adaptive if base.control is not None else base.adaptive
    label = _label(proposer, best, free, adaptive)
    config = replace(
        base, proposer=label,
        draft=(draft_name or (draft.path if draft else None)) if chosen_draft is not None else
        (base.draft if proposer != AUTO else None),
        n_gpu_layers=cfg["n_gpu_layers"], draft_gpu_layers=cfg["draft_gpu_layers"],
        n_ctx=cfg["n_ctx"], kernel=cfg["kernel"], exact=exact)
    return label, config


def _own_model_names() -> set[str]:
    return {n for n, sp in proposers.REGISTRY.items() if sp.own_model}


def _costly(name: str) -> bool:
    """It needs a draft model the engine loads (--draft)."""
    return name != PLAIN and proposers.needs_model(name)


def _drafts_per_step(name: str) -> bool:
    """It costs a model's compute each draft (a draft model, the target's own head): not a
    free proposer the engine loads beside every plan."""
    return _costly(name) or _nextn_head(name)


def _label(asked: str, best: Candidate, free: Sequence[Candidate], adaptive: bool) -> str:
    """The proposer label the engine runs: what was asked, or for "auto" every free proposer
    that fits (the engine consults each per step and verifies the better draft) plus the
    draft model when it won. Free proposers cost microseconds and the adaptive controller
    drafts only where this request's measured acceptance pays, so they stay on even when the
    priors predict nothing; without adaptive control a predicted loss means the plain path."""
    if asked != AUTO:
        return asked
    if best.proposer == PLAIN and not (adaptive and free):
        return PLAIN
    names = [c.proposer for c in free]
    if _costly(best.proposer) or _nextn_head(best.proposer):
        names.append(best.proposer)
    return "+".join(names) or best.proposer
