"""The speed model: predicted goodput of each proposer relative to plain decoding.

A verify pass over n tokens costs ``cost(n)`` plain steps (calibration). With per-token
acceptance ``a`` a draft of k tokens yields E(a, k) = (1 - a^(k+1)) / (1 - a) tokens
(accepted prefix plus the target's own). A draft model proposes every step and pays
``r`` target-steps per drafted token:
    speedup = E(a, k) / (cost(k + 1) + r k)
A free proposer (n-gram, suffix) costs nothing to ask but only has a draft on a
fraction ``c`` (coverage) of steps; the others are plain steps:
    speedup = (c E(a, k) + 1 - c) / (c cost(k + 1) + 1 - c)
The plan takes the proposer with the highest predicted speedup at its best k, and
reports the range of k within a few percent of that best.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..api.labels import PLAIN
from ..runtime.device import Device
from ..runtime.gguf_facts import ModelFacts
from .acceptance_priors import Acceptance
from .nextn_head import head_step_ratio, trunk
from .memory import weight_bytes
from .trust import calibration_trust
from ..calibration.curve import Calibration, prior_step_seconds
from ..proposers import REGISTRY, needs_model
from dataclasses import replace

K_MAX = 16
#: A bridged draft (another tokenizer, docs/bridge.md) decodes about this many of its tokens
#: per target token it proposes, and the bridge itself (tokenize, align) costs this much per
#: step, measured apart from draft inference (SmolLM2-135M and Gemma-3-270M for Qwen here)
BRIDGE_DRAFT_PER_TARGET = 1.5
BRIDGE_SECONDS_PER_STEP = 0.7e-3
DRAFT_LEN_SLACK = 0.03                # a k within 3% of the best predicted speedup is in the range
CPU_GPU_BANDWIDTH_RATIO = 8.0         # how much slower a CPU-resident layer is than an offloaded one


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verify pass yields: the accepted draft prefix plus the target's own token."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(kind: str, k: int, acc: Acceptance, cost: Callable[[float], float],
                      draft_ratio: float = 0.0) -> float:
    """Goodput relative to plain decoding (see the module docstring)."""
    if kind == PLAIN or k <= 0:
        return 1.0
    e = expected_tokens(acc.alpha, k)
    if drafts_with_a_model(kind):
        return e / (cost(k + 1) + draft_ratio * k)
    c = acc.coverage
    return (c * e + 1.0 - c) / (c * cost(k + 1) + 1.0 - c)


def drafts_with_a_model(kind: str) -> bool:
    """A draft model's or the target's own NextN head's: every step drafts, each draft
    token costs ``draft_ratio`` target steps."""
    return needs_model(kind) or (kind in REGISTRY and REGISTRY[kind].nextn_head)


def head_speed(sm: SpeedModel, target: ModelFacts, target_cal: Calibration | None = None) -> SpeedModel:
    """``sm`` for drafting with the target's own NextN head: a draft token costs one head
    decode, measured at calibration (``mtp_step_seconds``, over the measured step) when the
    target's calibration is trusted and holds it, else the prior of :mod:`.heads`."""
    head_s = getattr(target_cal, "mtp_step_seconds", None)
    if head_s and calibration_trust(target_cal, prior_step_seconds(trunk(target).weight_bytes))[0]:
        assert target_cal is not None
        return replace(sm, draft_ratio=head_s / target_cal.step_seconds,
                       draft_source=f"the MTP head's decode measured at calibration "
                                    f"({head_s * 1000:.2f} ms a draft token)")
    return replace(sm, draft_ratio=head_step_ratio(target),
                   draft_source="prior: the bytes one MTP head decode reads over the trunk's "
                                "(not measured yet: `edgespec plan --calibrate` measures it)")


def best_k(kind: str, acc: Acceptance, cost: Callable[[float], float],
                   draft_ratio: float = 0.0, k_max: int = K_MAX) -> tuple[int, float, tuple[int, int]]:
    """(best k, its speedup, (k_min, k_max) within DRAFT_LEN_SLACK of it); k_max >= 1."""
    scores = {k: predicted_speedup(kind, k, acc, cost, draft_ratio) for k in range(1, max(k_max, 1) + 1)}
    k_best = max(scores, key=lambda k: (scores[k], -k))
    s = scores[k_best]
    near = [k for k, v in scores.items() if v >= s * (1 - DRAFT_LEN_SLACK)]
    return k_best, s, (min(near), max(near))


def break_even_alpha(target_speedup: float, cost: Callable[[float], float], draft_ratio: float,
                     k_max: int = K_MAX, kind: str = "draft") -> float | None:
    """Smallest per-token acceptance at which a draft model would reach ``target_speedup``."""
    def best(a: float) -> float:
        return best_k(kind, Acceptance(a, 1.0), cost, draft_ratio, k_max)[1]

    if best(0.999) < target_speedup:
        return None
    lo, hi = 0.0, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        if best(mid) >= target_speedup:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class SpeedModel:
    """The target's verify-cost curve on this device and a draft token's cost, with their origin."""
    cost: Callable[[float], float]
    step_seconds: float | None
    draft_ratio: float | None
    source: str
    draft_source: str = ""

    def describe(self, ns: Iterable[int] = (2, 4, 8, 16)) -> str:
        pts = ", ".join(f"{n} tokens {self.cost(n):.2f}x" for n in ns)
        step = f"one step {self.step_seconds * 1000:.0f} ms; " if self.step_seconds else ""
        return f"{step}a verify pass over {pts} a plain step ({self.source})"


