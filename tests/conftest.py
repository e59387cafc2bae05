"""Fixtures shared by every test folder (helpers live in fp8rl_testing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fp8rl_testing import REPO


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO
