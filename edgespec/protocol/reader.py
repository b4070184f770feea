"""One choice's engine events -> core events (pure: no thread, no loop, no model).

The async :class:`~.core.Core` and the synchronous :func:`~.core.run` both feed a
:class:`ChoiceReader` with the engine's :class:`~edgespec.api.events.Step` and
:class:`~edgespec.api.events.Finished` events. A chat turn's output goes through its
:class:`edgespec.agents.TurnOutput` (reasoning split, tool-call markup), which may hold
text back; a step's logprobs then travel on a TextDelta with empty text, so that every
emitted token's logprob reaches the client exactly once.
"""
from __future__ import annotations

from typing import Any

from ..api.events import Finished, Step
from .events import FINISH, ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, TokenPiece, \
    ToolCall, ToolCallDelta
from .timings import timings


def pieces(step: Step) -> tuple[TokenPiece, ...]:
    """Each token of ``step`` with its text piece and origin: the proposer that drafted it
    (its position in the draft) or the target."""
    texts = step.pieces if len(step.pieces) == len(step.tokens) else \
        (step.text,) + ("",) * (len(step.tokens) - 1) if step.tokens else ()
    out = []
    for i, (text, origin) in enumerate(zip(texts, step.origins)):
        drafted = origin == "draft"
        out.append(TokenPiece(text, (step.proposer or "draft") if drafted else "target",
                              step.drafted, i if drafted else None, i))
    return tuple(out)


class ChoiceReader:
    """The core events of choice ``index``; ``out`` is the turn's output parser (an
    edgespec.agents.TurnOutput) or None for plain text; ``prefix`` is text that starts
    the answer (completions' ``echo``)."""

    def __init__(self, index: int, out: Any = None, *, origins: bool = False,
                 prefix: str = "", request: int = 0) -> None:
        self.index = index
        self.request = request
        self.out = out
        self.origins = origins
        self.prefix = prefix
        self.sent = ""  # the engine text read so far (held-back text is released at the end)
        self.done: ChoiceDone | None = None

    def start(self) -> list[CoreEvent]:
        return [TextDelta(self.index, self.prefix)] if self.prefix else []

    def step(self, ev: Step) -> list[CoreEvent]:
        if not (ev.text or ev.logprobs or ev.tokens):
            return []
        self.sent += ev.text
        toks = pieces(ev) if self.origins else ()
        if self.out is None:
            return [TextDelta(self.index, ev.text, toks, ev.logprobs)] \
                if ev.text or ev.logprobs or toks else []
        events = self._deltas(self.out.feed(ev.text))
        if (ev.logprobs or toks) and not any(isinstance(e, TextDelta) for e in events):
            # the parser held the text back: the tokens still count, on an empty delta
            events.insert(0, TextDelta(self.index, "", toks, ev.logprobs))
        elif ev.logprobs or toks:
            first = next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
            e = events[first]
            events[first] = TextDelta(self.index, e.text, toks, ev.logprobs)  # type: ignore[union-attr]
        return events

    def finish(self, fin: Finished) -> list[CoreEvent]:
        events: list[CoreEvent] = []
        if fin.text.startswith(self.sent) and len(fin.text) > len(self.sent):
            # text the assembler held back (a possible stop string) and released
            rest = fin.text[len(self.sent):]
            events += [TextDelta(self.index, rest)] if self.out is None \
                else self._deltas(self.out.feed(rest))
        finish = FINISH.get(fin.stop_reason, "stop")
        text, reasoning = fin.text, None
        calls: tuple[ToolCall, ...] = ()
        if self.out is not None:
            final = self.out.finish(fin.stop_reason)
            events += self._deltas(final.deltas)
            finish = final.finish_reason or finish
            text = self.out.content
            reasoning = self.out.reasoning_content or None
            calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in self.out.tool_calls)
        s = fin.stats
        self.done = ChoiceDone(
            self.index, finish, fin.stop_reason, self.prefix + text, reasoning, calls,
            prompt_tokens=s.prompt_tokens, completion_tokens=len(fin.tokens),
            timings=timings(fin), stats=s, logprobs=tuple(fin.logprobs),
            prompt_cached=s.prompt_reused, tokens=tuple(fin.tokens), request=self.request)
        events.append(self.done)
        return events

    def _deltas(self, deltas: list[dict[str, Any]]) -> list[CoreEvent]:
        """edgespec.agents' OpenAI-shaped stream deltas as core events."""
        out: list[CoreEvent] = []
        for d in deltas:
            if d.get("reasoning_content"):
                out.append(ReasoningDelta(self.index, d["reasoning_content"]))
            if d.get("content"):
                out.append(TextDelta(self.index, d["content"]))
            for c in d.get("tool_calls") or ():
                fn = c.get("function") or {}
                out.append(ToolCallDelta(self.index, c["index"], c.get("id"), fn.get("name"),
                                         fn.get("arguments") or ""))
        return out
