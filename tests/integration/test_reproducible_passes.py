"""The same greedy request sent again runs the same passes (issue #43 item 8).

Outside --exact a verify pass's logits depend on its batch (docs/parity.md), so a request's
text is only as stable as its passes. The first answer teaches the engine's n-gram and
suffix proposers (their dynamic statistics and global tree); were a repeated greedy request
to draft from that, it would draft its own earlier answer and run other passes. It drafts
from its own text only (proposers.base.Remembers), so its passes repeat; an unseeded
sampled request, which promises no repetition, keeps what the engine learnt.
"""
from __future__ import annotations

from edgespec.api.events import Step
from edgespec.api.params import GenerationParams, SamplingParams

PROMPT = "List the first twelve prime numbers, one per line, then say done."


def passes(eng, params):
    return [(ev.proposer, ev.drafted, ev.accepted, ev.tokens)
            for ev in eng.stream(PROMPT, params) if isinstance(ev, Step)]


def test_a_repeated_greedy_request_runs_the_same_passes(engine_factory):
    eng = engine_factory("smollm2-135m", proposer="ngram+suffix", adaptive=True, exact=False)
    greedy = GenerationParams(max_tokens=48)
    first = passes(eng, greedy)
    again = passes(eng, greedy)
    assert again == first
    # the engine did learn the answer: a sampled request (no seed) recalls it and drafts
    # more of it than the greedy request could from the prompt alone
    sampled = GenerationParams(max_tokens=48, sampling=SamplingParams(temperature=0.01))
    recalled = passes(eng, sampled)
    assert sum(d for _, d, _, _ in recalled) > sum(d for _, d, _, _ in first)
