"""The pinned strategy: a pidfd (Linux 5.3+), a kqueue (macOS) or a process
handle (Windows) pins the process, and the kernel says when it exits."""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any, Callable

from .._core.native import ffi, lib
from .._core.process import Pinned, PinUnavailable, pin, pinning_available
from .._core.timeout import ns_left
from .._core.wait import LoopWait, once
from .plan import Plan
from .watch import Watch


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
        self._thread_wait: LoopWait | None = None
        self._unpin: Callable[[], None] | None = None

    def _start(self) -> bool:
        applies, pinned = _pin(self.plan)
        if not applies:
            return False
        if pinned is None:
            self.finish(None)  # gone, or the pid now names someone else
            return True
        self._unpin = once(pinned.close)
        self._pinned = pinned
        if pinned.exited():
            self.finish(pinned.returncode())
            return True
        fd = pinned.event_fd()
        if fd is None:  # Windows: a thread waits on the handle
            handle, unpin = pinned.handle, self._unpin
            self._thread_wait = wait = LoopWait(
                self.loop,
                lambda w, timeout_ns: int(lib.pl_proc_wait(handle, timeout_ns, w)),
                None,
                lambda rc: unpin(),  # abandoned: the thread was the handle's last user
                f"pylock wait pid {self.pid}",
            )
            wait.future.add_done_callback(
                lambda done: (
                    self._on_thread_exit(done.result()) if self._thread_wait is wait else None
                )
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

    def _end_thread_wait(self) -> bool:
        """False while an abandoned wait's thread still uses the process
        handle (it lets go of the handle itself)."""
        wait, self._thread_wait = self._thread_wait, None
        return wait is None or not wait.abandon()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if not self.loop.is_closed():
                self.loop.remove_reader(fd)
        handle_free = self._end_thread_wait()
        unpin, self._unpin = self._unpin, None
        self._pinned = None
        if handle_free and unpin is not None:
            unpin()

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
