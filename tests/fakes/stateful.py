"""The fake backend plus llama.cpp's per-sequence state API, for prefix-reuse and session tests."""
from __future__ import annotations

import json

from fakes import FakeContext, FakeModel


class StatefulContext(FakeContext):
    """The fake context plus llama.cpp's per-sequence state API (a JSON token list)."""

    def state_get(self, seq_id: int = 0) -> bytes:
        return json.dumps({"seq": self.tokens(seq_id), "pad": "x" * 200}).encode()

    def state_set(self, state: bytes, seq_id: int = 0) -> None:
        self.kv[seq_id] = list(json.loads(state)["seq"])
        self.calls.append("restore")


class StatefulModel(FakeModel):
    def new_context(self, n_ctx, n_batch=512, n_threads=None, n_seq_max=1, **_):
        ctx = StatefulContext(self, n_ctx=n_ctx, n_batch=max(1, min(n_batch, n_ctx)),
                              n_threads=n_threads or 1, n_seq_max=n_seq_max)
        self.contexts.append(ctx)
        return ctx
