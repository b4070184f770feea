"""What the search returns: each proposer evaluated (:class:`Candidate`) and the :class:`Plan`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..api.labels import PLAIN
from ..calibration.breakeven import needed_acceptance
from ..config import EngineConfig
from ..runtime.kernel import KernelConfig
from ..runtime.device import Device
from .acceptance_priors import Acceptance
from .memory import MemoryEstimate, kernel_note
from .remote import RpcPlacement
from .speed import SpeedModel


@dataclass(frozen=True)
class Candidate:
    """One proposer, evaluated: does it fit, and what is it predicted to do?

    ``config`` holds where it fits: n_ctx, kernel, n_gpu_layers, draft_gpu_layers, speed."""
    proposer: str
    fits: bool
    speedup: float = 1.0
    best_k: int = 0
    draft_range: tuple[int, int] = (0, 0)
    acceptance: Acceptance | None = None
    memory: MemoryEstimate | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class KernelOption:
    """Exact mode under one kernel configuration: its probed cap and predicted speed."""
    kernel: KernelConfig
    cap: int | None              # most drafts per pass that stay bitwise; None: not probed
    speedup: float | None = None
    tokens_per_second: float | None = None
    chosen: bool = False


@dataclass(frozen=True)
class Exactness:
    """What `--exact` would run here, read from the cached calibration's probe."""
    options: tuple[KernelOption, ...] = ()
    source: str = ""             # where the caps came from, or how to measure them

    @property
    def measured(self) -> bool:
        return any(o.cap is not None for o in self.options)

    def lines(self) -> list[str]:
        if not self.measured:
            return [f"  exact      {self.source}"]
        out = []
        for o in self.options:
            mark = "*" if o.chosen else " "
            cap = ("not probed" if o.cap is None else
                   f"cap {o.cap} draft{'s' if o.cap != 1 else ''} a pass ({o.cap + 1}-token verify)")
            speed = ""
            if o.speedup is not None:
                speed = f", predicted {o.speedup:.2f}x"
                if o.tokens_per_second:
                    speed += f" (~{o.tokens_per_second:.1f} tokens/s)"
            out.append(f"  exact {mark}   {'repacked' if o.kernel.repack else 'plain'} weights: {cap}{speed}")
        out.append(f"             ({self.source})")
        return out


_MODES = {True: "exact: greedy output bitwise the plain path's",
          False: "lossless: every token is the target's own choice in the pass that verifies it"}


