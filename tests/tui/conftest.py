"""Fixtures for the TUI tests (helpers live in tui_helpers.py)."""
from __future__ import annotations

import pytest

from tui_helpers import MIB


@pytest.fixture
def fixed_memory():
    """A constant RSS so panels and snapshots do not depend on this process."""
    return lambda: 256 * MIB
