"""What the real-model tests of the heads fed by the target's verify pass (``mtp``,
``eagle3``) check alike: after a generation with rejected drafts, the head's cache holds
exactly what a from-scratch catch-up on the accepted sequence would give.

The two kinds differ only in how far the cache reaches (``session.lead``,
edgespec/proposers/head_base.py), which each test asserts itself; the capture of the last
session and the from-scratch comparison are one piece here.
"""
from __future__ import annotations

import numpy as np

from edgespec.lab.analysis import parity as P
from edgespec.api.params import GenerationParams

PROMPTS = [
    P.ParityPrompt("count", "test", "Count from one to twenty in words, separated by commas."),
    P.ParityPrompt("fox", "test", "Repeat three times: the quick brown fox jumps over the lazy dog."),
]


def session_after_rejections(engine, name: str, monkeypatch):
    """Generate with proposer ``name`` until some drafts were rejected; its last session."""
    prop = engine.proposers[name]
    sessions = []
    opened = prop.open
    monkeypatch.setattr(prop, "open", lambda *a, **kw: sessions.append(opened(*a, **kw))
                        or sessions[-1])
    r = engine.generate(PROMPTS[1].prompt, GenerationParams(max_tokens=40), proposer=name)
    assert 0 < r.stats.accepted < r.stats.drafted  # some drafts were rejected
    return sessions[-1]


def assert_fresh_catch_up_drafts_alike(engine, name: str, session, kept) -> None:
    """The target decodes the whole accepted sequence again (the tap keeps its rows), a
    fresh session catches the head up in one batch: its draft is ``kept``."""
    seq = list(session.seq)
    engine.ctx.trim(0, 0)
    engine.ctx.decode(seq[:-1], 0, logits="none")
    fresh = engine.proposers[name].open(seq, session.sampling)
    try:
        again = fresh.propose(3)
    finally:
        fresh.close(True)
    assert again.tokens == kept.tokens
    assert np.allclose(again.confidence, kept.confidence, rtol=1e-3, atol=1e-4)