def bridged(sm: SpeedModel) -> SpeedModel:
    """The speed model of a bridged draft: each proposed target token costs
    BRIDGE_DRAFT_PER_TARGET draft tokens, and every verify pass the bridge's own work."""
    over = BRIDGE_SECONDS_PER_STEP / sm.step_seconds if sm.step_seconds else 0.02
    base = sm.cost
    return replace(
        sm, cost=lambda n: base(n) + (over if n > 1 else 0.0),
        draft_ratio=(sm.draft_ratio or 0.0) * BRIDGE_DRAFT_PER_TARGET,
        draft_source=f"{sm.draft_source}; bridged: {BRIDGE_DRAFT_PER_TARGET:g} draft tokens per "
                     f"target token, and the bridge's own {BRIDGE_SECONDS_PER_STEP * 1e3:.1f} ms a "
                     f"step = {over:.3f} of a target step, measured apart from draft inference")


def curve_from_points(points: Mapping[Any, Any]) -> Callable[[float], float]:
    cal = Calibration.from_costs({int(k): float(v) for k, v in points.items()}, step_seconds=1.0)
    return cal.cost


def _blend(cpu: Callable[[float], float], gpu: Callable[[float], float],
           cpu_time_share: float) -> Callable[[float], float]:
    return lambda n: cpu_time_share * cpu(n) + (1 - cpu_time_share) * gpu(n)


def cpu_time_share(facts: ModelFacts, n_gpu_layers: int) -> float:
    """Fraction of a step spent in CPU-resident layers, by bytes and a bandwidth ratio."""
    if n_gpu_layers <= 0:
        return 1.0
    _, on_gpu = weight_bytes(facts, n_gpu_layers)
    on_cpu = max(facts.weight_bytes - on_gpu, 0)
    slow = on_cpu * CPU_GPU_BANDWIDTH_RATIO
    return slow / (slow + on_gpu) if slow + on_gpu else 0.0


def speed_model(dev: Device, target: ModelFacts, draft: ModelFacts | None, *,
                n_gpu_layers: int, draft_gpu_layers: int,
                target_cal: Calibration | None = None,
                draft_cal: Calibration | None = None) -> SpeedModel:
    """Pick the best available source for the cost curve and the draft's per-token cost."""
    speed = dict(dev.speed or {})
    gpu_curve = Calibration.linear(0.02).cost
    cpu_prior = Calibration.prior_cpu()
    cpu_step = prior_step_seconds(target.weight_bytes)
    share = cpu_time_share(target, n_gpu_layers)
    notes = []
    trusted_t, why_t = calibration_trust(target_cal, cpu_step)
    if target_cal is not None and not trusted_t:
        notes.append(f"ignored the cached calibration of the target: {why_t}; re-measure on a quiet "
                     "machine with `edgespec plan --recalibrate`")
    cost: Callable[[float], float]
    step: float | None
    if trusted_t and target_cal is not None:  # trusted: never None
        cost, step, source = target_cal.cost, target_cal.step_seconds, \
            f"calibration measured on this device ({target_cal.source})"
        if why_t:
            source += f"; {why_t}"
    elif speed.get("verify_costs"):
        cost = curve_from_points(speed["verify_costs"])
        step = float(speed["step_ms"]) / 1000 if speed.get("step_ms") else None
        source = "the device description's verify_costs"
    elif dev.gpu is not None and n_gpu_layers > 0:
        cost = _blend(cpu_prior.cost, gpu_curve, share)
        step = None
        source = ("prior: GPU passes nearly flat in batch size" if share < 0.01 else
                  f"prior: {share:.0%} of step time on CPU layers, blended CPU/GPU curves")
    else:
        cost, step = cpu_prior.cost, cpu_step
        source = "prior from a 2-core CPU (docs/models.md)"
        if target_cal is None and not dev.synthetic:
            source += "; `edgespec plan --calibrate` measures this device"

    ratio, dsrc = None, ""
    if draft is not None:
        if "draft_step_ratio" in speed:
            ratio, dsrc = float(speed["draft_step_ratio"]), "the device description's draft_step_ratio"
        elif trusted_t and target_cal is not None and draft_cal is not None and calibration_trust(
                draft_cal, cpu_step * draft.weight_bytes / max(target.weight_bytes, 1))[0]:
            ratio = draft_cal.step_seconds / target_cal.step_seconds
            dsrc = "measured step times of both models"
        else:
            ratio = draft.weight_bytes / max(target.weight_bytes, 1)
            dsrc = "weight-bytes ratio (decode is memory-bound)"
            d_share = cpu_time_share(draft, draft_gpu_layers)
            if n_gpu_layers > 0 and d_share > share:
                # a draft left on the CPU while the target runs on the GPU is that much slower
                ratio *= (d_share * CPU_GPU_BANDWIDTH_RATIO + 1 - d_share) / \
                         (share * CPU_GPU_BANDWIDTH_RATIO + 1 - share)
                dsrc += ", slowed by CPU placement"
    if notes:
        source += "; " + "; ".join(notes)
    return SpeedModel(cost=cost, step_seconds=step, draft_ratio=ratio, source=source,
                      draft_source=dsrc)
