"""Stress scenarios: sizes, figures, and what they need from the machine.

PYLOCK_STRESS=large runs the larger size of each heavy scenario; the default
is the size CI runs. Every scenario reports its figures through the
``figures`` fixture: they are printed in a "pylock stress figures" section at
the end of the run, and appended as JSON lines to $PYLOCK_STRESS_REPORT when
that is set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.sizes import SIZE_NAME, Figures

_collected: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    def record(**values: Any) -> None:
        entry = {"size": SIZE_NAME, **values}
        _collected.append((request.node.nodeid, entry))
        path = os.environ.get("PYLOCK_STRESS_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, **entry}, default=str) + "\n")

    yield record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _collected:
        return
    terminalreporter.section(f"pylock stress figures ({SIZE_NAME} size)")
    for nodeid, entry in _collected:
        name = nodeid.split("::", 1)[-1]
        terminalreporter.write_line(f"{name}:")
        for key, value in entry.items():
            if key != "size":
                terminalreporter.write_line(f"    {key}: {value}")
