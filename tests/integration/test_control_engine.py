"""Adaptive control inside the real engine loop (SmolLM2-135M, free proposers)."""
from __future__ import annotations

from edgespec import GenerationParams
from edgespec.api.events import Control, Finished, Step

COPY = ("Copy the following paragraph exactly, word for word:\n\n"
        "The committee met on Tuesday to review the budget for the new library. After a long "
        "discussion, members agreed to fund the reading room, the children's corner and the "
        "archive, but postponed the decision on the cafe until the next meeting in March.")


def _events(engine, prompt, proposer, n=64):
    return list(engine.stream(prompt, GenerationParams(max_tokens=n), proposer=proposer))


def test_adaptive_control_keeps_greedy_output_and_drafts_on_a_copy_task(engine_factory):
    eng = engine_factory("smollm2-135m")
    plain = [e for e in _events(eng, COPY, "none") if isinstance(e, Finished)][0]
    for proposer in ("suffix", "ngram"):
        evs = _events(eng, COPY, proposer)
        fin = [e for e in evs if isinstance(e, Finished)][0]
        assert fin.tokens == plain.tokens, proposer
        steps = [e for e in evs if isinstance(e, Step) and e.drafted]
        assert steps, f"{proposer}: no speculative step on a copy task"
        assert fin.stats.accepted > 0
        # every Control event the stream yielded is counted in the request's stats
        kinds = [e.kind for e in evs if isinstance(e, Control)]
        assert sum(fin.stats.control_events.values()) == len(kinds)


def test_fixed_draft_length_is_honoured(model_path):
    from edgespec.engine.engine import Engine

    with Engine.load(str(model_path("smollm2-135m")), proposer="ngram", adaptive=False,
                     max_draft=2, n_ctx=1024, threads=1) as eng:
        evs = _events(eng, COPY, "ngram", n=48)
    drafted = [e.drafted for e in evs if isinstance(e, Step) and e.drafted]
    assert drafted and max(drafted) <= 2


def test_both_free_proposers_are_consulted_every_step(engine_factory):
    # one request, two free proposers: every step the controller sees both candidates and
    # verifies the better one; greedy output is still the plain path's
    eng = engine_factory("smollm2-135m", adaptive=True)
    plain = [e for e in _events(eng, COPY, "none") if isinstance(e, Finished)][0]
    evs = _events(eng, COPY, "ngram+suffix")
    fin = [e for e in evs if isinstance(e, Finished)][0]
    assert fin.tokens == plain.tokens
    used = {e.proposer for e in evs if isinstance(e, Step) and e.drafted}
    assert used and used <= {"ngram", "suffix"}
    assert fin.stats.accepted > 0


def test_exact_mode_drafts_within_the_probed_cap(engine_factory):
    eng = engine_factory("smollm2-135m", adaptive=True, exact=True)
    cap = eng.exact_max_draft()
    assert cap == 15  # SmolLM2's Q4_1 weights: every pass size up to 16 tokens is exact
    drafted = [e.drafted for e in _events(eng, COPY, "ngram") if isinstance(e, Step)]
    # longer passes than the old fixed cap of 2 drafts, never past the probed one
    assert 2 < max(drafted) <= cap
