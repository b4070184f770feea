"""The cost curve: what a target pass over n tokens costs on this device, relative to one
token, and up to which size its logits are exact (the Calibration value and its JSON).

Speculation pays only when the tokens a draft is expected to yield outrun the
extra cost of verifying it, and that cost is a property of the device: on a
2-core CPU verifying 7 drafts (an 8-token batch) costs about 3 plain steps, on a
GPU about one. The curve is not monotone either: with repacked weights a 3-token
pass goes through ``gemv`` and a 4-token one through the 4-column ``gemm``, which
costs less. So the controller and the planner read a measured curve as it is.

Convention (used everywhere in edgespec): ``n`` counts *every token in the
batch*. A plain step is a 1-token pass (the last emitted token); verifying a
draft of ``d`` tokens is an ``n = d + 1`` pass (the last emitted token followed
by the ``d`` drafts), so its cost is ``cost(d + 1)``, which
:meth:`Calibration.verify_cost` spells out. ``cost(1) == 1`` by definition.

How a curve is measured (and its exactness probed) is edgespec.calibration.measuring; where
it is cached, edgespec.calibration.cache.

    cal = cache.load_or_measure("~/.cache/edgespec/models/qwen-1.5b.gguf", n_threads=2)
    cal.cost(4)            # relative cost of a 4-token pass (3 drafts)
    cal.verify_cost(3)     # the same, named by the number of drafts
    cal.seconds(1)         # one plain step, in seconds
    cache.exact_cap(model, KernelConfig(), 2)   # drafts per pass that keep logits bitwise exact
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from .cpu import BUSY_LIMIT

#: batch sizes a calibration measures (tokens per pass): every size up to 8, where kernel
#: switches make the curve jump (gemv below 4 columns, gemm from 4, tiled from 8)
DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)

#: Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, on the 2-core CPU this project is developed on
#: (docs/models.md); the controller's assumption until a measurement exists.
PRIOR_CPU_COSTS: dict[int, float] = {1: 1.0, 2: 1.50, 3: 1.78, 5: 2.06, 6: 2.36, 8: 2.86,
                                     10: 3.28, 16: 3.44}
PRIOR_CPU_STEP_SECONDS = 0.086
# weight bytes of the model that step was measured on (Qwen2.5-Coder-1.5B Q4_K_M)
PRIOR_CPU_WEIGHT_BYTES = 1_111_370_240


def prior_step_seconds(weight_bytes: float) -> float:
    """The documented CPU step scaled to a model's size: decode is bandwidth-bound."""
    return PRIOR_CPU_STEP_SECONDS * weight_bytes / PRIOR_CPU_WEIGHT_BYTES

#: bump when the file layout or what is measured changes: older files are measured again
FORMAT = 2


class CalibrationWarning(UserWarning):
    """A cached calibration could not be used (stale or corrupt) and is being measured again."""