@dataclass(frozen=True)
class Plan:
    """What the engine should load and run. ``config`` is that, as an EngineConfig with
    nothing left "auto"; ``reasons`` explain every choice."""
    target: str
    draft: str | None            # the draft model to load (None unless a model proposer is chosen)
    proposer: str                # the best single proposer, or "none"
    draft_range: tuple[int, int]   # (min, max) draft length worth trying (for "none": the free
                                 # proposers' range, for requests that pick one themselves)
    n_gpu_layers: int
    draft_gpu_layers: int
    n_ctx: int
    kernel: KernelConfig
    predicted_speedup: float
    memory: MemoryEstimate
    budget_host: int
    budget_device: int
    device: Device
    candidates: tuple[Candidate, ...]
    speed: SpeedModel
    reasons: tuple[str, ...]
    config: EngineConfig
    exactness: Exactness | None = None
    rpc: RpcPlacement | None = None    # the RPC split, with --rpc
    kernel_choice: tuple[str, ...] = ()  # the default mode's measured candidates (planner.kernels)

    @property
    def kv_type(self) -> str:
        return self.kernel.kv_type

    @property
    def n_batch(self) -> int:
        return self.kernel.n_batch

    @property
    def kv_ggml_type(self) -> int:
        return self.kernel.kv_ggml_type

    @property
    def predicted_tokens_per_second(self) -> float | None:
        if not self.speed.step_seconds:
            return None
        return self.predicted_speedup / self.speed.step_seconds

    def explain(self) -> str:
        runs = self.config.proposer
        lines = [f"plan for {Path(self.target).name}"
                 + (f" with draft {Path(self.draft).name}" if self.draft else ""),
                 f"  proposer   {runs}"
                 + (f" (best alone: {self.proposer})" if runs not in (self.proposer, PLAIN) else "")
                 + (f", draft length {self.draft_range[0]}-{self.draft_range[1]}"
                    if self.proposer != PLAIN else ""),
                 f"  predicted  {self.predicted_speedup:.2f}x plain decoding"
                 + (f" (~{self.predicted_tokens_per_second:.1f} tokens/s)"
                    if self.predicted_tokens_per_second else ""),
                 f"  mode       {_MODES[self.config.exact]}",
                 f"  context    {self.n_ctx} tokens, KV cache {self.kv_type}, batch {self.n_batch}",
                 f"  kernel     {kernel_note(self.kernel)}",
                 f"  offload    target {self.n_gpu_layers} layers, draft {self.draft_gpu_layers} layers"]
        if self.rpc is not None:
            lines += self.rpc.lines()
        if self.kernel_choice:
            lines += ["  default mode's kernel (fastest measured; --exact runs KV q8_0 with flash "
                      "attention, batch invariant):"]
            lines += [f"    {x}" for x in self.kernel_choice]
        if self.exactness is not None:
            lines += self.exactness.lines()
        where = ", RPC devices" if self.rpc is not None else ", GPU"
        lines += ["", "memory (host RSS" + (where if self.budget_device else "") + "):",
                  self.memory.table(with_device=bool(self.budget_device)),
                  "", "why:"]
        lines += [f"  - {r}" for r in self.reasons]
        lines += [f"  - {r}" for r in self.when_drafts_pay()]
        return "\n".join(lines)

    def when_drafts_pay(self) -> list[str]:
        """The acceptance a draft needs on this curve (calibration.breakeven), for the
        free proposers and, where one is priced, a draft model: what would make a proposer
        the plan leaves idle pay."""
        free = needed_acceptance(self.speed.cost, 0.0)
        out = [f"a free proposer (ngram, suffix) pays from {free.acceptance:.0%} of drafted "
               f"tokens accepted ({free.k}-token drafts, a pass costing {free.pass_steps:.2f} "
               "steps)" if free.acceptance is not None else
               "no draft pays on this curve, even a free one always accepted"]
        if self.speed.draft_ratio:
            model = needed_acceptance(self.speed.cost, self.speed.draft_ratio)
            out.append(f"a draft model at {self.speed.draft_ratio:.2f} of a target step per "
                       "token pays " + (f"from {model.acceptance:.0%} accepted ({model.k}-token "
                                        "drafts)" if model.acceptance is not None else
                                        "at no acceptance: its tokens cost more than the "
                                        "verify pass saves"))
        return out

    def to_dict(self) -> dict[str, Any]:
        k = self.kernel
        d: dict[str, Any] = {
            "target": self.target, "draft": self.draft, "proposer": self.proposer,
            "runs": self.config.proposer, "exact": self.config.exact,
            "draft_range": list(self.draft_range), "n_gpu_layers": self.n_gpu_layers,
            "draft_gpu_layers": self.draft_gpu_layers, "n_ctx": self.n_ctx,
            "kv_type": self.kv_type, "n_batch": self.n_batch,
            "kernel": {"repack": k.repack, "flash_attn": k.flash_attn, "kv_type": k.kv_type,
                       "n_batch": k.n_batch, "use_mmap": k.use_mmap},
            "predicted_speedup": round(self.predicted_speedup, 4),
            "memory": {"host": self.memory.host, "device": self.memory.device,
                       "host_at_load": self.memory.host_at_load,
                       "items": [{"name": i.name, "host": i.host, "device": i.device, "note": i.note}
                                 for i in self.memory.items]},
            "budget": {"host": self.budget_host, "device": self.budget_device},
            "candidates": [{"proposer": c.proposer, "fits": c.fits, "speedup": round(c.speedup, 4),
                            "best_k": c.best_k, "draft_range": list(c.draft_range), "note": c.note}
                           for c in self.candidates],
            "speed_source": self.speed.source, "reasons": list(self.reasons),
        }
        if self.rpc is not None:
            d["rpc"] = self.rpc.to_dict()
        if self.kernel_choice:
            d["kernel_choice"] = list(self.kernel_choice)
        if self.exactness is not None:
            d["exactness"] = {
                "source": self.exactness.source,
                "options": [{"repack": o.kernel.repack, "cap": o.cap, "chosen": o.chosen,
                             "predicted_speedup": None if o.speedup is None else round(o.speedup, 4)}
                            for o in self.exactness.options]}
        return d
