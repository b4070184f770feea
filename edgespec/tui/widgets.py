"""The app's own widgets: the origin-coloured answer and the prompt box with history."""
from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Checkbox, Static, TextArea

from ..api.events import Step

DRAFT = "draft"
TARGET = "target"


def step_pieces(step: Step) -> list[tuple[str, str]]:
    """(text, origin) runs of one step.

    Exact when the engine fills ``Step.pieces``. Otherwise the step's text is
    split at a character boundary proportional to its draft tokens, which is
    only approximately where the draft prefix ends.
    """
    if step.pieces and len(step.pieces) == len(step.origins):
        return list(zip(step.pieces, step.origins))
    if not step.origins or len(set(step.origins)) == 1:
        return [(step.text, step.origins[0] if step.origins else TARGET)]
    n_draft = sum(o == DRAFT for o in step.origins)
    cut = round(len(step.text) * n_draft / len(step.origins))
    return [(step.text[:cut], DRAFT), (step.text[cut:], TARGET)]


class AnswerView(Static):
    """The streamed answer; each run of text coloured by where its tokens came from."""

    COMPONENT_CLASSES = {"answer--draft", "answer--target", "answer--context"}
    DEFAULT_CSS = """
    AnswerView { width: 1fr; height: auto; }
    AnswerView > .answer--draft { color: $text-success; text-style: bold; }
    AnswerView > .answer--target { color: $text-primary; }
    AnswerView > .answer--context { color: $text-muted; }
    """

    colour = reactive(True)

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self.runs: list[tuple[str, str]] = []
        #: shown above the answer, muted: the conversation so far (edgespec.tui.conversation)
        self.context: Text = Text()
        self._dirty = False

    def clear(self) -> None:
        self.runs.clear()
        self._dirty = True

    def set_context(self, context: Text) -> None:
        self.context = context
        self._dirty = True

    def add_step(self, step: Step) -> None:
        for text, origin in step_pieces(step):
            if not text:
                continue
            if self.runs and self.runs[-1][1] == origin:
                self.runs[-1] = (self.runs[-1][0] + text, origin)
            else:
                self.runs.append((text, origin))
        self._dirty = True

    @property
    def plain(self) -> str:
        return "".join(t for t, _ in self.runs)

    def origin_styles(self) -> dict[str, Style]:
        return {DRAFT: self.get_component_rich_style("answer--draft", partial=True),
                TARGET: self.get_component_rich_style("answer--target", partial=True)}

    def styled_text(self) -> Text:
        context = self.context.copy()
        context.stylize(self.get_component_rich_style("answer--context", partial=True))
        if not self.colour:
            return context + Text(self.plain)
        styles = self.origin_styles()
        text = context
        for run, origin in self.runs:
            text.append(run, styles[origin])
        return text

    def flush(self) -> bool:
        """Redraw if something arrived since the last flush; True when it did."""
        if not self._dirty:
            return False
        self._dirty = False
        self.update(self.styled_text())
        return True

    def watch_colour(self) -> None:
        self._dirty = True
        self.flush()


class PromptArea(TextArea):
    """Multi-line prompt; up on the first line / down on the last walk the history."""

    class Recall(Message):
        def __init__(self, direction: int) -> None:
            self.direction = direction
            super().__init__()

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0:
            self.post_message(self.Recall(-1))
        else:
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] >= self.document.line_count - 1:
            self.post_message(self.Recall(+1))
        else:
            super().action_cursor_down(select)


class Tick(Checkbox):
    """A checkbox whose box is empty while it is off.

    Textual draws the X in both states and tells them apart by colour only; in the compact
    panel an unticked "exact greedy" read as ticked.
    """

    def render(self):
        self.BUTTON_INNER = "X" if self.value else " "
        return super().render()


class History:
    """Prompt history: recall walks back from the newest; the draft being typed is kept."""

    def __init__(self, limit: int = 100) -> None:
        self.items: list[str] = []
        self.limit = limit
        self._pos: int | None = None
        self._draft = ""

    def add(self, prompt: str) -> None:
        if prompt and (not self.items or self.items[-1] != prompt):
            self.items.append(prompt)
            del self.items[:-self.limit]
        self._pos = None

    def recall(self, direction: int, current: str) -> str | None:
        """The prompt one step back (-1) or forward (+1); None when there is nowhere to go."""
        if not self.items:
            return None
        if self._pos is None:
            if direction > 0:
                return None
            self._draft = current
            self._pos = len(self.items)
        pos = self._pos + direction
        if pos < 0:
            return None
        if pos >= len(self.items):
            self._pos = None
            return self._draft
        self._pos = pos
        return self.items[pos]