@dataclass(frozen=True)
class Calibration:
    """A device's cost curve for one model: ``cost(n)`` = time of an n-token pass / time of a 1-token pass.

    ``points`` are the measured (n, relative cost) pairs, sorted, starting at
    (1, 1.0), kept as measured: a longer batch may cost less when it takes a
    faster kernel (no cost is below a 1-token pass's). Between points the cost is
    linear in n; beyond the last one it continues along the last segment's slope,
    never falling. ``exact_max_tokens`` is the probed exactness limit (None: not
    probed, e.g. a prior or synthetic curve).
    """

    step_seconds: float  # median wall time of a 1-token pass
    points: tuple[tuple[int, float], ...]
    key: str = ""  # cache key this calibration was stored under ("" when not cached)
    source: str = "measured"  # "measured" | "prior" | "synthetic"
    device: Mapping[str, str] = field(default_factory=dict)
    model: Mapping[str, str] = field(default_factory=dict)
    samples: Mapping[int, tuple[float, ...]] = field(default_factory=dict)  # n -> raw seconds
    measured_at: float = 0.0
    # 1-minute load average per logical CPU when the measurement started; above 1 the
    # machine was oversubscribed and the numbers are suspect (see load_or_measure)
    busy: float = 0.0  # other processes' share of the CPUs while it was timed
    exact_max_tokens: int | None = None
    #: a target with NextN (MTP) layers: median seconds of one MTP-head decode (1 token and
    #: its hidden row), the mtp proposer's cost per draft token (None: no head, or not measured)
    mtp_step_seconds: float | None = None

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:
            raise ValueError(f"step_seconds must be positive (got {self.step_seconds})")
        pts = sorted((int(n), float(c)) for n, c in self.points if int(n) >= 1)
        if not pts or pts[0][0] != 1:
            pts.insert(0, (1, 1.0))
        clean: list[tuple[int, float]] = []
        for n, c in pts:
            if clean and clean[-1][0] == n:
                continue
            clean.append((n, 1.0 if n == 1 else max(c, 1.0)))
        object.__setattr__(self, "points", tuple(clean))

    # --- constructors --------------------------------------------------------
    @classmethod
    def from_costs(cls, costs: Mapping[int, float], step_seconds: float, **kw) -> "Calibration":
        """From a {n: relative cost} table (tests, simulations, a planner's assumption)."""
        kw.setdefault("source", "synthetic")
        return cls(step_seconds=step_seconds, points=tuple(costs.items()), **kw)

    @classmethod
    def prior_cpu(cls, step_seconds: float = PRIOR_CPU_STEP_SECONDS) -> "Calibration":
        """The 2-core CPU curve from docs/models.md: what to assume before measuring."""
        return cls(step_seconds=step_seconds, points=tuple(PRIOR_CPU_COSTS.items()), source="prior")

    @classmethod
    def linear(cls, per_token: float, step_seconds: float = 0.02, upto: int = 16) -> "Calibration":
        """cost(n) = 1 + per_token * (n - 1): per_token≈0 is a GPU-like device, 1 is fully compute-bound."""
        return cls.from_costs({n: 1.0 + per_token * (n - 1) for n in range(1, upto + 1)},
                              step_seconds)

    # --- queries -------------------------------------------------------------
    def cost(self, n: float) -> float:
        """Relative cost of a pass over ``n`` tokens (n >= 1; fractional n interpolates)."""
        if n < 1:
            raise ValueError(f"a pass has at least one token (got n={n})")
        pts = self.points
        if len(pts) == 1:
            return 1.0
        for (n0, c0), (n1, c1) in zip(pts, pts[1:]):
            if n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        (n0, c0), (n1, c1) = pts[-2], pts[-1]
        # past the measured range (a batch of several sequences' drafts) a pass is assumed
        # compute-bound at no less than the average per-token cost so far: a last segment
        # that dips (a kernel change) must not make every further position look free
        return c1 + max((c1 - c0) / (n1 - n0), c1 / n1) * (n - n1)

    def verify_cost(self, drafted: int) -> float:
        """Relative cost of verifying ``drafted`` draft tokens: a (drafted + 1)-token pass."""
        return self.cost(drafted + 1)

    def seconds(self, n: float) -> float:
        """Wall time of an n-token pass."""
        return self.step_seconds * self.cost(n)

    @property
    def exact_max_drafts(self) -> int | None:
        """Drafts a verify pass may hold and stay bitwise exact (None: not probed)."""
        return None if self.exact_max_tokens is None else max(self.exact_max_tokens - 1, 0)

    # --- persistence ---------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        d["points"] = [list(p) for p in self.points]
        d["samples"] = {str(k): list(v) for k, v in self.samples.items()}
        d["device"] = dict(self.device)
        d["model"] = dict(self.model)
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown calibration format {d.get('format')!r}")
        exact = d.get("exact_max_tokens")
        return cls(step_seconds=float(d["step_seconds"]),
                   points=tuple((int(n), float(c)) for n, c in d["points"]),
                   key=str(d.get("key", "")), source=str(d.get("source", "measured")),
                   device={str(k): str(v) for k, v in d.get("device", {}).items()},
                   model={str(k): str(v) for k, v in d.get("model", {}).items()},
                   samples={int(k): tuple(float(x) for x in v)
                            for k, v in d.get("samples", {}).items()},
                   measured_at=float(d.get("measured_at", 0.0)), busy=float(d.get("busy", 0.0)),
                   exact_max_tokens=None if exact is None else int(exact),
                   mtp_step_seconds=_positive(d.get("mtp_step_seconds")))


def _positive(v: object) -> float | None:
    """A stored optional duration: a positive number, else None (absent in older files)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def summarize(cal: Calibration, ns: Iterable[int] = DEFAULT_KS) -> str:
    """One line for logs and `edgespec plan`: step time and the relative costs."""
    parts = " ".join(f"{n}:{cal.cost(n):.2f}" for n in ns)
    note = (f", measured under load (others used {cal.busy:.0%} of the CPUs)"
            if cal.busy > BUSY_LIMIT else "")
    return f"1-token pass {cal.step_seconds * 1000:.1f} ms; cost by batch size {parts} ({cal.source}{note})"
