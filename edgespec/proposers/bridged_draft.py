"""A GGUF draft model with its own tokenizer, proposing for the target through the
vocabulary bridge (:mod:`edgespec.proposers.vocab_bridge`).

The draft continues the *text* with its argmax tokens; the bridge turns its new text into
the target's tokens. The draft has no distribution over target tokens, so every proposal is
a point mass (``probs=None``): greedy verification accepts the target's argmax, sampling
accepts a drafted token with the target's own probability of it, which keeps sampling
lossless (docs/parity.md). Only models.toml-pinned pairs run (edgespec.registry.bridge_pins).

Time is kept in two accounts: draft inference (the draft's decodes) and the bridge
(tokenize, detokenize, alignment), so the bridge's cost is measured on its own; the
controller weighs their sum per proposed target token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .vocab_bridge import BRIDGE_VERSION, Bridge
from ..api.arrays import FloatArray
from ..errors import InvalidInputError
from ..api.params import SamplingParams
from .base import EMPTY_DRAFT, Draft
from ..decoding.kvcache import common_prefix
from ..runtime.kernel import KernelConfig
from .vocab_check import vocab_mismatch

if TYPE_CHECKING:
    from ..runtime.model import Model

#: the registry's pin check of a pair (target, draft, bridge version) -> its pin record
PinCheck = Callable[["Model", "Model", str], object]


@dataclass
class BridgeTimes:
    """Where a bridged draft's time went (seconds), over a session or the proposer's life."""

    steps: int = 0  # proposals made
    draft_tokens: int = 0  # tokens the draft model decoded while proposing
    target_tokens: int = 0  # target tokens proposed
    ends: int = 0  # proposals ending in the target's end token mapped from the draft's
    draft_seconds: float = 0.0  # the draft model's decodes
    bridge_seconds: float = 0.0  # tokenize/detokenize/alignment, proposing and syncing
    # the same work in this thread's CPU time: what it costs, even where other processes
    # preempt it (wall time on a busy machine counts their slices too)
    bridge_cpu_seconds: float = 0.0

    def add(self, other: "BridgeTimes") -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))


class BridgedDraftProposer:
    name = "bridge"
    costly = True

    def __init__(self, model: Model, target: Model, n_ctx: int, n_threads: int | None = None,
                 n_batch: int = 0, kernel: KernelConfig | None = None, max_ratio: float = 2.0,
                 check_pin: bool = True, pin_check: PinCheck | None = None) -> None:
        _refuse_shared_vocabulary(target, model)
        self.pair: object = None  # the pin record the check returned
        if check_pin:
            # the registry's check (edgespec.registry.bridge_pins.check_pair), through BuildContext
            if pin_check is None:
                raise InvalidInputError("the bridge runs only for a pair pinned in models.toml, "
                                        "and no pin check was given to check this one")
            self.pair = pin_check(target, model, BRIDGE_VERSION)
        if max_ratio < 1.0:
            raise InvalidInputError(f"bridge option max_ratio={max_ratio} must be >= 1 (draft "
                                    "tokens allowed per proposed target token)")
        k = kernel or KernelConfig()
        self.model, self.target = model, target
        self.max_ratio = max_ratio
        self.ctx = model.new_context(n_ctx=n_ctx, n_batch=n_batch or k.n_batch, n_threads=n_threads,
                                     flash_attn=int(k.flash_attn), type_k=k.kv_ggml_type,
                                     type_v=k.kv_ggml_type)
        self.seconds_per_token = 0.0  # per proposed target token, draft + bridge (controller)
        self.ratio = 1.2  # draft tokens per target token of the same text (running estimate)
        self.times = BridgeTimes()  # over the proposer's life
        self.last = BridgeTimes()  # the last closed session
        #: set per request by the engine: start from the longest prefix the KV cache holds
        self.reuse_prefix = False
        self._held: list[int] = []  # the draft tokens its KV cache holds between requests
        self.last_reused = 0
        self._busy = False

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "BridgedSession":
        if self._busy:
            raise RuntimeError("the bridged draft model serves one request at a time")
        self._busy = True
        try:
            return BridgedSession(self, prompt_tokens)
        except BaseException:
            self.ctx.clear()
            self._busy = False
            raise

    def _release(self, times: BridgeTimes) -> None:
        self.times.add(times)
        self.last = times
        self._busy = False

    def close(self) -> None:
        self.ctx.close()


class BridgedSession:
    def __init__(self, owner: BridgedDraftProposer, prompt_tokens: Sequence[int]) -> None:
        self.owner = owner
        self.times = BridgeTimes()
        t0, c0 = time.perf_counter(), time.thread_time()
        target = owner.target
        self.bridge = Bridge(owner.model, target, list(prompt_tokens),
                             target_bos=target.bos if getattr(target, "add_bos", False) else None)
        self.times.bridge_cpu_seconds += time.thread_time() - c0
        self.times.bridge_seconds += time.perf_counter() - t0
        ctx = owner.ctx
        toks = self.bridge.tokens
        # a prompt the draft's context cannot hold (its tokenizer may need more tokens than
        # the target's) leaves the request to the other proposers: nothing is drafted
        self.disabled = len(toks) + 8 >= ctx.n_ctx
        # a conversation's next turn starts with the draft tokens of the last one (the last
        # prompt token is fed with the first proposal, so it is never reused)
        n = min(common_prefix(owner._held, toks), max(len(toks) - 1, 0)) \
            if owner.reuse_prefix and not self.disabled else 0
        owner._held = []
        if n == 0:
            ctx.clear()
        else:
            ctx.trim(0, n)
        owner.last_reused = n
        self.kv_len = n
        if not self.disabled and len(toks) - 1 > n:
            ctx.decode(toks[n:-1], n, logits="none")  # prefill now: part of the TTFT
            self.kv_len = len(toks) - 1

    def propose(self, k: int) -> Draft:
        b, ctx, o = self.bridge, self.owner.ctx, self.owner
        steps = int(k * o.max_ratio) + 2
        if k <= 0 or self.disabled or not b.ready or not b.tokens or \
                len(b.tokens) + steps >= ctx.n_ctx:
            b.begin()
            return EMPTY_DRAFT
        if self.kv_len >= len(b.tokens):  # the last token's logits are needed: feed it again
            self.kv_len = len(b.tokens) - 1
            ctx.trim(0, self.kv_len)
        t0 = time.perf_counter()
        b.begin()
        n_prev = len(b.tokens)
        logits = ctx.decode(b.tokens[self.kv_len:], self.kv_len, logits="last")[0]
        self.kv_len = n_prev
        # Draft what the token ratio predicts before the bridge sees any of it: its work
        # right after a draft decode runs cache-cold (a target tokenize ~150 us instead of
        # ~15 us here), so it is done in one batch, then token by token only if short.
        need = min(steps, max(k, int(np.ceil((k + 1) * o.ratio))))
        step = self._draft_text(logits, k, steps, need, n_prev)
        # the drafted tokens fed so far (the last one is not)
        self.kv_len = n_prev + step.draft_tokens - 1
        tb, cb = time.perf_counter(), time.thread_time()
        tokens, conf = b.proposal(k)
        r = b.draft_per_target
        if r is not None:
            o.ratio = 0.8 * o.ratio + 0.2 * min(r, o.max_ratio)
        step.bridge_cpu_seconds += time.thread_time() - cb
        t_end = time.perf_counter()
        step.bridge_seconds += t_end - tb
        self._account(step, tokens, t_end - t0)
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens=tuple(tokens), probs=None, confidence=tuple(conf), source="bridge")

    def _draft_text(self, logits: FloatArray, k: int, steps: int, need: int,
                    n_prev: int) -> BridgeTimes:
        """The draft's argmax continuation, pushed to the bridge in batches until it has
        ``k`` target tokens (or the draft ends); the step's draft tokens and bridge time."""
        b, ctx, model = self.bridge, self.owner.ctx, self.owner.model
        step = BridgeTimes(draft_tokens=1)  # the last token fed with the prompt's rest
        drafted: list[tuple[int, float]] = []
        for i in range(steps):
            tok = int(np.argmax(logits))
            m = float(logits[tok])
            # its softmax mass: the confidence the controller weighs (float32 exp: a 262k
            # vocabulary costs ~1 ms a token in float64 here)
            drafted.append((tok, 1.0 / float(np.exp(logits - m).sum(dtype=np.float64))))
            if i + 1 >= need or model.is_eog(tok):
                tb, cb = time.perf_counter(), time.thread_time()
                done = any([b.push(t, c) for t, c in drafted]) or b.enough(k, need)
                drafted.clear()
                step.bridge_cpu_seconds += time.thread_time() - cb
                step.bridge_seconds += time.perf_counter() - tb
                if done:
                    break
            if i + 1 == steps:
                break
            logits = ctx.decode([tok], n_prev + i, logits="last")[0]
            step.draft_tokens += 1
        return step

    def _account(self, step: BridgeTimes, tokens: Sequence[int], seconds: float) -> None:
        """File one proposal's times in the session's account and the proposer's estimate
        of seconds per proposed target token (``seconds``: the whole proposal)."""
        t, o = self.times, self.owner
        t.steps += 1
        t.draft_tokens += step.draft_tokens
        t.target_tokens += len(tokens)
        t.ends += bool(tokens) and tokens[-1] == self.bridge.pending.end_token
        t.bridge_seconds += step.bridge_seconds
        t.bridge_cpu_seconds += step.bridge_cpu_seconds
        t.draft_seconds += seconds - step.bridge_seconds
        est = seconds / max(len(tokens), 1)
        o.seconds_per_token = est if o.seconds_per_token == 0 else \
            0.8 * o.seconds_per_token + 0.2 * est

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:  # noqa: ARG002
        tb, cb = time.perf_counter(), time.thread_time()
        unchanged = self.bridge.accept([int(t) for t in tokens])
        self.times.bridge_cpu_seconds += time.thread_time() - cb
        self.times.bridge_seconds += time.perf_counter() - tb
        if self.kv_len > unchanged:
            self.owner.ctx.trim(0, unchanged)
            self.kv_len = unchanged
        if not self.disabled and len(self.bridge.tokens) + 8 >= self.owner.ctx.n_ctx:
            self.disabled = True

    def close(self, completed: bool) -> None:  # noqa: ARG002
        # the KV keeps exactly bridge.tokens[:kv_len] for the next request to reuse
        try:
            n = min(self.kv_len, len(self.bridge.tokens))
            self.owner.ctx.trim(0, n)
            self.owner._held = list(self.bridge.tokens[:n])
        except Exception:
            self.owner._held = []
        self.owner._release(self.times)


def _refuse_shared_vocabulary(target: Model, draft: Model) -> None:
    """A draft sharing the target's vocabulary needs no bridge: the 'draft' proposer is exact
    and cheaper."""
    if vocab_mismatch(target, draft) is not None:
        return
    raise InvalidInputError(f"draft {draft.path.name} shares the vocabulary of {target.path.name}: "
                            "use --proposer draft (no bridge needed)")
