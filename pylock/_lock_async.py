"""Lock.acquire_async and its hand-overs: loaded on the first async
acquisition, so that programs that only lock never import asyncio."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from . import _lock
from ._errors import ReentrantAcquire
from ._lock import Lock
from ._native import lib
from ._syscall import fail
from ._timeout import deadline_of, seconds_left
from ._wait import passed


async def acquire_async(lock: Lock, timeout: float | None) -> bool:
    """Take the lock from a coroutine without blocking the event loop.

    While the lock is held elsewhere, a pylock thread waits in the kernel
    and hands over to the loop when the holder releases or dies.
    Cancelling the task (or the timeout) never blocks the loop and leaves
    nothing behind, never the lock.
    """
    owner = _task_owner()
    if lock._owner is owner:
        raise ReentrantAcquire(
            f"{lock.path}: this task already holds this Lock; pylock locks are not reentrant"
        )
    deadline = deadline_of(timeout)
    while not lock._guard.acquire(False):
        await _wait_for_object(lock, deadline, timeout)
    handed_over = [False]  # the guard went to an abandoned wait's thread
    try:
        if lock._handle < 0:
            lock._open()
        rc = _lock._acquire(lock._lf)
        if _lock._observer is not None and rc == errno.EWOULDBLOCK:
            _lock._observer.conflicted(lock)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if passed(deadline):
                    lock._raise_held(True, timeout)
                lock._refuse_self_deadlock(owner)
                await _wait_async(lock, deadline, timeout, handed_over)
                rc = lib.pl_claim(lock._lf)
            else:
                rc = lock._retry_after(rc)
        if rc:
            lock._warn_no_record(-rc)
        lock._owner = owner
        if _lock._observer is not None:
            _lock._observer.acquired(lock)
    except BaseException:
        if not handed_over[0]:
            try:
                _lock._unlock(lock._handle)
            finally:
                lock._guard.release()
                wake_object_waiter(lock)
        raise
    return True


async def _wait_for_object(lock: Lock, deadline: float | None, timeout: float | None) -> None:
    """Sleep until this Lock object is released by whoever holds it here."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    entry = (loop, future)
    with lock._object_waiters_mu:
        lock._object_waiters.append(entry)
    # Released between our try and the append: nobody would wake us.
    if not lock._guard.locked():
        wake_object_waiter(lock)
    try:
        await asyncio.wait_for(future, seconds_left(deadline))
    except BaseException as exc:
        with lock._object_waiters_mu:
            queued = entry in lock._object_waiters
            if queued:
                lock._object_waiters.remove(entry)
        if not queued:
            # We were woken but give up (cancelled, timed out): pass
            # the wake-up on, or the next waiter sleeps forever.
            wake_object_waiter(lock)
        if isinstance(exc, asyncio.TimeoutError):
            lock._raise_held(True, timeout)
        raise


def wake_object_waiter(lock: Lock) -> None:
    """Wake the first waiting coroutine whose loop still runs."""
    while True:
        with lock._object_waiters_mu:
            if not lock._object_waiters:
                return
            loop, future = lock._object_waiters.pop(0)
        try:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_set_result, future)
                return
        except RuntimeError:  # closed meanwhile
            pass


async def _wait_async(
    lock: Lock, deadline: float | None, timeout: float | None, handed_over: list[bool]
) -> None:
    """Wait in a pylock thread.  If the task gives up while the wait is
    still running, the guard passes to the wait (handed_over), whose
    thread gives back any grant and releases the guard when it ends."""
    from ._wait import LoopWait

    wait = LoopWait(
        asyncio.get_running_loop(),
        lock._c_wait(),
        deadline,
        lambda rc: _orphaned(lock, rc),
        f"pylock wait {lock.path}",
    )
    try:
        rc = await asyncio.shield(wait.future)
    except BaseException as exc:
        # Giving up: interrupt the wait and see how it ended, so that
        # the task raises holding nothing.  The await is short (the wake
        # signal ends the wait) and never blocks the loop.
        ended = None
        if not isinstance(exc, GeneratorExit) and wait.interrupt():
            try:
                ended = await asyncio.shield(wait.future)
            except BaseException:
                ended = None
        if ended is None:
            ended = wait.abandon()
        if ended is None:
            handed_over[0] = True  # its thread gives back and frees the guard
        elif ended == 0:
            _lock._unlock(lock._handle)
        raise
    wait.join()
    if rc == errno.ETIMEDOUT:
        lock._raise_held(True, timeout)
    if rc == errno.ENOTSUP:
        from ._wait import no_wake_signal

        raise no_wake_signal(f"{lock.path}: acquire_async()")
    if rc:
        fail(rc, lock.path)


def _orphaned(lock: Lock, rc: int) -> None:
    """A wait whose task gave up has ended (in its thread)."""
    try:
        if rc == 0:
            _lock._unlock(lock._handle)
    finally:
        lock._guard.release()
        wake_object_waiter(lock)


def _set_result(future: asyncio.Future[Any], value: Any = None) -> None:
    if not future.done():
        future.set_result(value)


def _task_owner() -> object:
    """The task that will hold the lock, or this thread's token outside tasks.

    A task that runs nothing but acquire_async (asyncio.wait_for on Python
    3.11 wraps the coroutine in one; so does create_task(lock.acquire_async()))
    acquires for the task awaiting it, so the lock is that task's.
    """
    task = asyncio.current_task()
    if task is None:
        return _lock._this_thread.token
    coro = task.get_coro()
    if getattr(coro, "cr_code", None) is _ACQUIRE_ASYNC_CODE:
        awaiting = _awaiting_task(task)
        if awaiting is not None:
            return awaiting
    return task


def _awaiting_task(task: Any) -> object | None:
    waiting_on = {id(task)}
    # wait_for on 3.11 awaits a future that a done-callback of the inner
    # task completes; a plain await waits on the task itself.
    for callback, _ in getattr(task, "_callbacks", None) or ():
        for arg in getattr(callback, "args", ()):
            if isinstance(arg, asyncio.Future):
                waiting_on.add(id(arg))
    for other in asyncio.all_tasks(task.get_loop()):
        if other is not task and id(getattr(other, "_fut_waiter", None)) in waiting_on:
            return other
    return None


_ACQUIRE_ASYNC_CODE = Lock.acquire_async.__code__


_ACQUIRE_ASYNC_CODE = Lock.acquire_async.__code__
