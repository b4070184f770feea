"""The draft limit shared by the request loop and the replay (edgespec.control.limit)."""
from __future__ import annotations

import pytest

from edgespec.control.limit import draft_limit


@pytest.mark.parametrize("max_draft, remaining, room, expected", [
    (8, 100, 100, 8),   # the request's cap binds
    (8, 5, 100, 4),     # max_tokens binds: the target's own token takes the last slot
    (8, 1, 100, 0),     # one token left: the pass's own token, nothing to draft
    (8, 0, 100, 0),     # nothing left: never negative
    (8, -3, 100, 0),
    (8, 100, 3, 3),     # the context's room binds
    (8, 100, 0, 0),     # no room for a drafted token
    (8, 100, -1, 0),
    (0, 100, 100, 0),   # no drafting asked for
    (4, 5, 4, 4),       # all three equal after the -1
])
def test_draft_limit(max_draft, remaining, room, expected):
    assert draft_limit(max_draft, remaining, room) == expected
