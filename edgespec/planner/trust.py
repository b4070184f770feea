"""Whether a cached calibration measured the device or the load on it."""
from __future__ import annotations

import statistics

from ..calibration.cpu import BUSY_LIMIT
from ..calibration.curve import Calibration

#: Repeats of one pass on a quiet machine agree within a few percent; far more spread means
#: other work held the cores while it was measured, and the curve's shape is noise.
MAX_CALIBRATION_SPREAD = 0.10


def calibration_trust(cal: Calibration | None, expected_step: float) -> tuple[bool, str]:
    """(usable, remark) for a cached calibration: refuse ones timed under heavy load.

    The spread is the median over batch sizes of the repeats' median absolute deviation
    relative to their median. A one-token step more than 10x off what the model's size
    suggests is refused too, beyond 4x only remarked on (slow boards exist).
    """
    if cal is None:
        return False, ""
    busy = float(getattr(cal, "busy", 0.0) or 0.0)
    if busy > BUSY_LIMIT:
        # Other work on the cores while timing: llama.cpp's threads wait for each other,
        # so every pass looks several times slower and the curve's shape is noise.
        return False, (f"it was timed while the machine was busy (other processes used "
                       f"{busy:.0%} of the CPUs); "
                       "`edgespec plan --recalibrate` on a quiet machine measures it again")
    spread = _spread(cal)
    if spread > MAX_CALIBRATION_SPREAD:
        return False, (f"its repeats vary by ±{spread:.0%} "
                       "(timed while other work held the cores)")
    ratio = cal.step_seconds / expected_step if expected_step > 0 else 1.0
    if not 0.1 < ratio < 10:
        return False, f"its {cal.step_seconds * 1000:.0f} ms step is {ratio:.1f}x what the model's size suggests"
    if not 0.25 < ratio < 4:
        return True, (f"its {cal.step_seconds * 1000:.0f} ms step is {ratio:.1f}x what the model's "
                      "size suggests")
    return True, ""


#: Repeats this far apart still give a curve's shape (medians of five) far closer to the
#: device's than a prior measured on another CPU; beyond it the shape is noise.
MAX_USABLE_SPREAD = 0.25


def _spread(cal: Calibration) -> float:
    """Median over pass sizes of the repeats' median absolute deviation relative to their
    median (0.0 without repeats)."""
    spreads: list[float] = []
    for samples in (getattr(cal, "samples", None) or {}).values():
        if len(samples) >= 3:
            m = statistics.median(samples)
            if m > 0:
                spreads.append(statistics.median(abs(x - m) for x in samples) / m)
    return statistics.median(spreads) if spreads else 0.0


def usable_shape(cal: Calibration | None, expected_step: float) -> bool:
    """Whether an untrusted calibration still prices passes better than the CPU prior: a
    measured curve, not timed under load, whose repeats vary by at most
    :data:`MAX_USABLE_SPREAD` and whose step is within 10x of what the model's size
    suggests. A noisy-but-quiet measurement (a VM's jitter) keeps the device's shape."""
    if cal is None or getattr(cal, "source", "") != "measured":
        return False
    if float(getattr(cal, "busy", 0.0) or 0.0) > BUSY_LIMIT:
        return False
    ratio = cal.step_seconds / expected_step if expected_step > 0 else 1.0
    return _spread(cal) <= MAX_USABLE_SPREAD and 0.1 < ratio < 10
