"""How many tokens a step may draft: the one rule the request loop and the offline replay share.

A verify pass of ``d`` drafted tokens emits up to ``d + 1``: the accepted drafts, then the
target's own token (the bonus after a full accept, the correction otherwise). So a draft
may use every slot that is left but one, since the target's token fills the last.
"""
from __future__ import annotations


def draft_limit(max_draft: int, remaining: int, room: int) -> int:
    """The most tokens a step may draft, never negative.

    ``max_draft``: the request's own cap (0: no drafting). ``remaining``: tokens still
    allowed by max_tokens; ``remaining - 1`` because the pass's own token takes the last
    of them. ``room``: context positions left after the pending token, each drafted token
    needing one. A step with a limit of 0 is a plain step.
    """
    return max(0, min(max_draft, remaining - 1, room))
