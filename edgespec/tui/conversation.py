"""The conversation the TUI keeps: what each turn sends and how much of it was reused.

The app sends the whole history every turn, as any chat client does; the engine reuses the
KV of the longest prefix it already holds (edgespec.decoding.kvcache), and each turn's stats say how
many prompt tokens that was. The bookkeeping follows edgespec.chat.conversation.Conversation: a
cancelled answer stays in the history when something of it was shown, and a turn that showed
nothing leaves no message.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..api.events import Finished


@dataclass(frozen=True)
class TurnRecord:
    user: str
    answer: str
    stop_reason: str
    prompt_tokens: int
    reused: int  # prompt tokens whose KV an earlier turn left (prefix reuse)


class Transcript:
    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []

    def __len__(self) -> int:
        return len(self.turns)

    def messages(self, user: str) -> list[dict]:
        """The chat messages of the next turn: the history, then ``user``."""
        out: list[dict] = []
        for t in self.turns:
            out += [{"role": "user", "content": t.user},
                    {"role": "assistant", "content": t.answer}]
        return [*out, {"role": "user", "content": user}]

    def record(self, user: str, fin: Finished) -> TurnRecord | None:
        """Keep a finished turn; None when it showed nothing and was cancelled."""
        if not fin.text and fin.stop_reason == "cancelled":
            return None
        s = fin.stats
        turn = TurnRecord(user, fin.text, fin.stop_reason, s.prompt_tokens, s.prompt_reused)
        self.turns.append(turn)
        return turn

    def clear(self) -> None:
        self.turns.clear()
