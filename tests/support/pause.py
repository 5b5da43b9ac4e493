"""Races played deterministically: the victim is paused at the exact step.

`sys.setprofile` reports every call this thread makes into C (an `os`
syscall wrapper, a socket method, a function of pylock's C core) just before
it runs and just after it returns.  `paused_at` recognises the step the race
is about (the call between a check and its use) and runs the other party's
move right there, in this thread, before the victim goes on: another user's
swap then always lands in the window that, unpaused, it would hit about once
in a thousand tries.  The mover reports what it did (a control line), so a
test tells "the swap happened and did no harm" from "no swap happened".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (event, name of the C function) -> pause here?
When = Callable[[str, str], bool]


def call_of(*names: str) -> When:
    """Just before a C call of one of these names (os.unlink is "unlink",
    socket.bind "bind", pylock's C core's functions their C names)."""
    _reported(names)
    return lambda event, name: event == "c_call" and name in names


def return_of(*names: str) -> When:
    """Just after a C call of one of these names returns."""
    _reported(names)
    return lambda event, name: event == "c_return" and name in names


def _reported(names: tuple[str, ...]) -> None:
    # PyPy's profiler reports calls of its builtins (os, socket) but none
    # into cffi functions: a step in pylock's C core cannot be paused at.
    if sys.implementation.name == "pypy" and any(name.startswith("pl_") for name in names):
        import pytest

        pytest.skip("PyPy reports no calls into pylock's C core (cffi) to sys.setprofile")


@contextmanager
def paused_at(when: When, move: Callable[[], None]) -> Iterator[list[str]]:
    """Within the block, the first C call or return of this thread that
    `when` picks runs move() first (once).  Yields the list of the
    "event name" steps it paused at: empty if the step never came."""
    paused: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        # The hook's own calls are not reported to it (CPython disables
        # profiling while the hook runs), so move() may call anything.
        if paused or event not in ("c_call", "c_return"):
            return
        name = getattr(arg, "__name__", "")
        if when(event, name):
            paused.append(f"{event} {name}")
            move()

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield paused
    finally:
        sys.setprofile(previous)
