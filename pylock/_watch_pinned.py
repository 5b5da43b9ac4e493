"""The pinned strategy: a pidfd (Linux 5.3+), a kqueue (macOS) or a process
handle (Windows) pins the process, and the kernel says when it exits."""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

from ._exit_plan import Plan
from ._native import ffi, lib
from ._process import Pinned, PinUnavailable, pin, pinning_available
from ._timeout import ns_left
from ._watch import ThreadWait, Watch


def _pin(plan: Plan) -> tuple[bool, Pinned | None]:
    """(applies, pinned): pinned None when the process is already gone."""
    if not pinning_available():
        return False, None
    try:
        return True, pin(plan.pid, plan.expected)
    except PinUnavailable:
        return False, None


class PinnedWatch(Watch):
    def __init__(self, loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> None:
        super().__init__(loop, plan, target)
        self._pinned: Pinned | None = None
        self._fd: int | None = None
        self._thread_wait: ThreadWait | None = None

    def _start(self) -> bool:
        applies, pinned = _pin(self.plan)
        if not applies:
            return False
        if pinned is None:
            self.finish(None)  # gone, or the pid now names someone else
            return True
        self._pinned = pinned
        if pinned.exited():
            self.finish(pinned.returncode())
            return True
        fd = pinned.event_fd()
        if fd is None:  # Windows: a thread waits on the handle
            handle = pinned.handle
            self._thread_wait = ThreadWait(
                self.loop,
                lambda w: int(lib.pl_proc_wait(handle, -1, w)),
                self._on_thread_exit,
                f"pylock wait pid {self.pid}",
            )
            return True
        self.loop.add_reader(fd, self._on_readable)
        self._fd = fd
        return True

    def _on_readable(self) -> None:
        pinned = self._pinned
        if pinned is not None and not self.future.done() and pinned.exited():
            self.finish(pinned.returncode())

    def _on_thread_exit(self, rc: int) -> None:
        self._end_thread_wait()
        pinned = self._pinned
        if pinned is None or self.future.done():
            return
        if rc:
            self.fail(OSError(rc, f"waiting for pid {self.pid} failed: {os.strerror(rc)}"))
        else:
            self.finish(pinned.returncode())

    def _end_thread_wait(self) -> None:
        if self._thread_wait is not None:
            wait, self._thread_wait = self._thread_wait, None
            wait.cancel()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if not self.loop.is_closed():
                self.loop.remove_reader(fd)
        self._end_thread_wait()
        if self._pinned is not None:
            pinned, self._pinned = self._pinned, None
            pinned.close()

    @staticmethod
    def wait(plan: Plan, deadline: float | None) -> bool | None:
        applies, pinned = _pin(plan)
        if not applies:
            return None
        if pinned is None:
            return True
        try:
            while True:
                rc = lib.pl_proc_wait(pinned.handle, ns_left(deadline), ffi.NULL)
                if rc == 0:
                    return True
                if rc == errno.ETIMEDOUT:
                    return False
                if rc != errno.EINTR:
                    raise OSError(rc, f"waiting for pid {pinned.pid} failed: {os.strerror(rc)}")
                # EINTR: returning to Python ran the signal handlers; wait for the rest.
        finally:
            pinned.close()
