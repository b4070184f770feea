"""Pure Rich renderings of the live numbers (no widgets, so tests can read them as text)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from rich.style import Style
from rich.text import Text

from ..api.stats import RequestStats

from .metrics import LiveMetrics

_EIGHTHS = " ▏▎▍▌▋▊▉█"
LABEL = 9  # width of the label column in the numbers block


@dataclass(frozen=True)
class Palette:
    draft: Style = Style(color="green", bold=True)
    target: Style = Style(color="cyan")
    label: Style = Style(bold=True)
    dim: Style = Style(dim=True)
    bar: Style = Style(color="magenta")
    verify: Style = Style(color="magenta")  # the time split's verify passes


def bar(fraction: float, width: int) -> str:
    """A left-aligned bar of `width` cells filled to `fraction`, in eighth-cell steps."""
    width = max(width, 0)
    eighths = round(max(0.0, min(fraction, 1.0)) * width * 8)
    full, part = divmod(eighths, 8)
    out = "█" * full + (_EIGHTHS[part] if part and full < width else "")
    return out.ljust(width)


def split_cells(values: Sequence[float], width: int) -> list[int]:
    """Cells per value, proportional, summing to width (largest remainder)."""
    total = sum(values)
    if total <= 0 or width <= 0:
        return [0] * len(values)
    exact = [v / total * width for v in values]
    cells = [int(x) for x in exact]
    by_rest = sorted(range(len(values)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_rest[:width - sum(cells)]:
        cells[i] += 1
    return cells


def fill(words: Sequence[str], width: int) -> list[str]:
    """Words joined by spaces into lines of at most ``width`` (a longer word alone)."""
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines


def pct(x: float | None) -> str:
    return "  -" if x is None else f"{x:4.0%}".strip().rjust(4)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def mib(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 2**20:,.0f} MiB"


_LEVELS = " ▁▂▃▄▅▆▇█"


def spark_text(values: Sequence[float], *, width: int, height: int = 2,
               p: Palette = Palette()) -> Text:
    """One column per verify pass (newest on the right) on an absolute 0..1 scale.

    A pass that accepted nothing still gets a low mark, in the target's colour,
    so it reads differently from "no pass".
    """
    t = Text(no_wrap=True, overflow="crop")
    if not values:
        t.append("no verify pass yet", p.dim)
        t.append("\n" * (height - 1))
        return t
    shown = list(values)[-width:]
    steps = 8 * height
    rows = []
    for row in reversed(range(height)):
        line = Text(no_wrap=True)
        for v in shown:
            level = round(max(0.0, min(v, 1.0)) * steps)
            if level == 0:
                line.append("▁" if row == 0 else " ", p.target)
            else:
                line.append(_LEVELS[max(0, min(level - 8 * row, 8))], p.draft)
        rows.append(line)
    return Text("\n", no_wrap=True).join(rows)


def live_text(m: LiveMetrics, *, rss: int | None, width: int, p: Palette = Palette()) -> Text:
    """The numbers block: acceptance, draft length, rates, share, time split, memory."""
    s = m.stats
    width = max(width, 20)
    inner = width - LABEL
    t = Text(no_wrap=True, overflow="ellipsis")

    def label(name: str) -> None:
        t.append(f"{name:<{LABEL}}", p.label)

    def caption(text: str) -> None:
        # under the bar when it fits, else from the left edge rather than wrapped
        t.append("\n" + (" " * LABEL if LABEL + len(text) <= width else ""))
        t.append(text, p.dim)

    label("accept")
    t.append(f"{pct(m.window_acceptance)} win  {pct(s.acceptance_rate if s.drafted else None)} req\n")
    label("draft")
    t.append(f"len {'-' if m.k is None else m.k}"
             + (f" {m.proposer_now}" if m.proposer_now else "") + "\n")
    label("per pass")
    t.append(f"{s.mean_accepted_length:.2f} tok\n")
    if s.tree_passes:  # draft trees (--tree-width): only where one was verified
        label("trees")
        t.append(f"{s.tree_passes} · path {s.tree_path_length:.2f} · off 1st "
                 f"{s.branch_utilisation:.0%}\n")
    # decode rates on both sides of the speedup; what the prompt cost is TTFT, shown apart
    label("decode")
    rate = m.tokens_per_second_now
    t.append(f"{rate:5.1f} tok/s {'avg' if m.done else 'now'}\n")
    est = m.plain_estimate()
    label("plain")
    if est is None:
        t.append("    - (nothing timed)\n", p.dim)
    else:
        t.append(f"{est.tokens_per_second:5.1f} tok/s ")
        t.append(f"{est.basis}\n", p.dim)
        label("speedup")
        t.append(f"×{rate / est.tokens_per_second:.2f}\n" if rate else "-\n", p.label)
    label("ttft")
    t.append(f"{ms(m.ttft_seconds):>5} ms" if m.ttft_seconds is not None else "    -")
    if s.prefill_seconds > 0:
        t.append(f" prefill {ms(s.prefill_seconds)}", p.dim)
    t.append("\n")

    share = s.proposer_share
    label("share")
    if share:
        n_draft = round((1.0 - share.get("target", 0.0)) * inner)
        t.append("█" * n_draft, p.draft)
        t.append("█" * (inner - n_draft), p.target)
        names = [(k, v) for k, v in share.items() if k != "target"] + [("target", share["target"])]
        caption(" ".join(f"{k} {v:.0%}" for k, v in names))
    else:
        t.append("-", p.dim)
    t.append("\n")

    split = m.time_split
    total = sum(split.values())
    label("time")
    if total > 0:
        styles = {"pre": p.dim, "draft": p.draft, "verify": p.verify, "plain": p.target}
        for (k, _), n in zip(split.items(), split_cells(list(split.values()), inner)):
            t.append("█" * n, styles.get(k, p.dim))
        for line in fill([f"{k} {v / total:.0%}" for k, v in split.items() if v > 0], inner):
            caption(line)
    else:
        t.append("-", p.dim)
    t.append("\n")
    label("memory")
    t.append(f"{mib(rss)} RSS")
    return t


def histogram_text(hist: Counter, *, width: int, p: Palette = Palette(),
                   max_rows: int = 8) -> Text:
    """Accepted length per target pass (1 = the target's own token only)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("accepted length / pass\n", p.label)
    if not hist:
        t.append("  -", p.dim)
        return t
    top = max(hist.values())
    n_width = len(str(top))
    inner = max(width - 4 - n_width - 1, 4)
    rows = list(range(1, max(hist) + 1))
    if len(rows) > max_rows:  # a long tail: only the lengths that occurred
        rows = sorted(k for k, v in hist.items() if v)
    for k in rows:
        v = hist.get(k, 0)
        t.append(f"{k:>2} ")
        t.append(bar(v / top, inner), p.draft if k > 1 else p.target)
        t.append(f" {v:>{n_width}}")
        if k != rows[-1]:
            t.append("\n")
    return t


def positions_text(rates: Sequence[float], drafted: Sequence[int], *, width: int,
                   p: Palette = Palette(), limit: int = 8) -> Text:
    """Acceptance rate of the i-th drafted token, given it was drafted."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("acceptance by draft position\n", p.label)
    if not rates:
        t.append("  -", p.dim)
        return t
    inner = max(width - 3 - 5, 4)
    shown = list(zip(rates, drafted))[:limit]
    for i, (r, _) in enumerate(shown, 1):
        t.append(f"{i:>2} ")
        t.append(bar(r, inner), p.draft)
        t.append(f" {r:4.0%}")
        if i != len(shown):
            t.append("\n")
    return t


def summary_line(s: RequestStats) -> str:
    """One line that stays under the answer after the request ends."""
    acc = f"acc {s.acceptance_rate:.0%} · " if s.drafted else ""
    ttft = f"ttft {ms(s.ttft_seconds)} ms · " if s.ttft_seconds is not None else ""
    reused = f"reused {reused_text(s)} · " if s.prompt_reused else ""
    trees = (f"trees {s.tree_passes} (path {s.tree_path_length:.2f}, off 1st "
             f"{s.branch_utilisation:.0%}) · " if s.tree_passes else "")
    return (f"{s.generated_tokens} tok · {s.total_seconds:.1f} s · {ttft}{reused}"
            f"{s.decode_tokens_per_second:.1f} tok/s · {acc}{trees}"
            f"len {s.mean_accepted_length:.2f} · {s.stop_reason}")


def reused_text(s: RequestStats) -> str:
    """Prompt tokens whose KV an earlier request left, of the prompt: "180/212"."""
    return f"{s.prompt_reused}/{s.prompt_tokens}"


def history_row(n: int, label: str, s: RequestStats) -> tuple[str, ...]:
    return (str(n), label, str(s.generated_tokens), reused_text(s),
            f"{s.decode_tokens_per_second:.1f}", f"{s.acceptance_rate:.0%}" if s.drafted else "-",
            f"{s.mean_accepted_length:.2f}", s.stop_reason)


HISTORY_COLUMNS = ("#", "proposer", "tok", "reused", "tok/s", "acc", "len", "stop")

#: the controller's decisions in plain words, for the status line (its reasons, which name
#: cost curves and evidence counts, stay in the stats and the logs)
CONTROL_WORDS = {
    "fallback": "drafting stopped: the guesses were not paying",
    "probe": "trying {p} again to see if it pays now",
    "recover": "drafting back on: the guesses pay again",
    "policy": "switched to {p}: it pays best here",
    "guard_off": "drafting paused: it was slower than plain decoding",
    "guard_on": "drafting resumed: faster than plain again",
    "guarded": "drafting held off: slower than plain decoding here",
    "canary_off": "drafting off for this kind of request: it did not pay",
    "canary_on": "drafting on for this kind of request: it pays",
    "canary": "testing whether drafting pays for this kind of request",
    "canary_probe": "re-testing whether drafting pays for this kind of request",
    "canary_held": "drafting held off for this kind of request",
    "load_yield": "drafting paused: the machine is busy",
    "load_resume": "drafting resumed: the machine is quiet again",
    "draft_length": "now drafting {n} tokens at a time",
}


def control_words(kind: str, proposer: str | None = None, k: int | None = None) -> str:
    """A controller decision (api.events.Control) as a newcomer would say it."""
    words = CONTROL_WORDS.get(kind, f"speculation: {kind.replace('_', ' ')}")
    return words.format(p=proposer or "the proposer",
                        n="?" if k is None else k)


def transcript_text(turns: Sequence, user: str | None) -> Text:
    """The conversation above the answer: each earlier turn under a header that says how
    many of its prompt tokens were reused, then the message being answered."""
    t = Text()
    for i, turn in enumerate(turns, 1):
        t.append(f"▸ you · turn {i} · reused {turn.reused}/{turn.prompt_tokens} "
                 "prompt tokens\n", Style(bold=True))
        t.append(f"{turn.user}\n")
        t.append(f"◂ {'answer (cancelled)' if turn.stop_reason == 'cancelled' else 'answer'}\n",
                 Style(bold=True))
        t.append(f"{turn.answer}\n\n")
    if user is not None:
        t.append(f"▸ you · turn {len(turns) + 1}\n", Style(bold=True))
        t.append(f"{user}\n")
        t.append("◂ answer\n", Style(bold=True))
    return t
