"""The plan's "why": one line per choice, including why the other proposers lost."""
from __future__ import annotations

from typing import Sequence

from ..api.labels import PLAIN
from ..runtime.kernel import KernelConfig
from ..runtime.device import Device, fmt_size
from ..runtime.gguf_facts import ModelFacts
from .memory import DEFAULT_BATCH
from .result import Candidate
from .speed import SpeedModel, break_even_alpha


def _kernel_reasons(chosen: KernelConfig, asked: KernelConfig, huge_pages: bool) -> list[str]:
    r = []
    if chosen.kv_type == asked.kv_type:
        r.append(f"KV cache: {chosen.kv_type} (the engine's kernel configuration"
                 + ("; flash attention keeps single-token decodes on the batch path)"
                    if chosen.flash_attn and chosen.kv_type != "f16" else ")"))
    else:
        r.append(f"KV cache: {chosen.kv_type} because a {asked.kv_type} cache does not fit at this context")
    if chosen.repack:
        if chosen.use_mmap != asked.use_mmap:
            how = ("; read into RAM instead of mapped, so the repacked matrices are not also "
                   "resident as file pages (fits the budget; slower to load, not shared with "
                   "other processes)")
        elif chosen.use_mmap:
            how = "; mapped from the file"
        elif huge_pages:
            how = ("; read into RAM on 2 MiB pages (decode ~5% faster than from the mapped "
                   "file's small pages, one copy resident; --mmap maps it)")
        else:
            how = "; read into RAM"
        r.append("weights: repacked for the CPU kernels (much cheaper verify passes)" + how)
    else:
        r.append("weights: not repacked" + (" (as asked)" if not asked.repack else ""))
    if chosen.n_batch != DEFAULT_BATCH:
        r.append(f"batch: {chosen.n_batch} (smaller compute buffers to fit; slower prompt processing)")
    return r


def explain_choice(best: Candidate, cands: Sequence[Candidate], dev: Device,
                   budgets: tuple[int, int], target: ModelFacts,
                   draft: ModelFacts | None, ctx: int, explicit_ctx: bool, budget_given: bool,
                   asked_kernel: KernelConfig, label: str) -> list[str]:
    r = _fit_reasons(best, dev, budgets, target, draft, ctx, explicit_ctx, budget_given,
                     asked_kernel)
    r.append(f"chosen {_pitch(best)}")
    if best.proposer == PLAIN and label != PLAIN:
        r.append(f"runs {label} anyway: free proposers cost microseconds, and the adaptive "
                 "controller drafts only where this request's measured acceptance beats a plain "
                 "step on the verify-cost curve (input-grounded text: summaries, code edits)")
    elif "+" in label:
        r.append(f"runs {label}: the engine asks each of them every step and verifies the "
                 "better-scoring draft")
    for c in cands:
        if c is best:
            continue
        r.append(f"not {c.proposer}: {c.note}" if not c.fits else f"not {_why_not(c, best)}")
    return r


def _fit_reasons(best: Candidate, dev: Device, budgets: tuple[int, int],
                 target: ModelFacts, draft: ModelFacts | None,
                 ctx: int, explicit_ctx: bool, budget_given: bool,
                 asked_kernel: KernelConfig) -> list[str]:
    """How the chosen configuration fits: device, budget, context, kernel, offload, costs."""
    host_budget, vram = budgets
    cfg = best.config
    sm: SpeedModel = cfg["speed"]
    r = [f"device: {dev.summary()}",
         f"budget: {fmt_size(host_budget)} host"
         + (f", {fmt_size(vram)} on {dev.gpu.name}" if dev.gpu is not None else "")
         + (" (--budget)" if budget_given else " (free memory minus a safety margin)")]
    mem = best.memory
    assert mem is not None  # the chosen candidate fits, so its memory was estimated
    r.append(f"fits: {fmt_size(mem.host)} host" + (f" + {fmt_size(mem.device)} GPU" if mem.device else "")
             + f" of the budget ({mem.host / max(host_budget, 1):.0%} host)")
    if cfg["n_ctx"] != ctx:
        r.append(f"context: reduced from {ctx} to {cfg['n_ctx']} tokens to fit the budget")
    else:
        r.append(f"context: {ctx} tokens ({'as asked' if explicit_ctx else 'default'}; "
                 f"trained for {target.n_ctx_train})")
    r += _kernel_reasons(cfg["kernel"], asked_kernel, dev.huge_pages)
    if dev.gpu is None:
        r.append("offload: none (no GPU in this llama.cpp build or device)")
    else:
        full = target.n_layers + 1
        r.append(f"offload: target {cfg['n_gpu_layers']}/{full} layers on {dev.gpu.name}"
                 + ("" if cfg["n_gpu_layers"] == full else " (the rest does not fit in its memory)")
                 + (f"; draft {cfg['draft_gpu_layers']}/{draft.n_layers + 1}"
                    if cfg["draft_gpu_layers"] and draft else ""))
    r.append(f"verify cost: {sm.describe()}")
    if sm.draft_ratio is not None:  # a draft model's, or the target's own head's
        r.append(f"draft cost: one draft token costs {sm.draft_ratio:.2f} of a target step ({sm.draft_source})")
    return r


def _pitch(c: Candidate) -> str:
    """A candidate's predicted speedup, draft length and acceptance, in one phrase."""
    if c.proposer == PLAIN:
        return f"{PLAIN}: 1.00x (plain decoding, the baseline)"
    a = c.acceptance
    acc = (f"acceptance {a.alpha:.0%}" + (f", drafts on {a.coverage:.0%} of steps" if a.coverage < 1 else "")
           + f" [{a.source}]") if a else ""
    speed: SpeedModel | None = c.config.get("speed")
    bridge = speed.draft_source if speed is not None and "bridged:" in speed.draft_source else ""
    return (f"{c.proposer}: {c.speedup:.2f}x at draft length {c.best_k} "
            f"(range {c.draft_range[0]}-{c.draft_range[1]}; {acc})"
            + (f" [{bridge[bridge.index('bridged:'):]}]" if bridge else ""))


def _why_not(c: Candidate, best: Candidate) -> str:
    """Why the fitting candidate ``c`` lost to ``best``."""
    cfg = best.config
    why = _pitch(c)
    csm: SpeedModel = c.config["speed"]
    if csm.draft_ratio is not None and c.acceptance is not None and c.acceptance.coverage >= 1 \
            and c.speedup < best.speedup:
        need = break_even_alpha(best.speedup, csm.cost, csm.draft_ratio or 0.0, kind=c.proposer)
        if need is None:
            why += "; no acceptance rate could make it win: drafting plus verifying costs more than it saves"
        else:
            why += f"; it would need {need:.0%} acceptance to match {best.proposer}"
        if csm.draft_ratio and csm.draft_ratio > 0.2:
            why += (f" (each draft token costs {csm.draft_ratio:.2f} of a target step, and verifying "
                    f"k tokens costs {csm.cost(2):.2f}x at k=1)")
    elif c.speedup < best.speedup:
        why += f"; predicted slower than {best.proposer}"
    else:
        why += f"; ties with {best.proposer}, which is cheaper or loses less when wrong"
    if c.config.get("n_ctx") != cfg["n_ctx"] or c.config.get("kernel") != cfg["kernel"]:
        ck = c.config["kernel"]
        why += f" (and only fits at ctx {c.config['n_ctx']}, KV {ck.kv_type}, batch {ck.n_batch})"
    return why
