"""A bench request's record: the JSON shape every engine, anchor and llama.cpp tool
request is reported in, the parity mark against its plain path, and the memory figures.

A record is written whole to ``records.jsonl`` (:class:`RecordSink`) as soon as its unit is
done, then :func:`compact` drops what grows with the answer (token times, tokens, text) from
the copy the run keeps for its report: a run holds a bounded record per request, not its
tokens (docs/bench.md, "Memory").
"""
from __future__ import annotations

import resource
import json
import os
from pathlib import Path
from typing import Sequence

from ...api.stats import RequestStats
from ...errors import EdgespecError
from . import tools
from .matrix import BASELINE
from .stats import latency_histogram
import psutil


def tool_prompt_text(target, tokens: Sequence[int]) -> str:
    """Text that llama.cpp's tools tokenize (add_special, parse_special) into exactly ``tokens``:
    the rendered prompt, less a leading BOS when the tokenizer adds one itself."""
    try:
        text = target.detokenize(list(tokens), special=True).decode("utf-8")
    except UnicodeDecodeError:
        raise EdgespecError("the prompt is not valid UTF-8 once detokenized; llama.cpp's tools "
                            "cannot be given the same tokens") from None
    if target.tokenize(text, add_special=True, parse_special=True) == list(tokens):
        return text
    bos = target.detokenize([target.bos], special=True).decode("utf-8", "replace")
    if bos and text.startswith(bos):
        rest = text[len(bos):]
        if target.tokenize(rest, add_special=True, parse_special=True) == list(tokens):
            return rest
    raise EdgespecError("the prompt's text does not tokenize back into the engine's prompt "
                        "tokens, so llama.cpp's tools would see another prompt (skipped for them)")


def tool_record(run: "tools.ToolRun", max_tokens: int) -> dict:
    """A llama.cpp tool's run in the shape of an engine record (per-token fields empty: the
    tools report totals only)."""
    t = run.timing
    nan = float("nan")
    acc = (t.accepted / t.drafted) if t.drafted else nan
    return {
        "proposer": None, "prompt_tokens": t.prompt_tokens, "generated_tokens": t.generated,
        "stop_reason": "length" if t.generated >= max_tokens else "eos",
        "drafted": t.drafted or 0, "accepted": t.accepted or 0, "acceptance_rate": acc,
        "verify_passes": t.passes, "plain_steps": None,
        "mean_accepted_length": (t.decode_tokens / t.passes) if t.passes else nan,
        "accepted_length_hist": {}, "position_acceptance": [], "proposer_share": {},
        "control_events": {}, "prefill_seconds": t.prefill_seconds, "ttft_seconds": t.prefill_seconds,
        "decode_seconds": t.decode_seconds, "decode_tokens_per_second": t.decode_tokens_per_second,
        "e2e_seconds": t.prefill_seconds + t.decode_seconds, "wall_seconds": run.wall_seconds,
        "itl_p50": None, "itl_p95": None, "itl_p99": None, "token_times": [],
        "position_drafted": [], "position_accepted": [], "rss_peak_bytes": 0,
        "process_peak_rss_bytes": 0, "tokens": [], "text": run.text,
        "system_info": run.system_info,
    }


def stats_record(stats: RequestStats, tokens: list[int], text: str, wall: float, rss: int) -> dict:
    d = stats.to_dict()
    d.update(e2e_seconds=stats.total_seconds, wall_seconds=wall, rss_peak_bytes=rss,
             process_peak_rss_bytes=_max_rss(), token_times=list(stats.token_times),
             position_drafted=list(stats.position_drafted),
             position_accepted=list(stats.position_accepted),
             tokens=tokens, text=text)
    return d


#: what a kept record drops once it is on disk: each grows with the answer's length
PER_TOKEN_FIELDS = ("token_times", "tokens", "text")


def compact(rec: dict) -> dict:
    """In place: the per-token fields replaced by their bounded summaries (the ITL histogram,
    the answer's length in characters); returns ``rec``."""
    times = rec.pop("token_times", None)
    if times is not None:
        rec["itl_hist"] = latency_histogram(times)
    text = rec.pop("text", None)
    if text is not None:
        rec["text_chars"] = len(text)
    rec.pop("tokens", None)
    return rec


class RecordSink:
    """Appends each full record to a JSON-lines file, flushed per unit, so what a run
    measured is on disk as it goes (and survives a kill)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._f = None  # opened by the first unit: a run refused before it leaves no directory
        self.written = 0

    def write(self, records: Sequence[dict]) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", encoding="utf-8")
        for r in records:
            self._f.write(json.dumps(r, default=_jsonable) + "\n")
            self.written += 1
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def _jsonable(x):  # type: ignore[no-untyped-def]
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def error_record(message: str) -> dict:
    return {"error": message}


def mark_parity(records: list[dict], greedy: bool, baseline: dict[str, str] | None = None) -> None:
    """Same output tokens as its plain path (ours, or an anchor's own) on this unit? Only for
    greedy runs, and only where tokens are known (llama.cpp's tools report text)."""
    by_label = {r.get("config"): r for r in records if "tokens" in r}
    for r in records:
        base = by_label.get((baseline or {}).get(r.get("config"), BASELINE))
        if (r.get("config") == BASELINE or base is None or base is r or not greedy
                or not r.get("tokens") or not base.get("tokens")):
            r["parity"] = None
        else:
            r["parity"] = r["tokens"] == base["tokens"]


def process():
    try:
        return psutil.Process()
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None


def rss_of(proc) -> int:
    return int(proc.memory_info().rss) if proc is not None else 0


def _max_rss() -> int:
    # ru_maxrss is the process high-water mark, in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
