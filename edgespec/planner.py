"""The memory- and speed-budget planner: which proposer, how much offload, what context.

A plan answers, for one target (and optionally a draft model) on one device:
does it fit, and which way of speculating is predicted to be fastest? It
never loads weights to decide: model sizes come from GGUF headers
(:mod:`edgespec.gguf_facts`), the device from :mod:`edgespec.device`, costs
from the calibration cache (:mod:`edgespec.calibration`), expected acceptance
from the registry's qualification results when they exist.

Memory model (host RAM and accelerator memory, per component)
    runtime       the Python process with llama.cpp loaded (measured: 48 MiB), plus
                  the engine and its native proposers (measured: ~12 MiB)
    weights       the mmapped GGUF: layers offloaded to the GPU (llama.cpp puts
                  the *last* ``n_gpu_layers - 1`` blocks and the output layer
                  there) leave host memory, the input embeddings never do
    tokenizer     llama.cpp's vocabulary tables (measured: ~175 B per token
                  plus ~150 B per BPE merge rule)
    KV cache      padded context (256) x per-layer KV heads x (K + V head dims)
                  x bytes per element of the cache type (f16 2, q8_0 34/32,
                  q4_0 18/32); sliding-window layers hold only window + batch
                  cells unless the cache is "swa_full" (llama.cpp's default,
                  which speculative rollback needs)
    compute       llama.cpp *allocates* n_ubatch x (4 n_vocab + 8 n_embd) bytes
                  (the worst-case graph keeps logits for every batch row), but
                  on the CPU only the pages a pass touches become resident:
                  about 14 (n_ff + n_embd) bytes per prefill token plus 3 MiB.
                  Accelerator memory is committed at allocation, so there the
                  full allocation counts.
    logits        verify passes ask for rows x n_vocab float32 logits, held by
                  llama.cpp's output buffer and by the engine's numpy copy
    proposers     the suffix cache's cap and the n-gram index (the engine
                  always loads the free proposers)
The host figure is what ``ps`` will show as RSS after a full-batch prefill and
a verify pass (see docs/planner.md for estimate vs measured).

Speed model (relative to a plain one-token step of the target)
    A verify pass over n tokens costs ``cost(n)`` (calibration). With per-token
    acceptance ``a`` a draft of k tokens yields E(a, k) = (1 - a^(k+1)) / (1 - a)
    tokens (accepted prefix plus the target's own). A draft model proposes every
    step and pays ``r`` target-steps per drafted token:
        speedup = E(a, k) / (cost(k + 1) + r k)
    A free proposer (n-gram, suffix) costs nothing to ask but only has a draft
    on a fraction ``c`` (coverage) of steps; the others are plain steps:
        speedup = (c E(a, k) + 1 - c) / (c cost(k + 1) + 1 - c)
    The plan takes the proposer with the highest predicted speedup at its best
    k, and reports the range of k within a few percent of that best.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from . import device as devmod
from .device import Device, fmt_size, parse_size
from .errors import EdgespecError, InvalidInputError, ModelError
from .gguf_facts import ModelFacts, read_facts

# --- measured constants (llama-cpp-python 0.3.36, CPython 3.11; docs/planner.md) ------------
RUNTIME_BYTES = 48 * 2**20            # RSS of python + numpy + llama.cpp initialised
VOCAB_BYTES_PER_TOKEN = 175           # llama.cpp's vocabulary tables, anonymous memory...
VOCAB_BYTES_PER_MERGE = 150           # ...and its BPE merge ranks
ENGINE_BYTES = 12 * 2**20             # Engine.load on top of the backend (native lib, tables)
COMPUTE_BYTES_PER_TOKEN_UNIT = 14     # x (n_ff + n_embd) per batch token actually touched on CPU
COMPUTE_FIXED_BYTES = 3 * 2**20
# --- not measurable here (no GPU): llama.cpp's allocation rules plus a CUDA/Metal runtime reserve
GPU_RUNTIME_BYTES = 384 * 2**20
CPU_GPU_BANDWIDTH_RATIO = 8.0         # how much slower a CPU-resident layer is than an offloaded one

KV_TYPES = ("f16", "q8_0", "q4_0")
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
KV_GGML_TYPE = {"f16": 1, "q8_0": 8, "q4_0": 2}   # enum ggml_type, for llama_context_params.type_k/v
CTX_PAD = 256
MIN_CTX = 512
DEFAULT_CTX = 4096
DEFAULT_BATCH = 512
BATCH_CHOICES = (512, 256, 128)
K_MAX = 16
SUFFIX_CACHE_CAP = 64 * 2**20
NGRAM_BYTES_PER_TOKEN = 32
DRAFT_LEN_SLACK = 0.03                # a k within 3% of the best predicted speedup is in the range


@dataclass(frozen=True)
class Acceptance:
    """What a proposer is expected to achieve: per-token acceptance and how often it drafts."""
    alpha: float          # P(a drafted token is accepted | the ones before it were)
    coverage: float       # fraction of steps with a draft (1 for a draft model)
    source: str = "default"


#: Conservative until `edgespec qualify` measures the pair on this machine: a same-family
#: draft model accepts ~70% of tokens; model-free proposers draft on a minority of steps.
DEFAULT_ACCEPTANCE = {
    "draft": Acceptance(0.70, 1.0),
    "suffix": Acceptance(0.55, 0.30),
    "ngram": Acceptance(0.50, 0.25),
}


class BudgetError(EdgespecError):
    """Even the target alone does not fit the memory budget; the message says what would."""


# =============================================================================== memory
@dataclass(frozen=True)
class MemoryItem:
    name: str
    host: int
    device: int = 0
    note: str = ""


@dataclass(frozen=True)
class MemoryEstimate:
    items: tuple[MemoryItem, ...]

    @property
    def host(self) -> int:
        return sum(i.host for i in self.items)

    @property
    def device(self) -> int:
        return sum(i.device for i in self.items)

    @property
    def host_at_load(self) -> int:
        """Right after loading: no compute pages touched, no logits, proposer caches still empty."""
        return sum(i.host for i in self.items
                   if not i.name.endswith(("compute", "logits", "suffix cache", "n-gram index")))

    def table(self, with_device: bool = False) -> str:
        rows = []
        for i in self.items:
            dev = f"  {fmt_size(i.device):>10}" if with_device else ""
            rows.append(f"  {i.name:<24} {fmt_size(i.host):>10}{dev}  {i.note}".rstrip())
        dev = f"  {fmt_size(self.device):>10}" if with_device else ""
        rows.append(f"  {'total':<24} {fmt_size(self.host):>10}{dev}")
        return "\n".join(rows)


def pad_ctx(n_ctx: int) -> int:
    return -(-n_ctx // CTX_PAD) * CTX_PAD


def gpu_layer_start(facts: ModelFacts, n_gpu_layers: int) -> int:
    """First block index llama.cpp places on the GPU (the output layer counts as one more)."""
    return max(facts.n_layers + 1 - max(n_gpu_layers, 0), 0)


def kv_bytes(facts: ModelFacts, n_ctx: int, kv_type: str, n_batch: int = DEFAULT_BATCH,
             n_gpu_layers: int = 0, swa_full: bool = True) -> tuple[int, int]:
    """(host, device) bytes of one sequence's KV cache."""
    per = KV_BYTES_PER_ELEMENT[kv_type]
    cells_full = pad_ctx(n_ctx)
    cells_swa = cells_full if swa_full else min(cells_full, pad_ctx(facts.sliding_window + n_batch))
    start = gpu_layer_start(facts, n_gpu_layers)
    host = dev = 0.0
    for il in range(facts.n_layers):
        cells = cells_swa if facts.swa_layers[il] else cells_full
        b = cells * facts.n_head_kv_per_layer[il] * (facts.head_dim_k + facts.head_dim_v) * per
        if il >= start:
            dev += b
        else:
            host += b
    return int(host), int(dev)


