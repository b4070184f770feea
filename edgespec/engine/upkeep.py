"""What an engine measures about itself once and keeps: the verify-cost curve, exact mode's
draft cap, the release identity. Each is computed on first use (a measurement or a probe
costs seconds), then kept until what it describes changes.

    upkeep = Upkeep(target, config, n_threads, guard, describe=lambda: collect(engine))
    upkeep.calibration()        # measured once (cached on disk), the guard's prior set from it
    upkeep.exact_max_draft()    # probed once per device and kernel configuration
    upkeep.identity()           # collected once; forget_identity() when the proposers change
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..calibration.curve import Calibration
from ..config import EngineConfig
from ..control import GoodputGuard
from ..runtime.model import Model
from . import exactness
from .build import trusted_calibration

if TYPE_CHECKING:
    from ..identity.identity import Identity


class Upkeep:
    """The engine's measured facts. ``curve`` and ``exact_cap`` are public so that a test (or
    a caller that measured them elsewhere) can stand in a known value."""

    def __init__(self, target: Model, config: EngineConfig, n_threads: int, guard: GoodputGuard,
                 describe: Callable[[], Identity], curve: Calibration | None = None,
                 exact_cap: int | None = None) -> None:
        self._target, self._config, self._n_threads = target, config, n_threads
        self._guard = guard
        self._describe = describe
        #: the verify-cost curve (None until measured or handed in)
        self.curve = curve
        #: most drafts an exact verify pass may hold (None until probed or handed in)
        self.exact_cap = exact_cap
        self._identity: Identity | None = None

    def calibration(self, threads: int | None = None) -> Calibration:
        """This device's verify-cost curve for the target (measured once, cached on disk);
        the guard prices the plain path with its step time from then on."""
        if self.curve is None:
            self.curve = trusted_calibration(self._target, threads or self._n_threads,
                                             self._config.layout())
            self._guard.plain_seconds_prior = self.curve.step_seconds
        return self.curve

    def exact_max_draft(self) -> int:
        """Most drafts a verify pass may hold in exact mode: the probed bitwise-invariant
        batch size of this device and kernel configuration, minus the pending token."""
        if self.exact_cap is None:
            self.exact_cap = exactness.max_drafts(self._target, self._config, self._n_threads)
        return self.exact_cap

    def identity(self) -> Identity:
        """The release identity (edgespec.identity), collected once."""
        if self._identity is None:
            self._identity = self._describe()
        return self._identity

    def forget_identity(self) -> None:
        """What the identity describes changed (a proposer added or removed)."""
        self._identity = None


__all__ = ["Upkeep"]
