"""A proposer whose drafts are scripted against the fake model's greedy continuation.

Each ``propose`` call takes the next entry of the script:

* ``n`` (an int): the next ``n`` tokens the target would choose greedily (all right);
* ``(n, m)``: ``n`` right tokens, then ``m`` wrong ones (the first wrong one is rejected);
* ``None``: an empty draft ("nothing worth drafting").

When the script runs out it repeats its last entry. Drafts are cut to the ``k``
the engine asks for. The session checks the protocol as it goes (accept follows
the latest draft; the accepted prefix is what it proposed) and records every call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

from edgespec.proposers import EMPTY_DRAFT, Draft

from .backend import EOG, N_VOCAB, FakeModel

Entry = Union[int, tuple[int, int], None]


def wrong_token(right: int) -> int:
    """A token that is not ``right`` and not an end-of-generation token."""
    t = right
    while t == right or t in EOG:
        t = (t + 1) % N_VOCAB
    return t


@dataclass
class ScriptedSession:
    owner: "ScriptedProposer"
    history: list[int]
    proposed: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (k, draft)
    accepted: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (tokens, n)
    closed: bool | None = None  # the `completed` flag once closed
    _last: tuple[int, ...] = ()

    def propose(self, k: int) -> Draft:
        assert self.closed is None, "propose after close"
        o = self.owner
        entry = o.script[min(o.calls, len(o.script) - 1)] if o.script else None
        o.calls += 1
        if entry is None or k <= 0:
            self._last = ()
            self.proposed.append((k, ()))
            return EMPTY_DRAFT
        right, wrong = (entry, 0) if isinstance(entry, int) else entry
        toks = o.model.greedy(self.history, right)
        if wrong:
            nxt = o.model.greedy(self.history + toks, 1)[0]
            toks.append(wrong_token(nxt))
            # later wrong tokens are arbitrary: verification never reads past the first
            toks.extend([wrong_token(toks[-1])] * (wrong - 1))
        draft = tuple(toks if o.ignore_k else toks[:k])
        self._last = draft
        self.proposed.append((k, draft))
        return Draft(tokens=draft, confidence=(0.5,) * len(draft), source=o.name)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        assert self.closed is None, "accept after close"
        toks = tuple(int(t) for t in tokens)
        assert toks, "accept with no tokens"
        assert 0 <= n_drafted_accepted <= len(self._last), (
            f"{n_drafted_accepted} accepted of a {len(self._last)}-token draft")
        assert toks[:n_drafted_accepted] == self._last[:n_drafted_accepted], (
            f"accepted {toks[:n_drafted_accepted]} but drafted {self._last}")
        self.accepted.append((toks, n_drafted_accepted))
        self.history.extend(toks)
        self._last = ()

    def close(self, completed: bool) -> None:
        assert self.closed is None, "closed twice"
        self.closed = completed


class ScriptedProposer:
    """Engine-lifetime half of the scripted proposer: the script and the sessions it opened."""

    def __init__(self, model: FakeModel, script: Sequence[Entry] = (), *, name: str = "scripted",
                 costly: bool = False, ignore_k: bool = False) -> None:
        self.model = model
        self.script = list(script)
        self.name = name
        self.costly = costly
        self.ignore_k = ignore_k  # a careless proposer: drafts its whole entry whatever k is
        self.seconds_per_token = 0.0
        self.calls = 0
        self.sessions: list[ScriptedSession] = []
        self.closed = False

    def open(self, prompt_tokens: Sequence[int], sampling) -> ScriptedSession:
        s = ScriptedSession(self, [int(t) for t in prompt_tokens])
        self.sessions.append(s)
        return s

    def close(self) -> None:
        self.closed = True
