"""Helpers shared by test modules (import as ``from fp8rl_testing import ...``; pytest puts tests/
on sys.path). Kept out of conftest.py: several folders have their own conftest module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FP8RL_SHARED", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with the reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found: ../shared (datasets, CRDs) is not beside this checkout")
    return path
