"""Scenario sizes: the size CI runs by default, a larger one with PYLOCK_STRESS=large."""

from __future__ import annotations

import os
from typing import Callable

LARGE = os.environ.get("PYLOCK_STRESS", "").lower() == "large"
SIZE_NAME = "large" if LARGE else "ci"

# The stress suite's `figures` fixture: figures(name=value, ...) records one
# scenario's numbers for the end-of-run summary.
Figures = Callable[..., None]


def size(ci: int, large: int) -> int:
    """The scenario's size for this run."""
    return large if LARGE else ci
