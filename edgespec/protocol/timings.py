"""llama-server's ``timings`` object, from a finished request's measured times.

llama-server reports, per generation response, ``prompt_n`` / ``prompt_ms`` (the prompt
tokens it evaluated and how long that took), ``predicted_n`` / ``predicted_ms`` (tokens
generated and the time from the end of the prompt to the end), per-token and per-second
rates of both, and ``draft_n`` / ``draft_n_accepted`` when it speculates. llama-swap, the
llama.cpp web UI and many dashboards read exactly these names; edgespec adds
``proposer`` (what drafted). Reused prompt tokens are not counted in ``prompt_n``, as in
llama-server (``cache_n`` holds them).
"""
from __future__ import annotations

from typing import Any

from ..api.events import Finished


def timings(fin: Finished) -> dict[str, Any]:
    s = fin.stats
    prompt_n = s.prompt_computed
    prompt_ms = s.prefill_seconds * 1000.0
    predicted_n = len(fin.tokens)
    # from the end of the prompt to the end: the first token's own pass counts, as in
    # llama-server, whose t_token_generation starts when the prompt is done
    predicted_ms = max(s.total_seconds - s.prefill_seconds, 0.0) * 1000.0
    return {
        "cache_n": s.prompt_reused,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": (1000.0 * predicted_n / predicted_ms
                                 if predicted_ms > 0 else 0.0),
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
        "proposer": s.proposer,
    }
