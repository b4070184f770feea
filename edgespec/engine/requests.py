"""What a request is between the caller and the loop: validated and tokenized
(:class:`Prepared`), given its controller (:func:`attach_controller`), and its answer
(:class:`Result`). Nothing here holds the engine: each function takes the parts it reads.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from ..api.events import TokenLogprob
from ..api.params import GenerationParams
from ..api.stats import RequestStats
from ..calibration.curve import Calibration
from ..control import Controller, ControlSettings, GoodputGuard, make_controller, reproducible
from ..grammar.state import GrammarState
from ..loop.state import Request
from ..proposers import Proposer

#: llama-cpp-python's logits processor: (input ids so far, logits row) -> logits
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


class ControllerHook(Protocol):
    """``hook(req, controller, built) -> controller``: called for every request that gets a
    controller; ``built`` holds what make_controller was given (settings, proposers,
    calibration, slice, token_seconds, deterministic). edgespec's replay recorder wraps the
    controller this way to keep every decision."""

    def __call__(self, req: Request, controller: Controller,
                 built: dict[str, Any]) -> Controller: ...


@dataclass
class Result:
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    stats: RequestStats
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Prepared:
    """A validated, tokenized request that has not run yet (see :meth:`Engine.prepare`)."""

    tokens: list[int]
    params: GenerationParams
    label: str
    control: ControlSettings
    reuse: bool
    traffic: str
    grammar: GrammarState | None
    exact: bool
    logits_processor: LogitsProcessor | None = None  # plain path only (Request.logits_processor)

    def close(self) -> None:
        """Release what a request that never runs holds (its grammar)."""
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None


def attach_controller(req: Request, prep: Prepared, names: tuple[str, ...],
                      proposers: Mapping[str, Proposer],
                      calibration: Callable[[], Calibration], guard: GoodputGuard,
                      hook: ControllerHook | None) -> None:
    """Give ``req`` the proposers ``names`` and, when there are any, the controller that
    chooses between them (fixed or adaptive over this device's curve, which ``calibration``
    measures on first use), wrapped by ``hook``."""
    control, traffic, sampling = prep.control, prep.traffic, prep.params.sampling
    req.proposers = {n: proposers[n] for n in names}
    req.costly = frozenset(n for n in names if proposers[n].costly)
    if not names:
        return
    cal = calibration() if control.adaptive else None
    # a greedy or seeded request's passes follow neither the clock nor others (the replay
    # builds its controller the same way): a costly proposer is priced as the engine was
    # set up (engine.build._price_drafts), not at its running estimate
    deterministic = reproducible(sampling.greedy, sampling.seed, prep.exact)
    token_seconds = {n: _price(proposers[n], deterministic) for n in req.costly}
    built: dict[str, Any] = dict(
        settings=replace(control, proposer=names[0]) if not control.adaptive else control,
        proposers={n: n in req.costly for n in names}, calibration=cal, slice=traffic,
        token_seconds={n: s for n, s in token_seconds.items() if s} or None,
        deterministic=deterministic)
    req.controller = make_controller(
        built["settings"], built["proposers"], cal, guard, traffic,
        built["token_seconds"], deterministic=built["deterministic"])
    if hook is not None:
        req.controller = hook(req, req.controller, built)
    req.max_draft = control.max_draft


def _price(p: Proposer, deterministic: bool) -> float:
    """Seconds per drafted token the controller starts from: the setup's price for a
    reproducible request where the engine set one, else the running estimate."""
    setup = float(getattr(p, "setup_seconds_per_token", 0.0) or 0.0)
    return setup if deterministic and setup else float(getattr(p, "seconds_per_token", 0.0))


__all__ = ["ControllerHook", "LogitsProcessor", "Prepared", "Result", "attach_controller"]