def weight_bytes(facts: ModelFacts, n_gpu_layers: int) -> tuple[int, int]:
    """(host, device) bytes of weights (tensor data: the header is read, not kept mapped)."""
    if n_gpu_layers <= 0:
        return facts.weight_bytes, 0
    start = gpu_layer_start(facts, n_gpu_layers)
    on_gpu = sum(facts.layer_bytes[start:])
    # the output layer goes with the first offloaded "layer"; tied embeddings get a GPU copy
    out = facts.output_bytes if facts.output_bytes else facts.token_embd_bytes
    host = facts.weight_bytes - on_gpu - facts.output_bytes
    return host, on_gpu + out


def compute_bytes(facts: ModelFacts, n_batch: int, rows: int, n_gpu_layers: int) -> tuple[int, int]:
    """(host resident, device allocated) compute buffer bytes (see the module docstring)."""
    allocated = n_batch * (4 * facts.n_vocab + 8 * facts.n_embd)
    per_tok = COMPUTE_BYTES_PER_TOKEN_UNIT * (facts.n_ff + facts.n_embd)
    start = min(gpu_layer_start(facts, n_gpu_layers), facts.n_layers)
    cpu_share = start / facts.n_layers if facts.n_layers else 1.0
    touched = max(n_batch * per_tok, rows * (per_tok + 4 * facts.n_vocab))
    host = int(min(allocated, touched * cpu_share) + COMPUTE_FIXED_BYTES)
    dev = allocated if n_gpu_layers > 0 else 0
    return host, dev


def model_memory(label: str, facts: ModelFacts, *, n_ctx: int, kv_type: str, n_batch: int,
                 n_gpu_layers: int, rows: int) -> list[MemoryItem]:
    wh, wd = weight_bytes(facts, n_gpu_layers)
    kh, kd = kv_bytes(facts, n_ctx, kv_type, n_batch, n_gpu_layers)
    ch, cd = compute_bytes(facts, n_batch, rows, n_gpu_layers)
    offl = f", {n_gpu_layers}/{facts.n_layers + 1} layers on GPU" if n_gpu_layers > 0 else ""
    swa = f", window {facts.sliding_window} on {facts.n_swa_layers} layers" if facts.sliding_window else ""
    return [
        MemoryItem(f"{label} weights", wh, wd, f"{Path(facts.path).name}{offl}"),
        MemoryItem(f"{label} tokenizer",
                   VOCAB_BYTES_PER_TOKEN * facts.n_vocab + VOCAB_BYTES_PER_MERGE * facts.n_merges, 0,
                   f"{facts.n_vocab} tokens" + (f", {facts.n_merges} merges" if facts.n_merges else "")),
        MemoryItem(f"{label} KV cache", kh, kd, f"{kv_type}, {pad_ctx(n_ctx)} cells{swa}"),
        MemoryItem(f"{label} compute", ch, cd, f"batch {n_batch}"),
        MemoryItem(f"{label} logits", 2 * rows * facts.n_vocab * 4, 0,
                   f"{rows} row{'s' if rows > 1 else ''} x {facts.n_vocab}"),
    ]


def estimate_memory(target: ModelFacts, *, n_ctx: int, kv_type: str = "f16",
                    n_batch: int = DEFAULT_BATCH, n_gpu_layers: int = 0,
                    draft: ModelFacts | None = None, draft_gpu_layers: int = 0,
                    verify_rows: int = K_MAX + 1, suffix_cap: int = SUFFIX_CACHE_CAP,
                    free_proposers: bool = True) -> MemoryEstimate:
    """Memory of a loaded engine: target (+ draft) with one context each, at their peak."""
    items = [MemoryItem("runtime", RUNTIME_BYTES, 0, "python + llama.cpp")]
    items += model_memory("target", target, n_ctx=n_ctx, kv_type=kv_type, n_batch=n_batch,
                          n_gpu_layers=n_gpu_layers, rows=verify_rows)
    if draft is not None:
        items += model_memory("draft", draft, n_ctx=n_ctx, kv_type=kv_type, n_batch=n_batch,
                              n_gpu_layers=draft_gpu_layers, rows=1)
    if free_proposers:
        items.append(MemoryItem("engine", ENGINE_BYTES, 0, "engine, native proposers"))
        items.append(MemoryItem("suffix cache", suffix_cap, 0, "cap"))
        items.append(MemoryItem("n-gram index", NGRAM_BYTES_PER_TOKEN * n_ctx, 0, "per request"))
    if n_gpu_layers > 0 or (draft is not None and draft_gpu_layers > 0):
        items.append(MemoryItem("GPU runtime", 0, GPU_RUNTIME_BYTES, "driver, BLAS workspace (estimate)"))
    return MemoryEstimate(tuple(items))


