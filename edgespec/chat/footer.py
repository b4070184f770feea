"""The one-line stats footer `edgespec chat` prints after each answer.

    12 tok in 0.41 s · 29.3 tok/s · drafted 8, accepted 6 (75%) · 1.4× plain (24.1 tok/s)

The speedup divides this turn's decode rate by the plain rate the engine's calibration
measured on this machine (one token per target pass: 1 / its 1-token pass time); without a
calibration (the plain path, or a non-adaptive engine that never loaded one) the speedup is
left out rather than guessed. Parts that do not apply are left out too: a turn that drafted
nothing shows no acceptance.
"""
from __future__ import annotations

from ..api.stats import RequestStats


def footer(stats: RequestStats, plain_step_seconds: float | None = None) -> str:
    parts = [f"{stats.generated_tokens} tok in {stats.total_seconds:.2f} s"]
    rate = stats.decode_tokens_per_second
    if rate > 0:
        parts.append(f"{rate:.1f} tok/s")
    if stats.drafted:
        parts.append(f"drafted {stats.drafted}, accepted {stats.accepted} "
                     f"({stats.acceptance_rate:.0%})")
    elif stats.proposer not in ("", "none") and stats.generated_tokens > 1:
        parts.append(f"{stats.proposer}: nothing drafted")
    if plain_step_seconds and plain_step_seconds > 0 and rate > 0:
        plain = 1.0 / plain_step_seconds
        parts.append(f"{rate / plain:.2f}× plain ({plain:.1f} tok/s)")
    if stats.prompt_reused:
        parts.append(f"prompt {stats.prompt_computed} new, {stats.prompt_reused} reused")
    return " · ".join(parts)
