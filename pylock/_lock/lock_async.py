"""Taking a lock file from a coroutine: Lock.acquire_async and its hand-overs.

A free lock is taken in the loop's thread, as acquire() takes it.  While it
is held elsewhere, a pylock thread waits in the kernel, claims the lock as
soon as it is granted and hands over to the loop.  asyncio is loaded by
that path only: `import pylock` and blocking acquisitions never load it.
"""

from __future__ import annotations

import errno

from .._core.native import fail, ffi, lib
from .._core.timeout import deadline_of
from .._core.wait import LoopWait, passed
from . import lockfile as _files
from .errors import ReentrantAcquire
from .lockfile import LockFile
from .ownership import acquires_for_awaiting_task, task_owner

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    from typing import Any

_acquire = lib.pl_acquire
_disown = lib.pl_disown


class AsyncAcquire(LockFile):
    """A lock file taken from coroutines (Lock's acquire_async)."""

    @acquires_for_awaiting_task
    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take the lock from a coroutine without blocking the event loop.

        While the lock is held elsewhere, a pylock thread waits in the kernel
        and hands over to the loop when the holder releases or dies.
        Cancelling the task (or the timeout) never blocks the loop and leaves
        nothing behind, never the lock.
        """
        owner = task_owner()
        if self._owner is owner:
            raise ReentrantAcquire(
                f"{self.path}: this task already holds this Lock; pylock locks are not reentrant"
            )
        deadline = deadline_of(timeout)
        # Owned and given back as in Lock.acquire: a token named before the
        # try, C calls that take it.
        attempt = object()
        token = id(attempt)
        lf = self._lf
        waits: list[LoopWait] = []  # this attempt's kernel wait, which may outlive it
        try:
            rc = _acquire(lf, token)
            if rc:
                await self._acquire_contended(rc, attempt, deadline, timeout, owner, waits)
            self._attempt = attempt
            self._owner = owner
        except BaseException:
            wait = waits[-1] if waits else None
            try:
                if wait is not None:
                    wait.abandon()  # unless its thread has finished, on_orphan gives back
            finally:
                # A subscript, not a call: nothing can land between it and the
                # decision.  "task": the wait's thread settles (see _orphaned).
                if wait is None or wait.decided["by"] != "task":
                    ring = 1
                    try:
                        ring = _disown(lf, token, 1)
                    finally:
                        if ring > 0:  # self._ring(), inlined
                            try:
                                self._bell.release()
                            except RuntimeError:
                                pass
                            finally:
                                if self._object_waiters:
                                    self._wake_object_waiter()
            raise
        if _files.event_log is not None:
            _files.event_log.acquired(self)
        return True

    async def _acquire_contended(
        self,
        rc: int,
        attempt: object,
        deadline: float | None,
        timeout: float | None,
        owner: object,
        waits: list[LoopWait],
    ) -> None:
        """Another attempt of this process owns the object, it is not open,
        the lock is held, the file moved, or the record failed (rc < 0)."""
        token = id(attempt)
        while rc == lib.PL_E_BUSY:
            await self._take_object_async(token, deadline, timeout)
            rc = _acquire(self._lf, token)
        if rc == errno.EBADF:  # owned, not yet open
            self._open()
            rc = _acquire(self._lf, token)
        contended = rc == errno.EWOULDBLOCK
        if _files.observer is not None and contended:
            _files.observer.conflicted(self)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if passed(deadline):
                    self._raise_held(True, timeout)
                self._refuse_self_deadlock(owner)
                rc = await self._wait_async(attempt, deadline, timeout, waits)
            else:
                rc = self._retry_after(rc, token)
        if _files.observer is not None and contended:
            _files.observer.waited(self)
        if rc:
            self._warn_no_record(-rc)

    async def _wait_async(
        self,
        attempt: object,
        deadline: float | None,
        timeout: float | None,
        waits: list[LoopWait],
    ) -> int:
        """Wait in a pylock thread, which claims the lock (path check, record)
        as soon as the kernel grants it, before handing over; returns the
        claim's code.  If the task gives up while the wait is still running,
        the wait's thread gives back any grant and the object when it ends
        (_orphaned); acquire_async's except clause decides.  The thread keeps
        the attempt alive until then: its id names the owner, and a newer
        attempt at the same address would be taken for it."""
        import asyncio
        import contextlib

        lf, claimed = self._lf, ffi.new("int *")

        def wait_and_claim(waiter: Any, timeout_ns: int) -> int:
            return int(lib.pl_lock_wait_claim(lf, timeout_ns, waiter, claimed))

        wait = LoopWait(
            asyncio.get_running_loop(),
            wait_and_claim,
            deadline,
            lambda rc: _orphaned(self, attempt, rc),
            f"pylock wait {self.path}",
            waits,
        )
        try:
            rc = await wait.future
        except BaseException as exc:
            # Giving up: interrupt the wait and await its end, so that the task
            # raises holding nothing and no thread is left behind.  The await is
            # short (the wake signal ends the wait) and never blocks the loop;
            # where the wait cannot be interrupted, acquire_async abandons it.
            if not isinstance(exc, GeneratorExit) and wait.interrupt():
                with contextlib.suppress(BaseException):
                    await wait.ended()
            raise
        # Not joined: the thread ends a few lines after handing over, and
        # waiting for it here made every contended acquisition wait for the
        # thread's last lines (bench/README.md).
        if rc == errno.ETIMEDOUT:
            self._raise_held(True, timeout)
        if rc == errno.ENOTSUP:
            from .._core.wait import no_wake_signal

            raise no_wake_signal(f"{self.path}: acquire_async()")
        if rc:
            fail(rc, self.path)
        return int(claimed[0])


def _orphaned(lock: AsyncAcquire, attempt: object, rc: int) -> None:
    """A wait whose task gave up has ended (in its thread): give back the
    grant (rc 0) and the object, which the task left to this thread."""
    if _disown(lock._lf, id(attempt), 1) > 0:
        lock._ring()
    if lock._close_pending:  # close() was called while this wait ran
        lock._close_if_unused()
