"""The lock strategy: the holder of a pylock lock is watched through a
shared-lock wait on that lock file, which wakes as soon as the holder's lock
goes, at its death at the latest.

A holder pylock cannot identify (no record, another machine) is waited for
through the lock alone: the watch ends when the lock is free.  An identified
holder, where pidfds are missing, is also on the shared identity schedule:
its lock may be released while it lives on, or kept by a forked child after
it died.  When the lock goes, a short burst of checks (1 ms doubling to
BURST_CAP) sees the holder's death in milliseconds: the kernel drops the
lock while the process is still exiting.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from typing import Any, Callable

from .._core.native import ffi, lib
from .._core.process import ProcessIdentity
from .._core.timeout import seconds_left
from .._core.wait import LoopWait, once, wait_blocking
from .plan import Plan
from .poll import PollWatch, expected_identity
from .schedule import schedule
from .watch import open_lock, still_there

BURST_FIRST = 0.001
BURST_CAP = 0.064
# A blocking wait on the lock wakes this often to look at the schedule's verdict.
STEP = 1.0


class LockWatch(PollWatch):
    def __init__(self, loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> None:
        super().__init__(loop, plan, target)
        self._close_handle: Callable[[], None] | None = None
        self._thread_wait: LoopWait | None = None
        self._burst: asyncio.TimerHandle | None = None

    def _start(self) -> bool:
        if self.pid:
            super()._start()  # the identity schedule
            if self.future.done():
                return True
        assert self.plan.lock_path is not None
        handle = open_lock(self.plan.lock_path)
        if handle is None:
            if not self.pid:
                self.finish(None)  # the lock file is gone: nobody holds it
            return True
        self._close_handle = close_handle = once(lambda: lib.pl_close(handle))

        def wait(waiter: Any, timeout_ns: int) -> int:
            rc = int(lib.pl_lock_wait(handle, 1, timeout_ns, waiter))
            if rc == 0:
                lib.pl_unlock(handle)  # only the release mattered, never keep it
            return rc

        self._thread_wait = wait_in_thread = LoopWait(
            self.loop,
            wait,
            None,
            lambda rc: close_handle(),  # abandoned: the thread was the last user
            f"pylock wait {self.plan.lock_path}",
        )
        wait_in_thread.future.add_done_callback(
            lambda done: (
                self._on_lock_free(done.result()) if self._thread_wait is wait_in_thread else None
            )
        )
        return True

    def _on_lock_free(self, rc: int) -> None:
        self._end_lock_wait()
        if self.future.done():
            return
        if not self.pid:
            if rc:
                self.fail(OSError(rc, f"waiting on {self.plan.lock_path}: {os.strerror(rc)}"))
            else:
                self.finish(None)
            return
        self._check_soon(BURST_FIRST)  # released: by death, or by a holder that lives on

    def _check_soon(self, delay: float) -> None:
        def check() -> None:
            self._burst = None
            if self.future.done() or self.expected is None:
                return
            if not still_there(self.pid, self.expected):
                self.finish(None)
            elif delay < BURST_CAP:
                self._check_soon(delay * 2)  # then the schedule alone

        self._burst = self.loop.call_later(delay, check)

    def _end_lock_wait(self) -> None:
        wait, self._thread_wait = self._thread_wait, None
        close_handle, self._close_handle = self._close_handle, None
        if wait is not None and wait.abandon():
            return  # the wait's thread still uses the handle, and closes it
        if close_handle is not None:
            close_handle()

    def close(self) -> None:
        self._end_lock_wait()
        if self._burst is not None:
            burst, self._burst = self._burst, None
            burst.cancel()
        super().close()

    @staticmethod
    def wait(plan: Plan, deadline: float | None) -> bool | None:
        assert plan.lock_path is not None
        if not plan.pid:
            return _wait_free(plan.lock_path, deadline)
        expected = expected_identity(plan)
        if expected is None:
            return True
        gone = threading.Event()
        token = schedule().add(plan.pid, expected.start_time, gone.set)
        try:
            return _wait_held(plan, expected, deadline, gone)
        finally:
            schedule().remove(token)


def _wait_held(
    plan: Plan, expected: ProcessIdentity, deadline: float | None, gone: threading.Event
) -> bool:
    assert plan.lock_path is not None
    handle = open_lock(plan.lock_path)
    waiter = lib.pl_waiter_new() if handle is not None else ffi.NULL
    if handle is not None and waiter == ffi.NULL:
        lib.pl_close(handle)
        raise MemoryError
    try:
        while handle is not None:
            if gone.is_set():
                return True
            left = seconds_left(deadline)
            if left == 0:
                return False
            step = STEP if left is None else min(STEP, left)
            rc = lib.pl_lock_wait(handle, 1, int(step * 1e9), waiter)
            if rc == 0:
                # Released: by death, or by a holder that lives on; from
                # here on only the identity can tell.
                lib.pl_unlock(handle)
                lib.pl_close(handle)
                handle = None
                delay = BURST_FIRST
                while delay <= BURST_CAP and not gone.is_set():
                    if not still_there(plan.pid, expected):
                        return True
                    left = seconds_left(deadline)
                    if left == 0:
                        return False
                    time.sleep(delay if left is None else min(delay, left))
                    delay *= 2
            elif rc not in (errno.ETIMEDOUT, errno.EINTR):
                raise OSError(rc, f"waiting on {plan.lock_path}: {os.strerror(rc)}")
        return gone.wait(seconds_left(deadline))
    finally:
        if handle is not None:
            lib.pl_close(handle)
        if waiter != ffi.NULL:
            lib.pl_waiter_free(waiter)


def _wait_free(path: str, deadline: float | None) -> bool:
    """Wait for the lock at path to be free (its holder is unidentified)."""
    handle = open_lock(path)
    if handle is None:
        return True

    def wait(waiter: Any, timeout_ns: int) -> int:
        return int(lib.pl_lock_wait(handle, 1, timeout_ns, waiter))

    try:
        rc = wait_blocking(wait, deadline)
        if rc == 0:
            lib.pl_unlock(handle)
            return True
        if rc == errno.ETIMEDOUT:
            return False
        raise OSError(rc, f"waiting on {path}: {os.strerror(rc)}")
    finally:
        lib.pl_close(handle)
