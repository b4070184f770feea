"""A row tap: rows a target context's decodes produce, kept by (sequence, position).

The heads fed by the target's verify pass (``mtp``, ``eagle3``) read, for every position
the target decoded, a row the target computed on the way (its NextN hidden state, or three
layers' inputs): a by-product of a decode that must be copied out before the next one
overwrites it. :class:`RowTap` is that bookkeeping, once; a kind says only how llama.cpp is
told to publish its rows and how a decode's rows are read (:class:`~.mtp.NextnTap`,
:class:`~.eagle3.LayerTap`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .context import Context


class RowTap:
    """Rows by (sequence, position), attached to a target :class:`Context` as its one decode
    hook (``ctx.nextn_tap``): called after every ``llama_decode`` of that context with the
    batch just evaluated. A decode at positions ``a..b`` of a sequence makes every row past
    ``b`` stale (the target trimmed them), so those are dropped. Readers forget what they no
    longer need (:meth:`forget_below`)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rows: dict[int, dict[int, np.ndarray]] = {}
        self._switch(True)
        ctx.nextn_tap = self

    def _switch(self, on: bool) -> None:
        """Ask llama.cpp to publish (or stop publishing) this kind's rows (abstract)."""
        raise NotImplementedError

    def _read(self, handle: Any, n: int) -> np.ndarray | None:
        """The ``n`` rows of the decode just run, ``[n, width]``, owned by the caller (not
        llama.cpp's buffer); None when llama.cpp has none (abstract)."""
        raise NotImplementedError

    def __call__(self, handle: Any, batch: Any, n: int) -> None:
        if n <= 0:
            return
        got = self._read(handle, n)
        if got is None:
            return
        last: dict[int, int] = {}
        for i in range(n):
            seq, pos = int(batch.seq_id[i][0]), int(batch.pos[i])
            self.rows.setdefault(seq, {})[pos] = got[i]
            last[seq] = max(last.get(seq, -1), pos)
        for seq, top in last.items():
            rows = self.rows[seq]
            for pos in [p for p in rows if p > top]:
                del rows[pos]

    def row(self, seq: int, pos: int) -> np.ndarray | None:
        return self.rows.get(seq, {}).get(pos)

    def forget_below(self, seq: int, pos: int) -> None:
        rows = self.rows.get(seq, {})
        for p in [p for p in rows if p < pos]:
            del rows[p]

    def detach(self) -> None:
        if getattr(self.ctx, "nextn_tap", None) is self:
            self.ctx.nextn_tap = None
            if not getattr(self.ctx, "_closed", True):
                self._switch(False)
        self.rows.clear()
