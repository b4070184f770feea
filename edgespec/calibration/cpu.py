"""Whether the machine was quiet while a curve was timed: other processes' CPU share."""
from __future__ import annotations

import os
import time
import psutil

#: Other processes' share of the CPUs above which a timing is not trusted: llama.cpp's
#: threads wait for each other, so a core taken by someone else slows every pass.
BUSY_LIMIT = 0.25


class CpuWatch:
    """Other processes' share of this machine's CPUs between start and :meth:`share`
    (this process's own children, once waited for, are its own).

    The load average lags by minutes (a machine that just went quiet still reads busy);
    this counts the CPU time actually spent by everyone else while we measured."""

    def __init__(self) -> None:
        self._psutil = psutil
        self._me = psutil.Process()
        self._t0 = time.perf_counter()
        self._all0 = self._busy_all()
        self._me0 = self._busy_me()

    def _busy_all(self) -> float:
        t = self._psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + \
            getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)

    def _busy_me(self) -> float:
        # children included: a tool this process ran and waited for (the bench's
        # llama-completion) is its own work, not another process's
        t = self._me.cpu_times()
        return (t.user + t.system + getattr(t, "children_user", 0.0)
                + getattr(t, "children_system", 0.0))

    def share(self) -> float:
        wall = time.perf_counter() - self._t0
        if wall <= 0:
            return 0.0
        others = (self._busy_all() - self._all0) - (self._busy_me() - self._me0)
        return max(0.0, others / (wall * (os.cpu_count() or 1)))


def machine_busy(seconds: float = 0.3) -> float:
    """Other processes' share of the CPUs over the next ``seconds`` (0.0 where unknown)."""
    try:
        w = CpuWatch()
    except (ImportError, OSError):
        return 0.0
    time.sleep(seconds)
    return w.share()


def measure_again(busy: float) -> bool:
    """Whether a cached timing taken while other processes used ``busy`` of the CPUs is to be
    measured again: it was over BUSY_LIMIT and the machine is quiet now (while it is still
    busy, the old timing is no worse than a new one)."""
    return busy > BUSY_LIMIT and machine_busy() <= BUSY_LIMIT / 2