def default_budgets(dev: Device, budget: int | str | None = None) -> tuple[int, int]:
    """(host, accelerator) budgets: what is free minus a safety margin, unless overridden."""
    if budget is not None:
        host = parse_size(budget)
    else:
        host = dev.ram_available - max(512 * 2**20, dev.ram_total // 20)
    gpu = dev.gpu
    vram = 0
    if gpu is not None:
        vram = gpu.free_bytes - max(256 * 2**20, gpu.total_bytes // 20)
    return max(host, 0), max(vram, 0)


# =============================================================================== speed
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
    if kind == "none" or k <= 0:
        return 1.0
    e = expected_tokens(acc.alpha, k)
    if kind == "draft":
        return e / (cost(k + 1) + draft_ratio * k)
    c = acc.coverage
    return (c * e + 1.0 - c) / (c * cost(k + 1) + 1.0 - c)


def best_draft_len(kind: str, acc: Acceptance, cost: Callable[[float], float],
                   draft_ratio: float = 0.0, k_max: int = K_MAX) -> tuple[int, float, tuple[int, int]]:
    """(best k, its speedup, (k_min, k_max) within DRAFT_LEN_SLACK of it)."""
    scores = {k: predicted_speedup(kind, k, acc, cost, draft_ratio) for k in range(1, k_max + 1)}
    k_best = max(scores, key=lambda k: (scores[k], -k))
    s = scores[k_best]
    near = [k for k, v in scores.items() if v >= s * (1 - DRAFT_LEN_SLACK)]
    return k_best, s, (min(near), max(near))


def break_even_alpha(target_speedup: float, cost: Callable[[float], float], draft_ratio: float,
                     k_max: int = K_MAX) -> float | None:
    """Smallest per-token acceptance at which a draft model would reach ``target_speedup``."""
    def best(a: float) -> float:
        return best_draft_len("draft", Acceptance(a, 1.0), cost, draft_ratio, k_max)[1]

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


def _curve_from_points(points: Mapping) -> Callable[[float], float]:
    from .calibration import Calibration
    cal = Calibration.from_costs({int(k): float(v) for k, v in points.items()}, step_seconds=1.0)
    return cal.cost


def _blend(cpu: Callable[[float], float], gpu: Callable[[float], float], cpu_time_share: float):
    return lambda n: cpu_time_share * cpu(n) + (1 - cpu_time_share) * gpu(n)


def _cpu_time_share(facts: ModelFacts, n_gpu_layers: int) -> float:
    """Fraction of a step spent in CPU-resident layers, by bytes and a bandwidth ratio."""
    if n_gpu_layers <= 0:
        return 1.0
    _, on_gpu = weight_bytes(facts, n_gpu_layers)
    on_cpu = max(facts.weight_bytes - on_gpu, 0)
    slow = on_cpu * CPU_GPU_BANDWIDTH_RATIO
    return slow / (slow + on_gpu) if slow + on_gpu else 0.0


def speed_model(dev: Device, target: ModelFacts, draft: ModelFacts | None, *,
                n_gpu_layers: int, draft_gpu_layers: int,
                target_cal=None, draft_cal=None) -> SpeedModel:
    """Pick the best available source for the cost curve and the draft's per-token cost."""
    from .calibration import Calibration, prior_step_seconds

    speed = dict(dev.speed or {})
    gpu_curve = Calibration.linear(0.02).cost
    cpu_prior = Calibration.prior_cpu()
    cpu_step = prior_step_seconds(target.weight_bytes)
    share = _cpu_time_share(target, n_gpu_layers)
    notes = []
    trusted_t, why_t = calibration_trust(target_cal, cpu_step)
    if target_cal is not None and not trusted_t:
        notes.append(f"ignored the cached calibration of the target: {why_t}; re-measure on a quiet "
                     "machine with `edgespec plan --recalibrate`")
    if trusted_t:
        cost, step, source = target_cal.cost, target_cal.step_seconds, \
            f"calibration measured on this device ({target_cal.source})"
        if why_t:
            source += f"; {why_t}"
    elif speed.get("verify_costs"):
        cost = _curve_from_points(speed["verify_costs"])
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
        elif trusted_t and calibration_trust(
                draft_cal, cpu_step * draft.weight_bytes / max(target.weight_bytes, 1))[0]:
            ratio = draft_cal.step_seconds / target_cal.step_seconds
            dsrc = "measured step times of both models"
        else:
            ratio = draft.weight_bytes / max(target.weight_bytes, 1)
            dsrc = "weight-bytes ratio (decode is memory-bound)"
            d_share = _cpu_time_share(draft, draft_gpu_layers)
            if n_gpu_layers > 0 and d_share > share:
                # a draft left on the CPU while the target runs on the GPU is that much slower
                ratio *= (d_share * CPU_GPU_BANDWIDTH_RATIO + 1 - d_share) / \
                         (share * CPU_GPU_BANDWIDTH_RATIO + 1 - share)
                dsrc += ", slowed by CPU placement"
    if notes:
        source += "; " + "; ".join(notes)
    return SpeedModel(cost=cost, step_seconds=step, draft_ratio=ratio, source=source,
                      draft_source=dsrc)


#: Repeats of one pass on a quiet machine agree within a few percent; far more spread means
#: other work held the cores while it was measured, and the curve's shape is noise.
MAX_CALIBRATION_SPREAD = 0.10


def calibration_trust(cal, expected_step: float) -> tuple[bool, str]:
    """(usable, remark) for a cached calibration: refuse ones timed under heavy load.

    The spread is the median over batch sizes of the repeats' median absolute deviation
    relative to their median. A one-token step more than 10x off what the model's size
    suggests is refused too, beyond 4x only remarked on (slow boards exist).
    """
    if cal is None:
        return False, ""
    import statistics

    spreads = []
    for samples in (getattr(cal, "samples", None) or {}).values():
        if len(samples) >= 3:
            m = statistics.median(samples)
            if m > 0:
                spreads.append(statistics.median(abs(x - m) for x in samples) / m)
    if spreads and statistics.median(spreads) > MAX_CALIBRATION_SPREAD:
        return False, (f"its repeats vary by ±{statistics.median(spreads):.0%} "
                       "(timed while other work held the cores)")
    ratio = cal.step_seconds / expected_step if expected_step > 0 else 1.0
    if not 0.1 < ratio < 10:
        return False, f"its {cal.step_seconds * 1000:.0f} ms step is {ratio:.1f}x what the model's size suggests"
    if not 0.25 < ratio < 4:
        return True, (f"its {cal.step_seconds * 1000:.0f} ms step is {ratio:.1f}x what the model's "
                      "size suggests")
    return True, ""


# =============================================================================== acceptance
def acceptance_for(kind: str, target_name: str | None, draft_name: str | None = None) -> Acceptance:
    """Qualification results for a registered pair (median over workload slices), else defaults.

    Reads ``acceptance`` (per drafted token) and ``coverage`` (fraction of steps
    with a draft) from each slice record.
    """
    default = DEFAULT_ACCEPTANCE[kind]
    if not target_name:
        return default
    try:
        from . import registry
        key = f"draft:{draft_name}" if kind == "draft" and draft_name else kind
        slices = registry.qualification(target_name, key)
    except Exception:  # unregistered pair, registry unavailable, unreadable file: defaults
        return default
    alphas = [float(r["acceptance"]) for r in slices.values()
              if isinstance(r.get("acceptance"), (int, float)) and 0 <= r["acceptance"] <= 1]
    covs = [float(r["coverage"]) for r in slices.values()
            if isinstance(r.get("coverage"), (int, float)) and 0 <= r["coverage"] <= 1]
    if not alphas:
        return default
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return Acceptance(min(med(alphas), 0.99), med(covs) if covs else default.coverage,
                      source=f"qualification ({len(alphas)} slices)")


# =============================================================================== the plan
@dataclass(frozen=True)
class Candidate:
    """One proposer, evaluated: does it fit, and what is it predicted to do?"""
    proposer: str
    fits: bool
    speedup: float = 1.0
    best_k: int = 0
    draft_len: tuple[int, int] = (0, 0)
    acceptance: Acceptance | None = None
    memory: MemoryEstimate | None = None
    config: Mapping = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """What the engine should load and run. ``reasons`` explain every choice."""
    target: str
    draft: str | None            # the draft model to load (None unless proposer == "draft")
    proposer: str                # "draft" | "suffix" | "ngram" | "none"
    draft_len: tuple[int, int]   # (min, max) draft length worth trying (for "none": the free
                                 # proposers' range, for requests that pick one themselves)
    n_gpu_layers: int
    draft_gpu_layers: int
    n_ctx: int
    kv_type: str                 # "f16" | "q8_0" | "q4_0"
    n_batch: int
    predicted_speedup: float
    memory: MemoryEstimate
    budget_host: int
    budget_device: int
    device: Device
    candidates: tuple[Candidate, ...]
    speed: SpeedModel
    reasons: tuple[str, ...]

    @property
    def kv_ggml_type(self) -> int:
        return KV_GGML_TYPE[self.kv_type]

    @property
    def predicted_tokens_per_second(self) -> float | None:
        if not self.speed.step_seconds:
            return None
        return self.predicted_speedup / self.speed.step_seconds

    def explain(self) -> str:
        lines = [f"plan for {Path(self.target).name}"
                 + (f" with draft {Path(self.draft).name}" if self.draft else ""),
                 f"  proposer   {self.proposer}"
                 + (f", draft length {self.draft_len[0]}-{self.draft_len[1]}"
                    if self.proposer != "none" else ""),
                 f"  predicted  {self.predicted_speedup:.2f}x plain decoding"
                 + (f" (~{self.predicted_tokens_per_second:.1f} tokens/s)"
                    if self.predicted_tokens_per_second else ""),
                 f"  context    {self.n_ctx} tokens, KV cache {self.kv_type}, batch {self.n_batch}",
                 f"  offload    target {self.n_gpu_layers} layers, draft {self.draft_gpu_layers} layers",
                 "", "memory (host RSS" + (", GPU" if self.budget_device else "") + "):",
                 self.memory.table(with_device=bool(self.budget_device)),
                 "", "why:"]
        lines += [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "target": self.target, "draft": self.draft, "proposer": self.proposer,
            "draft_len": list(self.draft_len), "n_gpu_layers": self.n_gpu_layers,
            "draft_gpu_layers": self.draft_gpu_layers, "n_ctx": self.n_ctx,
            "kv_type": self.kv_type, "n_batch": self.n_batch,
            "predicted_speedup": round(self.predicted_speedup, 4),
            "memory": {"host": self.memory.host, "device": self.memory.device,
                       "items": [{"name": i.name, "host": i.host, "device": i.device, "note": i.note}
                                 for i in self.memory.items]},
            "budget": {"host": self.budget_host, "device": self.budget_device},
            "candidates": [{"proposer": c.proposer, "fits": c.fits, "speedup": round(c.speedup, 4),
                            "best_k": c.best_k, "draft_len": list(c.draft_len), "note": c.note}
                           for c in self.candidates],
            "speed_source": self.speed.source, "reasons": list(self.reasons),
        }


def _ctx_ladder(n_ctx: int, explicit: bool) -> list[int]:
    if explicit:
        return [n_ctx]
    out, c = [], n_ctx
    while c >= MIN_CTX:
        out.append(c)
        c //= 2
    return out or [n_ctx]


def _configs(n_ctx: int, explicit_ctx: bool, kv_type: str | None) -> list[tuple[int, str, int]]:
    """(ctx, kv type, batch) in order of preference: keep the context, then KV precision."""
    kvs = [kv_type] if kv_type else ["f16", "q8_0"]
    out = [(c, kv, b) for c in _ctx_ladder(n_ctx, explicit_ctx) for kv in kvs for b in BATCH_CHOICES]
    if not kv_type:
        out += [(c, "q4_0", b) for c in _ctx_ladder(n_ctx, explicit_ctx) for b in BATCH_CHOICES]
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


def _place(target: ModelFacts, draft: ModelFacts | None, cfg, vram: int, rows: int,
           suffix_cap: int) -> tuple[int, int]:
    """GPU layers for target then draft: the target gets the accelerator first."""
    if vram <= 0:
        return 0, 0
    ctx, kv, nb = cfg

    def dev_mem(g_t: int, g_d: int) -> int:
        return estimate_memory(target, n_ctx=ctx, kv_type=kv, n_batch=nb, n_gpu_layers=g_t,
                               draft=draft, draft_gpu_layers=g_d, verify_rows=rows,
                               suffix_cap=suffix_cap).device

    g_t = _max_offload(target, lambda g: dev_mem(g, 0) <= vram)
    g_d = 0
    if draft is not None and g_t == target.n_layers + 1:
        g_d = _max_offload(draft, lambda g: dev_mem(g_t, g) <= vram)
    return g_t, g_d


def _evaluate(kind: str, target: ModelFacts, draft: ModelFacts | None, dev: Device,
              budgets: tuple[int, int], configs, acc: Acceptance | None, speed_for,
              suffix_cap: int) -> Candidate:
    """The first (ctx, KV type) in preference order where ``kind`` fits, and its predicted speed.

    Among the batch sizes that fit at that (ctx, KV type) the one that offloads the most
    layers wins (offload is worth far more than a larger prompt batch), then the larger batch.
    """
    host_budget, vram = budgets
    use_draft = draft if kind == "draft" else None
    rows = K_MAX + 1 if kind != "none" else 1
    groups: dict[tuple[int, str], list[int]] = {}
    for ctx, kv, nb in configs:
        groups.setdefault((ctx, kv), []).append(nb)
    for (ctx, kv), batches in groups.items():
        fitting = []
        for nb in batches:
            g_t, g_d = _place(target, use_draft, (ctx, kv, nb), vram, rows, suffix_cap)
            mem = estimate_memory(target, n_ctx=ctx, kv_type=kv, n_batch=nb, n_gpu_layers=g_t,
                                  draft=use_draft, draft_gpu_layers=g_d, verify_rows=rows,
                                  suffix_cap=suffix_cap)
            if mem.host <= host_budget and mem.device <= vram:
                fitting.append((g_t, g_d, nb, mem))
        if not fitting:
            continue
        g_t, g_d, nb, mem = max(fitting, key=lambda f: (f[0], f[1], f[2]))
        sm = speed_for(g_t, g_d)
        if kind == "none":
            k, s, rng = 0, 1.0, (0, 0)
        else:
            k, s, rng = best_draft_len(kind, acc, sm.cost, sm.draft_ratio or 0.0)
        return Candidate(kind, True, s, k, rng, acc, mem,
                         {"n_ctx": ctx, "kv_type": kv, "n_batch": nb, "n_gpu_layers": g_t,
                          "draft_gpu_layers": g_d, "speed": sm})
    ctx, kv, nb = configs[-1]
    least = estimate_memory(target, n_ctx=ctx, kv_type=kv, n_batch=nb, draft=use_draft,
                            verify_rows=rows, suffix_cap=suffix_cap)
    what = f"the draft's weights are {fmt_size(draft.weight_bytes)}; " if use_draft else ""
    return Candidate(kind, False, acceptance=acc,
                     note=f"does not fit: {what}needs at least {fmt_size(least.host)} host "
                          f"(ctx {ctx}, KV {kv}) against a budget of {fmt_size(host_budget)}")


def _smallest_fit_message(target: ModelFacts, dev: Device, budgets, n_ctx: int, explicit_ctx: bool,
                          kv_type: str | None, suffix_cap: int) -> str:
    host_budget, vram = budgets
    kv = kv_type or "q4_0"
    floor_ctx = n_ctx if explicit_ctx else MIN_CTX
    need = estimate_memory(target, n_ctx=floor_ctx, kv_type=kv, n_batch=BATCH_CHOICES[-1],
                           verify_rows=1, suffix_cap=suffix_cap)
    name = Path(target.path).name
    parts = [f"{name} does not fit: even with context {floor_ctx}, a {kv} KV cache and batch "
             f"{BATCH_CHOICES[-1]} it needs {fmt_size(need.host)} of host memory "
             f"(weights {fmt_size(target.weight_bytes)}), but the budget is {fmt_size(host_budget)}."]
    fixes = [f"raise --budget to at least {fmt_size(need.host)} (or free "
             f"{fmt_size(need.host - host_budget)} of RAM)"]
    if explicit_ctx and n_ctx > MIN_CTX:
        small = estimate_memory(target, n_ctx=MIN_CTX, kv_type=kv, n_batch=BATCH_CHOICES[-1],
                                verify_rows=1, suffix_cap=suffix_cap)
        if small.host <= host_budget:
            c = n_ctx
            while c > MIN_CTX and estimate_memory(target, n_ctx=c, kv_type=kv, n_batch=BATCH_CHOICES[-1],
                                                  verify_rows=1, suffix_cap=suffix_cap).host > host_budget:
                c //= 2
            fixes.insert(0, f"lower --ctx to {max(c, MIN_CTX)}")
    if dev.gpu is None:
        fixes.append("use a smaller quantization of the model (fewer bits per weight)")
    else:
        fixes.append(f"free memory on {dev.gpu.name} so more layers can be offloaded")
    return parts[0] + " Smallest change that fits: " + "; or ".join(fixes) + "."


def plan(target: ModelFacts, draft: ModelFacts | None = None, *, device: Device | None = None,
         budget: int | str | None = None, ctx: int | None = None, kv_type: str | None = None,
         target_name: str | None = None, draft_name: str | None = None,
         calibrations: Mapping[str, object] | None = None,
         suffix_cap: int = SUFFIX_CACHE_CAP) -> Plan:
    """Choose proposer, draft length, offload, context and KV type for ``target`` on ``device``.

    ``calibrations`` may hold measured :class:`edgespec.calibration.Calibration`
    objects under "target" and "draft" (valid for this device, CPU-only layout).
    Raises :class:`BudgetError` when even the target alone cannot fit.
    """
    dev = device or devmod.probe()
    budgets = default_budgets(dev, budget)
    if kv_type is not None and kv_type not in KV_TYPES:
        raise InvalidInputError(f"unknown KV cache type {kv_type!r}; choose one of {', '.join(KV_TYPES)}")
    explicit_ctx = ctx is not None
    if ctx is None:
        ctx = min(DEFAULT_CTX, target.n_ctx_train)
    if ctx <= 0:
        raise InvalidInputError(f"context size must be positive (got {ctx})")
    if ctx > target.n_ctx_train:
        raise InvalidInputError(f"--ctx {ctx} exceeds what {Path(target.path).name} was trained for "
                                f"({target.n_ctx_train})")
    configs = _configs(ctx, explicit_ctx, kv_type)
    cals = dict(calibrations or {})

    def speed_for(g_t: int, g_d: int) -> SpeedModel:
        # a measured calibration holds for the CPU layout it was measured with
        tc = cals.get("target") if g_t == 0 and not dev.synthetic else None
        dc = cals.get("draft") if g_d == 0 and not dev.synthetic else None
        return speed_model(dev, target, draft, n_gpu_layers=g_t, draft_gpu_layers=g_d,
                           target_cal=tc, draft_cal=dc)

    cands: list[Candidate] = []
    for kind in ("none", "ngram", "suffix"):
        acc = acceptance_for(kind, target_name) if kind != "none" else None
        cands.append(_evaluate(kind, target, draft, dev, budgets, configs, acc, speed_for, suffix_cap))
    if draft is not None:
        bad = _draft_incompatibility(target, draft)
        acc = acceptance_for("draft", target_name, draft_name)
        if bad:
            cands.append(Candidate("draft", False, acceptance=acc, note=bad))
        else:
            cands.append(_evaluate("draft", target, draft, dev, budgets, configs, acc, speed_for,
                                   suffix_cap))

    fitting = [c for c in cands if c.fits]
    if not fitting:
        raise BudgetError(_smallest_fit_message(target, dev, budgets, ctx, explicit_ctx, kv_type,
                                                suffix_cap))
    # Highest predicted speedup wins; on a tie the cheaper proposer (none < ngram < suffix < draft).
    order = {"none": 0, "ngram": 1, "suffix": 2, "draft": 3}
    best = max(fitting, key=lambda c: (round(c.speedup, 3), -order[c.proposer]))
    cfg = best.config
    draft_len = best.draft_len
    if best.proposer == "none":
        # Requests may still name a free proposer (the engine loads them all): give them the
        # range their own prediction prefers rather than a draft length of zero.
        free = [c for c in fitting if c.proposer in ("ngram", "suffix")]
        draft_len = max(free, key=lambda c: c.speedup).draft_len if free else (1, 1)
    reasons = _reasons(best, cands, dev, budgets, target, draft, ctx, explicit_ctx,
                       budget is not None)
    return Plan(
        target=target.path, draft=draft.path if best.proposer == "draft" and draft else None,
        proposer=best.proposer, draft_len=draft_len, n_gpu_layers=cfg["n_gpu_layers"],
        draft_gpu_layers=cfg["draft_gpu_layers"], n_ctx=cfg["n_ctx"], kv_type=cfg["kv_type"],
        n_batch=cfg["n_batch"], predicted_speedup=best.speedup, memory=best.memory,
        budget_host=budgets[0], budget_device=budgets[1], device=dev, candidates=tuple(cands),
        speed=cfg["speed"], reasons=tuple(reasons),
    )


def _draft_incompatibility(target: ModelFacts, draft: ModelFacts) -> str:
    if target.n_vocab != draft.n_vocab:
        return (f"vocabulary differs ({draft.n_vocab} vs the target's {target.n_vocab} tokens): "
                "not a draft for this target")
    return ""


def _reasons(best: Candidate, cands: Sequence[Candidate], dev: Device, budgets, target: ModelFacts,
             draft: ModelFacts | None, ctx: int, explicit_ctx: bool, budget_given: bool) -> list[str]:
    host_budget, vram = budgets
    cfg = best.config
    sm: SpeedModel = cfg["speed"]
    r = [f"device: {dev.summary()}",
         f"budget: {fmt_size(host_budget)} host"
         + (f", {fmt_size(vram)} on {dev.gpu.name}" if dev.gpu is not None else "")
         + (" (--budget)" if budget_given else " (free memory minus a safety margin)")]
    mem = best.memory
    r.append(f"fits: {fmt_size(mem.host)} host" + (f" + {fmt_size(mem.device)} GPU" if mem.device else "")
             + f" of the budget ({mem.host / max(host_budget, 1):.0%} host)")
    # context and KV
    if cfg["n_ctx"] != ctx:
        r.append(f"context: reduced from {ctx} to {cfg['n_ctx']} tokens to fit the budget")
    else:
        r.append(f"context: {ctx} tokens ({'as asked' if explicit_ctx else 'default'}; "
                 f"trained for {target.n_ctx_train})")
    if cfg["kv_type"] == "f16":
        r.append("KV cache: f16 (fits; quantizing it would only lose precision)")
    else:
        r.append(f"KV cache: {cfg['kv_type']} because an f16 cache does not fit at this context")
    if cfg["n_batch"] != DEFAULT_BATCH:
        r.append(f"batch: {cfg['n_batch']} (smaller compute buffers to fit; slower prompt processing)")
    # offload
    if dev.gpu is None:
        r.append("offload: none (no GPU in this llama.cpp build or device)")
    else:
        full = target.n_layers + 1
        r.append(f"offload: target {cfg['n_gpu_layers']}/{full} layers on {dev.gpu.name}"
                 + ("" if cfg["n_gpu_layers"] == full else " (the rest does not fit in its memory)")
                 + (f"; draft {cfg['draft_gpu_layers']}/{draft.n_layers + 1}" if best.proposer == "draft"
                    and draft else ""))
    # speed
    r.append(f"verify cost: {sm.describe()}")
    if draft is not None and sm.draft_ratio is not None:
        r.append(f"draft cost: one draft token costs {sm.draft_ratio:.2f} of a target step ({sm.draft_source})")
    # the choice and the losers
    def pitch(c: Candidate) -> str:
        if c.proposer == "none":
            return "none: 1.00x (plain decoding, the baseline)"
        a = c.acceptance
        acc = (f"acceptance {a.alpha:.0%}" + (f", drafts on {a.coverage:.0%} of steps" if a.coverage < 1 else "")
               + f" [{a.source}]") if a else ""
        return (f"{c.proposer}: {c.speedup:.2f}x at draft length {c.best_k} "
                f"(range {c.draft_len[0]}-{c.draft_len[1]}; {acc})")

    r.append(f"chosen {pitch(best)}")
    for c in cands:
        if c is best:
            continue
        if not c.fits:
            r.append(f"not {c.proposer}: {c.note}")
            continue
        why = pitch(c)
        if c.proposer == "draft" and c.speedup < best.speedup:
            csm: SpeedModel = c.config["speed"]
            need = break_even_alpha(best.speedup, csm.cost, csm.draft_ratio or 0.0)
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
        if c.config.get("n_ctx") != cfg["n_ctx"] or c.config.get("kv_type") != cfg["kv_type"]:
            why += f" (and only fits at ctx {c.config['n_ctx']}, KV {c.config['kv_type']})"
        r.append(f"not {why}")
    return r


# =============================================================================== entry points
def _resolve(name_or_path: str | os.PathLike) -> tuple[Path, str | None, str | None]:
    """(path, registry name or None, sha256 or None)."""
    p = Path(str(name_or_path)).expanduser()
    try:
        from . import registry
        reg = registry.load_registry()
        key = str(name_or_path)
        if key in reg.models:
            return registry.resolve(key), key, reg.get(key).sha256
    except ModelError:
        raise
    except Exception:  # registry missing or unreadable: treat the argument as a path
        pass
    if not p.is_file():
        try:
            from . import registry
            if not registry.is_path_like(name_or_path):
                registry.load_registry().get(str(name_or_path))  # raises, listing the known names
        except ModelError:
            raise
        except Exception:
            pass
        raise ModelError(f"model not found: {name_or_path} (a registry name or a .gguf path)")
    return p.resolve(), None, None


def cached_calibration(path: Path, sha256: str | None, n_threads: int | None = None,
                       measure: bool = False, force: bool = False):
    """The calibration cached for this device and model (CPU layout), or None.

    ``measure`` measures a missing one (``force``: re-measures a cached one too)."""
    try:
        from . import calibration as cal
    except ImportError:
        return None
    try:
        if measure or force:
            return cal.load_or_measure(path, n_threads=n_threads, sha256=sha256, force=force)
        stem = path.stem
        folder = cal.edgespec_home() / "calibration"
        if sha256 is None and not any(folder.glob(f"{stem}-*.json")):
            return None  # nothing cached for a file of this name: don't hash 1 GB to find out
        if n_threads is None:
            from .backend import default_threads
            n_threads = default_threads()
        key = cal.cache_key(cal.device_fingerprint(n_threads, 0), cal.model_identity(path, sha256))
        return cal.load_cached(key)
    except EdgespecError:
        raise
    except Exception:
        return None


def registered_draft(target_name: str) -> str | None:
    """The target's registered draft model, if it is already on disk (planning never pulls)."""
    try:
        from . import registry
        reg = registry.load_registry()
        for pair in reg.pairs_for(target_name):
            if pair.proposer == "draft" and pair.draft and pair.draft != target_name \
                    and registry.model_path(pair.draft).is_file():
                return pair.draft
    except Exception:
        return None
    return None


def plan_for(target_path, draft_path=None, device: Device | None = None, budget=None, ctx=None,
             *, kv_type: str | None = None, calibrate: bool = False, recalibrate: bool = False,
             n_threads: int | None = None) -> Plan:
    """The engine's entry point: registry names or paths in, a :class:`Plan` out.

    Without ``draft_path`` a registered target's own draft pair is weighed too when
    its file is already pulled; ``Plan.draft`` names the draft to load, if chosen.

    Uses cached calibrations when present and trustworthy (``calibrate=True``
    measures missing ones first, ``recalibrate=True`` re-measures: tens of seconds
    on a small CPU) and priors otherwise.
    """
    tpath, tname, tsha = _resolve(target_path)
    tfacts = read_facts(tpath)
    dfacts = dname = dsha = dpath = None
    if draft_path is None and tname is not None:
        draft_path = registered_draft(tname)
    if draft_path is not None:
        dpath, dname, dsha = _resolve(draft_path)
        dfacts = read_facts(dpath)
    dev = device or devmod.probe()
    cals = {}
    if not dev.synthetic:
        cals["target"] = cached_calibration(tpath, tsha, n_threads, calibrate, recalibrate)
        if dpath is not None:
            cals["draft"] = cached_calibration(dpath, dsha, n_threads, calibrate, recalibrate)
    return plan(tfacts, dfacts, device=dev, budget=budget, ctx=ctx, kv_type=kv_type,
                target_name=tname, draft_name=dname, calibrations={k: v for k, v in cals.items() if v})


# =============================================================================== verification
@dataclass(frozen=True)
class MemoryCheck:
    """Planned against measured memory after loading."""
    stage: str                 # "load" (weights + KV) or "peak" (after a full batch and a verify pass)
    planned_host: int
    measured_host: int
    planned_device: int = 0
    measured_device: int | None = None

    @property
    def error(self) -> float:
        """(planned - measured) / measured: positive means the plan over-estimated."""
        return (self.planned_host - self.measured_host) / max(self.measured_host, 1)

    def report(self) -> str:
        s = (f"memory at {self.stage}: planned {fmt_size(self.planned_host)}, measured RSS "
             f"{fmt_size(self.measured_host)} ({self.error:+.1%})")
        if self.measured_device is not None:
            s += (f"; GPU planned {fmt_size(self.planned_device)}, measured "
                  f"{fmt_size(self.measured_device)}")
        return s


def current_rss(pid: int | None = None) -> int:
    import psutil
    return int(psutil.Process(pid).memory_info().rss)


def check_memory(estimate: MemoryEstimate | Plan, stage: str = "peak", pid: int | None = None,
                 device_used: int | None = None) -> MemoryCheck:
    """Compare a plan's memory with this process's RSS (and GPU memory used, if given)."""
    est = estimate.memory if isinstance(estimate, Plan) else estimate
    planned = est.host if stage == "peak" else est.host_at_load
    return MemoryCheck(stage, planned, current_rss(pid), est.device, device_used)


def measure_plan(p: Plan, n_threads: int | None = None, subprocess: bool = True) -> list[MemoryCheck]:
    """Load what ``p`` plans and compare its memory estimate with the measured RSS.

    By default in a fresh Python process, so the RSS is the plan's alone. The free
    proposers' caches are not built here, so they are left out of the comparison.
    """
    est = MemoryEstimate(tuple(i for i in p.memory.items
                               if i.name not in ("engine", "suffix cache", "n-gram index")))
    job = {"target": str(p.target), "draft": str(p.draft) if p.draft else None, "n_ctx": p.n_ctx,
           "n_batch": p.n_batch, "kv_type": p.kv_type, "n_gpu_layers": p.n_gpu_layers,
           "draft_gpu_layers": p.draft_gpu_layers, "n_threads": n_threads,
           "gpu": p.budget_device > 0 and not p.device.synthetic}
    if not subprocess:
        return _checks(est, measure_memory(job))
    import json
    import subprocess as sp
    import sys
    code = ("import json, sys; from edgespec import planner; "
            "print(json.dumps(planner.measure_memory(json.loads(sys.argv[1]))))")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = sp.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True, text=True,
                 env=env, timeout=1800)
    if out.returncode != 0:
        raise EdgespecError(f"measuring the plan failed: {out.stderr.strip().splitlines()[-1:]}")
    return _checks(est, json.loads(out.stdout.strip().splitlines()[-1]))


def _checks(est: MemoryEstimate, measured: Mapping) -> list[MemoryCheck]:
    return [MemoryCheck("load", est.host_at_load, measured["rss_load"], est.device,
                        measured.get("gpu_load")),
            MemoryCheck("peak", est.host, measured["rss_peak"], est.device, measured.get("gpu_peak"))]


def measure_memory(job: Mapping) -> dict:
    """Load a target (+ draft) with one context each in *this* process and report its RSS.

    ``job``: target, draft, n_ctx, n_batch, kv_type, n_gpu_layers, draft_gpu_layers,
    n_threads, gpu. RSS after loading ("rss_load") and after a full-batch prefill in
    each context plus one verify pass of K_MAX + 1 all-logits rows in the target's
    ("rss_peak"); with ``gpu``, the accelerator memory used at both points.
    """
    from . import backend

    def used_gpu() -> int | None:
        if not job.get("gpu"):
            return None
        return sum(d["total"] - d["free"] for d in backend.list_devices() if d["type"] != "cpu")

    backend._ensure_init()
    base_gpu = used_gpu() or 0
    models, ctxs = [], []
    t = KV_GGML_TYPE[job.get("kv_type", "f16")]
    out: dict = {}
    try:
        for path, layers in ((job["target"], job.get("n_gpu_layers", 0)),
                             (job.get("draft"), job.get("draft_gpu_layers", 0))):
            if not path:
                continue
            m = backend.load_model(path, n_gpu_layers=layers)
            models.append(m)
            ctxs.append(m.new_context(n_ctx=job["n_ctx"], n_batch=job["n_batch"],
                                      n_threads=job.get("n_threads"), type_k=t, type_v=t))
        out["rss_load"] = current_rss()
        g = used_gpu()
        if g is not None:
            out["gpu_load"] = g - base_gpu
        for i, (m, c) in enumerate(zip(models, ctxs)):
            nb = min(job["n_batch"], c.n_ctx - K_MAX - 2)
            toks = [(1000 + 7919 * j) % m.n_vocab for j in range(nb + K_MAX + 1)]
            c.decode(toks[:nb], 0, logits="last")
            if i == 0:
                c.decode(toks[nb:nb + K_MAX + 1], nb, logits="all")
                c.trim(0, nb)
        out["rss_peak"] = current_rss()
        g = used_gpu()
        if g is not None:
            out["gpu_peak"] = g - base_gpu
        return out
    finally:
        for c in ctxs:
            c.close()
        for m in models:
            m.close()
