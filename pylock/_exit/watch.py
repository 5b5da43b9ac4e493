"""What every exit-watch strategy shares: the async watch's life cycle (a C
wait that needs a thread goes through _wait.LoopWait, as lock waits do)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Callable
from typing import Any

from .._core.native import lib, open_lock_file
from .._core.process import ProcessIdentity, identity_of, same_process
from .plan import Plan


class Watch:
    """One process watched from an event loop; self.future gets its returncode.

    Each strategy is a subclass.  Its _start() returns False when it does not
    apply here (no pidfd, not our child...): the caller then tries the next
    strategy.  Its blocking form is a static wait(plan, deadline) returning
    True (exited), False (deadline passed) or None (does not apply).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> None:
        self.loop = loop
        self.plan = plan
        self.pid = plan.pid
        self.target = target
        self.future: asyncio.Future[int | None] = loop.create_future()

    def start(self) -> bool:
        try:
            return self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> bool:
        self.finish(None)  # the plan already knows: exited
        return True

    @staticmethod
    def wait(plan: Plan, deadline: float | None) -> bool | None:
        """The blocking form: True once exited, False at the deadline, None
        when this strategy does not apply here."""
        return True  # the plan already knows: exited

    def finish(self, returncode: int | None) -> None:
        if not self.future.done():
            self.future.set_result(returncode)
        self.close()

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
        self.close()

    def expire(self, timeout: float) -> None:
        if not self.future.done():
            self.future.set_exception(
                TimeoutError(f"{self.plan.describe()} did not exit within {timeout:g} s")
            )
        self.close()

    def close(self) -> None:
        """Let go of everything the strategy holds (idempotent)."""

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(callback)


def still_there(pid: int, expected: ProcessIdentity) -> bool:
    now = identity_of(pid)
    return now is not None and same_process(now, expected)


def open_lock(path: str) -> int | None:
    """A read-only handle on a lock file to wait on, or None when it is gone."""
    try:
        return open_lock_file(path, lib.PL_OPEN_READONLY)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return None
        raise
