"""The help screen: every key, and what the colours and panels mean."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# edgespec — keys

| key | what it does |
|---|---|
| **ctrl+r** / **F5** | run the prompt |
| **Esc** | cancel the running request |
| **up** on the first line, **ctrl+up** | previous prompt |
| **down** on the last line, **ctrl+down** | next prompt |
| **F2** | show / hide the settings panel |
| **F3** | colouring of token origins on / off |
| **F1** / **?** | this help (Esc closes it) |
| **tab** / **shift+tab** | move between fields |
| **ctrl+q** | quit |

## Colours
Accepted draft tokens are **green**: a proposer guessed them and the target agreed.
Tokens the target produced itself are **blue**: the bonus token after a fully
accepted draft, the correction at the first rejection, and every plain step.

## Panels
- **accept**: acceptance over the last 32 verify passes (*win*) and the whole request
  (*req*); the sparkline shows each pass.
- **draft len**: the draft length the controller chose last; **mean acc len**: tokens
  emitted per target pass, counting the target's own token.
- **rate**: tokens/s over the last 16 steps (the decode average once done).
  **plain**: the plain path's rate on this target, *measured* from timed plain steps
  (this request or an earlier one on the same target, e.g. proposer `none`), else
  *model*: each verify pass's time divided by its cost in single steps, taken as
  1 + 0.25 × drafted tokens (fits Qwen2.5 1.5B on a 2-core CPU). The × is rate / plain.
- **share**: emitted tokens per proposer versus the target.
- **time**: prefill / draft / verify (plain steps count as verify).
- **memory**: resident memory of this process.
- Histogram of accepted length per pass, acceptance by draft position, and the last
  requests for comparison.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 96; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
