"""What every exit-watch strategy shares: the async watch's life cycle, and a
blocking C wait handed to an event loop through a thread."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable
from typing import Any

from ._exit_plan import Plan
from ._native import ffi, lib
from ._process import ProcessIdentity, identity_of, same_process
from ._syscall import open_lock_file


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


class ThreadWait:
    """One blocking, cancellable C wait in a daemon thread.

    Used where the kernel offers no descriptor a loop could watch: a lock
    wait, a process handle on Windows.
    """

    __slots__ = ("_ended", "_mu", "_orphaned", "_thread", "_waiter")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wait: Callable[[Any], int],
        done: Callable[[int], None],
        name: str,
    ) -> None:
        waiter = lib.pl_waiter_new()
        if waiter == ffi.NULL:
            raise MemoryError
        self._waiter: Any = waiter
        self._mu = threading.Lock()
        self._ended = self._orphaned = False

        def run() -> None:
            rc = errno.EINTR
            while rc == errno.EINTR:
                rc = wait(waiter)
            with self._mu:
                self._ended = True
                orphaned = self._orphaned
            if orphaned:  # cancelled, but it could not be interrupted
                lib.pl_waiter_free(waiter)
            elif rc != errno.ECANCELED:
                with contextlib.suppress(RuntimeError):  # the loop closed
                    loop.call_soon_threadsafe(done, rc)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """End the wait, blocking the loop no longer than the wake signal
        takes to end it (about a millisecond), never until its event."""
        with self._mu:
            waiter, self._waiter = self._waiter, None
            if waiter is None:
                return
            if not self._ended and lib.pl_waiter_cancel(waiter) != 0:
                # The program took pylock's wake signal: the wait ends with
                # its event, and its thread frees the waiter then.
                self._orphaned = True
                return
        self._thread.join()
        lib.pl_waiter_free(waiter)


def open_lock(path: str) -> int | None:
    """A read-only handle on a lock file to wait on, or None when it is gone."""
    try:
        return open_lock_file(path, lib.PL_OPEN_READONLY)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return None
        raise
