"""Notes an engine's front ends show a person about a finished request: why a proposer they
asked for stayed (mostly) off, priced on the engine's own curve (calibration.breakeven).
The CLI's --stats and the TUI print the same line."""
from __future__ import annotations

from typing import Any

from ..calibration.breakeven import needed_acceptance, why_idle


def idle_reason(engine: Any, stats: Any) -> str | None:
    """Why a proposer the user asked for drafted little (edgespec.calibration.breakeven), priced
    on the engine's calibrated curve and the proposer's measured cost; None where it drafted
    its share, for the plain path, or when the engine has no curve."""
    label = stats.proposer
    if label in ("", "none") or stats.generated_tokens <= 0 or \
            stats.drafted * 10 >= stats.generated_tokens:
        return None
    # an adaptive engine priced its drafts on the curve (loaded at build); a fixed one has
    # none, and measuring one now for a stats line would cost more than the request
    cal = engine.calibration() if engine.config.control.adaptive else None
    if cal is None or not cal.step_seconds:
        return None
    if stats.drafted:
        per_token = stats.draft_seconds / stats.drafted
    else:  # what the controller priced it at: a draft model's running estimate, 0 if free
        per_token = max((getattr(engine.proposers.get(n), "seconds_per_token", 0.0) or 0.0)
                        for n in label.split("+"))
    be = needed_acceptance(cal.cost, per_token / cal.step_seconds)
    return why_idle(label, stats.drafted, stats.generated_tokens, stats.accepted, be,
                    measured=cal.source != "prior")


