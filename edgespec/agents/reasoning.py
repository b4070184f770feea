"""A reasoning model's leading ``<think>…</think>`` block, split off its answer, incrementally.

Reasoning models (DeepSeek-R1, Qwen3, QwQ) open their answer with one thinking block; OpenAI-
compatible servers return it apart, as ``reasoning_content`` (llama-server's
``--reasoning-format deepseek``), so a client shows or hides it and never sends it back as
the answer. Only a *leading* block is split (after optional whitespace): text that mentions
``<think>`` later, such as code or an explanation of the tags, stays content.

Some templates open the block in the prompt itself (DeepSeek-R1's generation prompt ends in
``<think>\\n``): ``started=True`` then reads the output as reasoning from its first
character. A block the output never closes (the request hit ``max_tokens`` mid-thought) is
reasoning to the end, as llama-server reports it.

Text is fed in arbitrary pieces (a speculative step emits several tokens, a tag can straddle
two steps); a piece that could be the start of a tag is held back until the next piece
decides it, so every split is the one the whole text would get.
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"

#: --reasoning-format values: "none" leaves the block in the content; "deepseek" splits it;
#: "auto" is llama-server's default spelling of the same split
FORMATS = ("none", "deepseek", "auto")


def splits(reasoning_format: str) -> bool:
    """Whether this --reasoning-format value splits reasoning off the content."""
    if reasoning_format not in FORMATS:
        raise ValueError(f"reasoning format {reasoning_format!r}; use one of {', '.join(FORMATS)}")
    return reasoning_format != "none"


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt leaves a thinking block open for the output to continue."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN)


@dataclass
class Split:
    """What one piece of output adds to each channel."""

    reasoning: str = ""
    content: str = ""


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``: the
    characters that must wait for the next piece before they can be emitted."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Feed output text in pieces; each :meth:`feed` returns the reasoning and content it
    settles, :meth:`finish` the rest. Their concatenations are the whole text's split.

    >>> s = ReasoningSplitter()
    >>> [s.feed(p) for p in ("<thi", "nk>\\nIt is 4.</th", "ink>\\n\\n", "4")]
    [Split(reasoning='', content=''), Split(reasoning='It is 4.', content=''), Split(reasoning='', content=''), Split(reasoning='', content='4')]
    """

    def __init__(self, started: bool = False, open_tag: str = OPEN, close_tag: str = CLOSE) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        # "start": before the first non-space text (a block may open); "inside": thinking;
        # "after": the answer (a block may no longer open)
        self.state = "inside" if started else "start"
        self._buf = ""
        self._lead = True  # strip whitespace at the start of the current channel
        self.reasoning = ""  # everything settled so far, per channel
        self.content = ""

    def feed(self, text: str) -> Split:
        self._buf += text
        out = Split()
        while True:
            if self.state == "start":
                head = self._buf.lstrip()
                if head.startswith(self.open_tag):
                    self._buf = head[len(self.open_tag):]
                    self.state, self._lead = "inside", True
                    continue
                if self.open_tag.startswith(head):  # empty, or a partial tag: wait
                    break
                self.state, self._lead = "after", False
                continue
            if self.state == "inside":
                if self._lead:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        break
                    self._lead = False
                at = self._buf.find(self.close_tag)
                if at >= 0:
                    out.reasoning += self._buf[:at].rstrip()
                    self._buf = self._buf[at + len(self.close_tag):]
                    self.state, self._lead = "after", True
                    continue
                # hold back a partial close tag, and trailing whitespace (dropped if the tag
                # follows it, emitted if more thinking does)
                keep = held_prefix(self._buf, self.close_tag)
                body = self._buf[:len(self._buf) - keep]
                settled = body.rstrip()
                out.reasoning += settled
                self._buf = self._buf[len(settled):]
                break
            # after
            if self._lead:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._lead = False
            out.content += self._buf
            self._buf = ""
            break
        self.reasoning += out.reasoning
        self.content += out.content
        return out

    def finish(self) -> Split:
        """What is still held: an unclosed block's tail is reasoning; anything else content."""
        out = Split()
        if self.state == "inside":
            out.reasoning = self._buf.rstrip() if not self._lead else ""
        elif self.state == "start":
            out.content = self._buf  # whitespace, or a partial tag that never completed
        else:
            out.content = "" if self._lead else self._buf
        self._buf = ""
        self.reasoning += out.reasoning
        self.content += out.content
        return out
