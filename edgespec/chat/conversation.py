"""A multi-turn conversation over one engine, for desktop apps and ``edgespec chat``.

    conv = Conversation(engine, system="You are terse.")
    for ev in conv.send("Why is the sky blue?"):     # streams the answer
        ...
    conv.ask("And at sunset?")                         # -> Result; history kept

Each turn sends the whole conversation through :meth:`Engine.chat`, which reuses the
KV cache's longest common prefix (the conversation so far) and prefills only the new
turn. The engine's proposers see every turn: the per-request suffix tree indexes the
whole conversation, and each completed answer joins the global tree.

A cancelled turn (``engine.cancel()``, Ctrl-C in ``edgespec chat``) keeps what was
shown of the answer in the history (its :class:`Turn` says ``cancelled``); a turn that
showed nothing leaves no message. The next turn starts from whatever the KV cache still holds.

The KV of an answer was written by decode and verify passes, which a turn that promises
its text (exact mode, a greedy or a seeded one) does not reuse (edgespec.decoding.kvcache);
:meth:`Conversation.settle`, called once the answer is shown and before the next message,
prefills it again in idle time so the next turn reuses the whole conversation. It returns
at once for unseeded sampling, which reuses the answer as it is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..errors import InvalidInputError
from ..api.events import Event, Finished
from ..api.params import GenerationParams
from ..api.stats import RequestStats


@dataclass
class Turn:
    """One finished turn: the user's message, the answer and how it was produced."""

    user: str
    text: str
    stop_reason: str
    stats: RequestStats
    refreshed: int = 0  # answer positions settle() prefilled again for the next turn
    refresh_seconds: float = 0.0


class Conversation:
    def __init__(self, engine, system: str | None = None,
                 params: GenerationParams | None = None, proposer: str | None = None,
                 messages: list[dict] | None = None, exact: bool | None = None) -> None:
        self.engine = engine
        self.exact = exact  # None: the engine's mode
        self.params = replace(params or GenerationParams(), chat=True, system=None).validate()
        self.proposer = proposer
        self.system = system
        self.messages: list[dict] = [dict(m) for m in messages or []]  # without the system one
        self.turns: list[Turn] = []
        self._sent = self.params  # the last turn's parameters

    # --- history --------------------------------------------------------------------
    def history(self) -> list[dict]:
        """The messages a turn sends: the system message (if any), then the exchange."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [dict(m) for m in self.messages]

    def reset(self) -> None:
        """Forget the exchange (the system message stays); the KV cache keeps its states
        for a conversation that comes back."""
        self.messages.clear()
        self.turns.clear()

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    # --- turns ------------------------------------------------------------------------
    def send(self, text: str, params: GenerationParams | None = None) -> Iterator[Event]:
        """Append a user message and stream the answer; the history is updated when the
        stream ends (also when it is cancelled or abandoned)."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("the message is empty")
        p = replace(params, chat=True, system=None).validate() if params else self.params
        msgs = [*self.history(), {"role": "user", "content": text}]
        # validated and tokenized now, so a bad message leaves the history as it was
        stream = self.engine.chat(msgs, p, proposer=self.proposer, exact=self.exact)
        self._sent = p
        return self._run(text, stream)

    def ask(self, text: str, params: GenerationParams | None = None) -> Turn:
        for _ in self.send(text, params):
            pass
        return self.turns[-1]

    def settle(self, stop: Callable[[], bool] | None = None) -> int:
        """Idle-time work after a turn that promises its text: the answer's KV prefilled
        again, so the next turn reuses it (see the module docstring). ``stop()`` turning
        true ends it early, keeping what was done; returns the positions refreshed."""
        exact = self.engine.exact if self.exact is None else self.exact
        if not (exact or self._sent.sampling.promises_text) or not self.turns:
            return 0
        t0 = time.perf_counter()
        n = self.engine.refresh_kv(stop=stop)
        turn = self.turns[-1]
        turn.refreshed += n
        turn.refresh_seconds += time.perf_counter() - t0
        return n

    def _run(self, text: str, stream: Iterator[Event]) -> Iterator[Event]:
        shown: list[str] = []
        fin = None
        try:
            for ev in stream:
                if isinstance(ev, Finished):
                    fin = ev
                elif getattr(ev, "text", None) and hasattr(ev, "origins"):
                    shown.append(ev.text)
                yield ev
        finally:
            answer = fin.text if fin is not None else "".join(shown)
            stop = fin.stop_reason if fin is not None else "cancelled"
            if answer or stop != "cancelled":
                self.messages += [{"role": "user", "content": text},
                                  {"role": "assistant", "content": answer}]
            self.turns.append(Turn(text, answer, stop,
                                   fin.stats if fin is not None else RequestStats()))
