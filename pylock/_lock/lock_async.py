"""Taking a lock file from a coroutine: Lock.acquire_async and its hand-overs.

A free lock is taken in the loop's thread, as acquire() takes it.  While a
pylock holder in another process holds it, the task waits on the loop's
release hints (pylock._core.hints) and tries again after each.  Any other
holder, and a pylock thread waits in the kernel, claims the lock as soon as
it is granted and hands over to the loop.  asyncio is loaded by that path
only: `import pylock` and blocking acquisitions never load it.
"""

from __future__ import annotations

import errno
import time

from .._core.native import fail, ffi, lib
from .._core.timeout import deadline_of
from .._core.wait import LoopWait, passed
from . import lockfile as _files
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
            raise self._reentered("task")
        deadline = deadline_of(timeout)
        attempt = object()  # named before the try, as in Lock.acquire
        token = id(attempt)
        waits: list[LoopWait] = []  # this attempt's kernel wait, which may outlive it
        try:
            rc = _acquire(self._lf, token)
            if rc == lib.PL_E_BUSY or rc == errno.EBADF:
                rc = await self._own_and_open(rc, token, deadline, timeout)
            if rc:  # held (the wait returns into this frame: no other frame runs cold)
                contended = rc == errno.EWOULDBLOCK
                if contended and _files.observer is not None:
                    _files.observer.conflicted(self)
                while rc > 0:  # < 0: held, but the record could not be written
                    if rc == errno.EWOULDBLOCK:
                        rc = await self._wait_hinted(attempt, owner, deadline, timeout, waits)
                    else:
                        rc = self._retry_after(rc, token)
                if contended and _files.observer is not None:
                    _files.observer.waited(self)
                if rc:
                    self._warn_no_record(-rc)
            self._attempt = attempt
            self._owner = owner
        except BaseException:
            wait = waits[-1] if waits else None
            try:
                if wait is not None:
                    wait.abandon()  # unless its thread has finished, on_orphan gives back
            finally:
                # A subscript (no call to land in) decides; "task": see _orphaned.
                if wait is None or wait.decided["by"] != "task":
                    ring = 1
                    try:
                        ring = _disown(self._lf, token, 1)
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

    async def _own_and_open(
        self, rc: int, token: int, deadline: float | None, timeout: float | None
    ) -> int:
        """Another attempt of this process owns the object (PL_E_BUSY), or it
        is not open yet (EBADF): wait for it, open it, and try again."""
        while rc == lib.PL_E_BUSY:
            await self._take_object_async(token, deadline, timeout)
            rc = _acquire(self._lf, token)
        if rc == errno.EBADF:
            self._open()
            rc = _acquire(self._lf, token)
        return int(rc)

    async def _wait_hinted(
        self,
        attempt: object,
        owner: object,
        deadline: float | None,
        timeout: float | None,
        waits: list[LoopWait],
    ) -> int:
        """Wait without a thread, on the loop's hints (pylock._core.hints),
        trying the lock after each, for as long as the kernel shows a holder
        whose release makes one (pylock._lock.announced); else (_thread) in
        a thread blocked in the kernel.  Returns the code of the try that is
        not EWOULDBLOCK.  Giving up on hints leaves nothing behind."""
        import asyncio

        from .._core.hints import loop_hints
        from .announced import HINTS, RETRY, held_in_process, next_step

        if held_in_process(self):  # no watch to set up and take down for it
            return await self._wait_async(attempt, owner, deadline, timeout, waits)
        self._refuse_self_deadlock(owner)  # (a passed deadline: after one more try)
        loop = asyncio.get_running_loop()
        hints = loop_hints(loop)
        hint = None if hints is None else hints.hint_for(self._lf.handle)
        if hint is None:
            return await self._wait_async(attempt, owner, deadline, timeout, waits)
        box = [hint]  # the hint the deadline wakes; a second item once it passed
        timer = None if deadline is None else loop.call_later(_left(deadline), _expire, box)
        retried = useless = 0  # RETRY: the holder left as we looked, or the table lost it
        try:
            while True:  # watched before each try: no release falls in between
                woken, hint.hinted = hint.hinted, False
                rc = _acquire(self._lf, id(attempt))
                if rc != errno.EWOULDBLOCK:
                    return int(rc)
                if len(box) > 1 or passed(deadline):  # a timer may fire early (uvloop)
                    self._raise_held(True, timeout)
                useless += woken
                if useless > _USELESS_HINTS:
                    break
                step = next_step(self, hint.file)
                if step.__class__ is not str:
                    step = await step  # type: ignore[misc]
                if step is RETRY and retried < 3:  # a few times, never a loop
                    retried += 1
                    continue
                if step is not HINTS:
                    break
                retried = 0
                if not hint.hinted:
                    await hint.next()
                if hint.file.wd == 0:  # the watch is gone: watch the file again
                    hint.leave()
                    hint = box[0] = hints.hint_for(self._lf.handle)  # type: ignore[union-attr,assignment]
                    if hint is None:
                        break
        finally:
            if timer is not None:
                timer.cancel()
            if hint is not None:
                hint.leave()
        # The holder's release may make no hint: the kernel wakes a thread.
        return await self._wait_async(attempt, owner, deadline, timeout, waits)

    async def _wait_async(
        self,
        attempt: object,
        owner: object,
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

        if passed(deadline):
            self._raise_held(True, timeout)
        self._refuse_self_deadlock(owner)
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


# Hints after which the lock was still held, at most, before a wait goes to a
# thread: anyone who may read the lock file can make hints (each read is one),
# and each costs the waiting process a try and a look at the lock table.
_USELESS_HINTS = 256


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _expire(box: list[Any]) -> None:
    box.append(True)  # for good: a later pass must not take it for a hint
    if box[0] is not None:
        box[0].wake()


def _orphaned(lock: AsyncAcquire, attempt: object, rc: int) -> None:
    """A wait whose task gave up has ended (in its thread): give back the
    grant (rc 0) and the object, which the task left to this thread."""
    if _disown(lock._lf, id(attempt), 1) > 0:
        lock._ring()
    if lock._close_pending:  # close() was called while this wait ran
        lock._close_if_unused()
