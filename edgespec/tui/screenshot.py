"""Run one request headless and save the screen as SVG: the README screenshot.

    python -m edgespec.tui.screenshot docs/tui.svg --target qwen-1.5b --proposer ngram --prompt "..."
    python -m edgespec.tui.screenshot docs/tui.svg --demo          # the scripted request, no model

The SVG is what Textual exports; ``--png`` also writes a PNG next to it with
rsvg-convert (Debian: librsvg2-bin).
"""
from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..proposers import names

from .app import create_app
from .demo import DEMO_PROMPT, demo_events
from .source import EngineSource, ScriptedSource, Settings, default_proposer

FIX_PROMPT = ("Here is a Python function with a bug. Fix the bug and return the whole corrected "
              "function.\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
              "    return total / (len(xs) - 1)\n")


async def capture(app, out: Path, size: tuple[int, int], timeout: float) -> None:
    async with app.run_test(size=size) as pilot:
        app.query_one("#prompt").cursor_blink = False
        await pilot.press("ctrl+r")
        deadline = time.monotonic() + timeout
        while app.running or not app.requests_started:
            if time.monotonic() > deadline:
                raise SystemExit(f"no answer within {timeout} s")
            await asyncio.sleep(0.1)
        await pilot.pause(0.3)
        if app.errors:
            raise SystemExit(f"the request failed: {app.errors[-1]}")
        out.write_text(app.export_screenshot(title="edgespec tui"), encoding="utf-8")


def svg_to_png(svg: Path, png: Path) -> None:
    """rsvg-convert drops the no-break spaces Textual pads text runs with; plain spaces
    under xml:space="preserve" render the same columns."""
    exe = shutil.which("rsvg-convert")
    if exe is None:
        raise SystemExit("rsvg-convert not found (apt install librsvg2-bin)")
    text = svg.read_text(encoding="utf-8").replace("&#160;", " ")
    text = re.sub(r"<svg ", '<svg xml:space="preserve" ', text, count=1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", encoding="utf-8") as tmp:
        tmp.write(text)
        tmp.flush()
        subprocess.run([exe, tmp.name, "-o", str(png)], check=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m edgespec.tui.screenshot", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", default="qwen-1.5b")
    ap.add_argument("--proposer", default=default_proposer(),
                    choices=names(plain=True, auto=True))
    ap.add_argument("--draft")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--prompt", default=FIX_PROMPT)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--size", default="120x36", help="COLSxROWS")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--png", action="store_true", help="also write OUT with .png")
    a = ap.parse_args(argv)
    cols, rows = (int(x) for x in a.size.lower().split("x"))
    if a.demo:
        source, prompt = ScriptedSource(demo_events), DEMO_PROMPT
        settings = None
    else:
        source, prompt = EngineSource(n_ctx=2048, threads=a.threads), a.prompt
        settings = Settings(target=a.target, proposer=a.proposer, draft=a.draft,
                            max_tokens=a.max_tokens)
    app = create_app(source, initial_prompt=prompt, settings=settings)
    asyncio.run(capture(app, a.out, (cols, rows), a.timeout))
    print(f"wrote {a.out}")
    if a.png:
        svg_to_png(a.out, a.out.with_suffix(".png"))
        print(f"wrote {a.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
