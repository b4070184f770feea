"""A believable scripted request, for `edgespec tui --demo`, the snapshots and the screenshot.

The answer text is fixed; how it is split into steps (draft length, how much of
each draft the target accepted, step times) comes from a seeded generator shaped
like prompt lookup on a code answer: long accepted runs where the answer repeats
the prompt or itself, plain steps where nothing matches. Times follow the
per-step costs measured for Qwen2.5 1.5B on a 2-core CPU (docs models.md).
"""
from __future__ import annotations

import random
import re

from ..api.events import Control, Event, Finished, PrefillDone, RequestStarted, Step
from ..proposers import needs_model

from .metrics import fold_stats
from .source import AUTO_PROPOSER, NO_PROPOSER, Prompt, Settings, default_proposer

#: what "auto" (the engine's default) stands for here, where no planner runs: prompt
#: lookup, the proposer this script imitates
DEMO_PLAN = "ngram"
DEMO_PROMPT = "Write a Python function is_palindrome(s) that ignores case and punctuation."

DEMO_ANSWER = '''Here is a function that ignores case and punctuation:

```python
def is_palindrome(s: str) -> bool:
    """Return True if s reads the same forwards and backwards."""
    cleaned = [c.lower() for c in s if c.isalnum()]
    return cleaned == cleaned[::-1]
```

It keeps only letters and digits, lowercases them, and compares the
cleaned list with its reverse. For example, `is_palindrome("A man, a plan,
a canal: Panama")` returns `True`, and `is_palindrome("hello")` returns
`False`.
'''

_PIECE = re.compile(r" ?[A-Za-z_]+| ?\d+|\n+| +|[^\sA-Za-z_\d]")
STEP_SECONDS = 0.086  # one single-token target step
DRAFT_SECONDS = 0.0004  # an n-gram lookup
PREFILL_SECONDS_PER_TOKEN = 0.012


def pieces(text: str) -> list[str]:
    """Split text roughly the way a BPE tokenizer would (words keep their leading space)."""
    return _PIECE.findall(text)


def demo_events(prompt: Prompt = DEMO_PROMPT, settings: Settings | None = None, *,
                answer: str = DEMO_ANSWER, seed: int = 7, request_id: int = 1) -> list[Event]:
    rng = random.Random(seed)
    proposer = settings.proposer if settings else default_proposer()
    if proposer == AUTO_PROPOSER:
        proposer = DEMO_PLAN  # as the engine does: the request runs the plan's proposer
    target = settings.target if settings else "qwen-1.5b"
    max_tokens = settings.max_tokens if settings else 256
    toks = pieces(answer)[:max_tokens]
    prompt_text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
    n_prompt = len(pieces(prompt_text)) + 12  # + chat template tokens
    events: list[Event] = [
        RequestStarted(request_id, n_prompt, proposer, target,
                       settings.draft if settings and needs_model(proposer) else None),
        PrefillDone(request_id, n_prompt, n_prompt * PREFILL_SECONDS_PER_TOKEN),
    ]
    t = n_prompt * PREFILL_SECONDS_PER_TOKEN + 0.002
    # as in the engine, the first token comes out of the prefill pass: no draft, no pass of its own
    events.append(Step(request_id, (1000,), toks[0], ("target",), None, 0, 0, 0.0, 0.0, t,
                       pieces=(toks[0],)))
    k, i, next_id = 3, 1, 1001
    speculating = proposer != NO_PROPOSER
    while i < len(toks):
        # Code and echoed identifiers are easy to look up; prose is not.
        easy = any(ch in toks[i] for ch in "_(=[:`") or toks[i].strip() in ("cleaned", "is")
        drafted = k if speculating and (easy or rng.random() < 0.45) else 0
        if drafted:
            p_accept = 0.85 if easy else 0.45
            accepted = 0
            while accepted < drafted and rng.random() < p_accept:
                accepted += 1
        else:
            accepted = 0
        n = min(accepted + 1, len(toks) - i)
        origins = tuple("draft" if j < accepted else "target" for j in range(n))
        step_pieces = tuple(toks[i:i + n])
        draft_s = DRAFT_SECONDS * drafted
        verify_s = STEP_SECONDS * (1 + 0.25 * drafted) * rng.uniform(0.93, 1.08)
        t += draft_s + verify_s + 0.002
        events.append(Step(request_id, tuple(range(next_id, next_id + n)), "".join(step_pieces),
                           origins, proposer if drafted else None, drafted, accepted,
                           draft_s, verify_s, t, pieces=step_pieces))
        next_id += n
        i += n
        if drafted and accepted == drafted and k < 6:
            k += 1
            events.append(Control(request_id, "draft_length", "all accepted: longer drafts",
                                  k=k, proposer=proposer))
        elif drafted and accepted == 0 and k > 2:
            k -= 1
            events.append(Control(request_id, "draft_length", "none accepted: shorter drafts",
                                  k=k, proposer=proposer))
    stats = fold_stats(events)
    stop = "length" if len(toks) < len(pieces(answer)) else "eos"
    stats.finish(stop, t)
    steps = [e for e in events if isinstance(e, Step)]
    events.append(Finished(request_id, "".join(s.text for s in steps),
                           tuple(x for s in steps for x in s.tokens), stop, stats))
    return events
