"""llama-cpp-python's own prompt lookup as a benchmark anchor, measured like an engine request.

llama-cpp-python runs the anchor (``bench.anchors.llama_api.anchor_prompt_lookup``) and returns a raw
trace: emitted tokens with their times, and for every target pass the sequence
length it started from and how many tokens the lookup drafted. That is enough to
rebuild the same :class:`RequestStats` an engine request produces: pass *i*
emitted ``len_{i+1} - len_i`` tokens (accepted + the target's own), the last pass
emitted what is left.
"""
from __future__ import annotations

from ....api.stats import RequestStats
from .llama_api import AnchorTrace  # what the anchor returns

__all__ = ["AnchorTrace", "trace_to_stats"]


def trace_to_stats(trace: AnchorTrace, proposer: str) -> RequestStats:
    """Rebuild per-pass statistics from sequence lengths (see the module docstring)."""
    st = RequestStats(proposer=proposer)
    st.observe_prefill(trace.prompt_tokens, trace.first_token_seconds)
    # Times of every token the generator yielded, the end-of-generation token included.
    yielded = list(trace.token_times) + ([trace.eog_time] if trace.eog_time is not None else [])
    n_emit = len(trace.tokens)
    if yielded:
        st.observe_step(proposer=None, drafted=0, accepted=0, emitted=min(1, n_emit),
                        draft_seconds=0.0, verify_seconds=0.0, elapsed=yielded[0])
    end = trace.prompt_tokens + len(yielded)
    done = 1  # yielded tokens accounted for
    for i, (start, drafted) in enumerate(trace.passes):
        stop = trace.passes[i + 1][0] if i + 1 < len(trace.passes) else end
        produced = max(0, min(stop - start, len(yielded) - done))
        if produced == 0:
            break
        # A pass yields its accepted draft tokens, then the target's own token. A pass cut
        # short by max_tokens is read the same way (its acceptance undercounted by at most 1).
        accepted = min(drafted, produced - 1)
        emitted = max(0, min(produced, n_emit - done))
        st.observe_step(proposer=proposer if drafted else None, drafted=drafted, accepted=accepted,
                        emitted=emitted, draft_seconds=0.0, verify_seconds=0.0,
                        elapsed=yielded[done + produced - 1])
        done += produced
    st.finish(trace.stop_reason, trace.total_seconds)
    return st
