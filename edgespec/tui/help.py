"""The help screen: every key, and what the colours and panels mean."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("ctrl+r / F5", "run the prompt"),
    ("Esc", "cancel the running request"),
    ("up (first line), ctrl+up", "previous prompt"),
    ("down (last line), ctrl+down", "next prompt"),
    ("F2", "show / hide the settings panel"),
    ("F3", "token-origin colouring on / off"),
    ("F4", "pick the proposer (opens its list; shows the settings panel)"),
    ("ctrl+a", "select all in a text field (Home: line start)"),
    ("ctrl+n", "new conversation (with \"keep it\" on in the settings)"),
    ("F1 / ?", "this help (Esc closes it)"),
    ("tab / shift+tab", "move between fields"),
    ("ctrl+q", "quit"),
]

NOTES = """\
[b]Colours[/b]  Accepted draft tokens are [b]green[/b]: a proposer guessed them and the \
target agreed. Tokens the target produced itself are [b]blue[/b]: the bonus token after \
a fully accepted draft, the correction at the first rejection, and every plain step.

[b]Panels[/b]
• [b]accept[/b]: acceptance over the last 32 verify passes (win) and the whole request \
(req); the sparkline shows each pass.
• [b]draft[/b]: the draft length used last and who drafted; [b]per pass[/b]: tokens \
emitted per target pass, counting the target's own token.
• [b]decode[/b]: tokens/s after the first token, over the last 16 steps (the whole \
request's average once done). [b]plain[/b]: the plain path's decode rate on this \
target, [i]measured[/i] from timed plain steps (this request or an earlier one on the \
same target, e.g. with proposer none), else [i]model[/i]: each verify pass's time \
divided by its cost in single steps, taken as 1 + 0.25 × drafted tokens (fits Qwen2.5 \
1.5B on a 2-core CPU). [b]speedup[/b] is decode / plain: decode against decode, so \
what the prompt cost never dilutes it. [b]ttft[/b]: time to the first token (the \
prefill, and a proposer's own setup over the prompt), shown apart.
• [b]share[/b]: emitted tokens per proposer versus the target.
• [b]time[/b]: prefill / draft / verify passes / plain steps (nothing drafted).
• [b]memory[/b]: resident memory of this process.
• Accepted length per pass, acceptance by draft position, and the last requests \
for comparison ([b]reused[/b]: prompt tokens whose KV an earlier request left).

[b]Conversation[/b]  With [i]keep it[/i] on (settings, F2), each run sends the whole \
conversation and the engine reuses the KV of what it already holds; every earlier turn \
says how many of its prompt tokens were reused. With [i]exact greedy[/i] also on, the \
answer's KV is prefilled again while you read it (exact mode reuses only prefill-written \
KV), so the next turn reuses the answer too; a new run stops that refresh.
"""


def _keys() -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold")
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 96; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen Static { margin-bottom: 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "edgespec — keys"
            yield Static(_keys())
            yield Static(NOTES)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
