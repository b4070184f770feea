"""Oracle proposers: what perfect drafting would gain on this device, measured for real.

A benchmark-only diagnostic, never a product proposer: it knows the answer. Before the
timed rounds the runner decodes every prompt once on the plain path, untimed, and keeps
the tokens (:class:`References`). In the run an oracle session drafts from that answer:

* ``oracle``: the answer's next tokens, whatever they are. No proposer can do better on
  this device's cost curve; a draft model, an MTP or EAGLE-3 head or lookahead reaches it
  only if it is always right and costs nothing.
* ``oracle-copy``: only the stretch of the answer that followed an earlier occurrence of
  the context's last token (prompt or output so far), the best occurrence known. Prompt
  lookup, llama.cpp's n-gram cache and suffix trees all draft what followed a matched tail,
  so none of them can do better, whatever its thresholds or controller.

Each draft is cut to the length with the most tokens per second on the engine's cost
curve (a plain step where no cut pays) and verified by the target like any other draft:
the passes, kernels and per-pass overheads are the real ones, which is what makes this a
measurement and not a replay.

A batched pass can decide a near-tie otherwise than the plain path's single-token steps
(docs/parity.md), so an oracle drafting the plain answer would go off it. The reference is
therefore each oracle's own fixed point (:func:`settle`): run it untimed on the plain
answer; where its output leaves the answer, its output becomes the answer, and again. A
pass's rows do not depend on the tokens after them, so every run agrees with the last one
at least up to where they parted, and the point where they part only moves forward; two
or three runs settle most requests. Should one not settle, the timed request drafts
nothing from where its output leaves the reference (the parity column shows it).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..replay.generations import best_cut
from ...api.params import SamplingParams
from ...calibration.curve import Calibration
from ...proposers.base import EMPTY_DRAFT, Draft

ORACLE = "oracle"
ORACLE_COPY = "oracle-copy"
KINDS = (ORACLE, ORACLE_COPY)
#: the longest draft an oracle offers (the cost curve's calibrated range)
MAX_DRAFT = 16


#: untimed oracle runs per request before its reference is left as it is
SETTLE_RUNS = 6


def settle(references: "References", prompt: Sequence[int], plain: Sequence[int],
           run: Callable[[], Sequence[int]], runs: int = SETTLE_RUNS) -> tuple[tuple[int, ...], int]:
    """Make ``references`` hold, for ``prompt``, an answer that ``run()`` (the oracle's own
    request, untimed) reproduces: start from the plain path's answer and replace it by the
    oracle's output until the two agree. Returns the reference and the runs it took."""
    ref = tuple(plain)
    references.add(prompt, ref)
    for n in range(1, runs + 1):
        out = tuple(run())
        if out == ref:
            return ref, n
        ref = out
        references.add(prompt, ref)
    return ref, runs


class References:
    """One oracle's answer to each prompt (the plain path's, then settled), keyed by the
    prompt's token ids."""

    def __init__(self) -> None:
        self._answers: dict[tuple[int, ...], tuple[int, ...]] = {}

    def add(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        self._answers[tuple(prompt)] = tuple(answer)

    def get(self, prompt: Sequence[int]) -> tuple[int, ...] | None:
        return self._answers.get(tuple(prompt))

    def __len__(self) -> int:
        return len(self._answers)


class OracleProposer:
    """``kind`` is :data:`ORACLE` or :data:`ORACLE_COPY`; ``calibration`` (the engine's) prices
    the passes each draft is cut for (:func:`edgespec.lab.replay.generations.best_cut`, the cut
    the replay's foresight bounds make)."""

    costly = False

    def __init__(self, kind: str, references: References, calibration: Calibration,
                 max_draft: int = MAX_DRAFT) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown oracle {kind!r}; choose {', '.join(KINDS)}")
        self.name = kind
        self.references = references
        self.calibration = calibration
        self.max_draft = max_draft
        self.misses = 0  # requests whose prompt had no reference (they draft nothing)

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "OracleSession":
        answer = self.references.get(prompt_tokens)
        if answer is None:
            self.misses += 1
        return OracleSession(list(prompt_tokens), answer, self)

    def close(self) -> None:
        pass


class OracleSession:
    def __init__(self, prompt: list[int], answer: tuple[int, ...] | None,
                 owner: OracleProposer) -> None:
        self.owner = owner
        self.start = len(prompt)
        self.seq = prompt + list(answer or ())
        self.end = len(self.seq)
        self.pos = self.start  # where the next token goes
        self.on_track = answer is not None
        # oracle-copy: token -> the positions right after its earlier occurrences
        self._follows: dict[int, list[int]] = {}
        self._indexed = 1

    def _copyable(self, cur: int, limit: int) -> int:
        """The longest stretch of the answer from ``cur`` that followed an earlier occurrence
        of token ``seq[cur - 1]``, copied only from what precedes ``cur``."""
        seq = self.seq
        while self._indexed < cur:
            self._follows.setdefault(seq[self._indexed - 1], []).append(self._indexed)
            self._indexed += 1
        best = 0
        for j in self._follows.get(seq[cur - 1], ()) if cur >= 1 else ():
            n = 0
            while n < limit and j + n < cur and seq[j + n] == seq[cur + n]:
                n += 1
            best = max(best, n)
        return best

    def propose(self, k: int) -> Draft:
        cur = self.pos
        available = min(k, self.owner.max_draft, self.end - cur)
        if not self.on_track or available < 1:
            return EMPTY_DRAFT
        if self.owner.name == ORACLE_COPY:
            available = self._copyable(cur, available)
        d = best_cut(self.owner.calibration, available)
        if d == 0:
            return EMPTY_DRAFT
        return Draft(tokens=tuple(self.seq[cur:cur + d]), confidence=(1.0,) * d,
                     source=self.owner.name, match_length=d)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        if self.on_track and list(tokens) != self.seq[self.pos:self.pos + len(tokens)]:
            self.on_track = False  # the output left the reference: draft nothing more
        self.pos += len(tokens)

    def close(self, completed: bool) -> None:
        pass
