"""Lock.acquire_async and its hand-overs: loaded on the first async
acquisition, so that programs that only lock never import asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from typing import Any, Protocol

from .._core.native import fail, ffi, lib
from .._core.timeout import deadline_of, seconds_left
from .._core.wait import LoopWait, passed
from . import lock as _lock
from .errors import ReentrantAcquire
from .lock import Lock


async def acquire_async(lock: Lock, timeout: float | None = None) -> bool:
    """Take the lock from a coroutine without blocking the event loop.

    While the lock is held elsewhere, a pylock thread waits in the kernel
    and hands over to the loop when the holder releases or dies.
    Cancelling the task (or the timeout) never blocks the loop and leaves
    nothing behind, never the lock.  Owning the object and giving it back
    follow Lock.acquire (a token named before the try, C calls that take it).
    """
    owner = task_owner()
    if lock._owner is owner:
        raise ReentrantAcquire(
            f"{lock.path}: this task already holds this Lock; pylock locks are not reentrant"
        )
    deadline = deadline_of(timeout)
    attempt = object()
    token = id(attempt)
    lf = lock._lf
    waits: list[LoopWait] = []  # this attempt's kernel wait, which may outlive it
    try:
        rc = _lock._acquire(lf, token)
        while rc == lib.PL_E_BUSY:
            await wait_for_object(lock, token, deadline, timeout)
            rc = _lock._acquire(lf, token)
        if rc == errno.EBADF:  # owned, not yet open
            lock._open()
            rc = _lock._acquire(lf, token)
        contended = rc == errno.EWOULDBLOCK
        if _lock._observer is not None and contended:
            _lock._observer.conflicted(lock)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if passed(deadline):
                    lock._raise_held(True, timeout)
                lock._refuse_self_deadlock(owner)
                rc = await _wait_async(lock, attempt, deadline, timeout, waits)
            else:
                rc = lock._retry_after(rc, token)
        if _lock._observer is not None and contended:
            _lock._observer.waited(lock)
        if rc:
            lock._warn_no_record(-rc)
        lock._attempt = attempt
        lock._owner = owner
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
                    ring = _lock._disown(lf, token, 1)
                finally:
                    if ring > 0:  # _lock._ring(lock), inlined
                        try:
                            lock._bell.release()
                        except RuntimeError:
                            pass
                        finally:
                            if lock._object_waiters:
                                wake_object_waiter(lock)
        raise
    if _lock._event_log is not None:
        _lock._event_log.acquired(lock)
    return True


Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]


class ObjectOwned(Protocol):
    """What waiting for a lock object needs of it (Lock, EtcdLock)."""

    _lf: Any
    _object_waiters: list[Waiter]
    _object_waiters_mu: Any

    def _raise_held(self, blocking: bool, timeout: float | None) -> None: ...


async def wait_for_object(
    lock: ObjectOwned, token: int, deadline: float | None, timeout: float | None
) -> None:
    """Sleep until this lock object is given back by the attempt that owns it
    here; returns owning it (marked: others may wait for its ring)."""
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with lock._object_waiters_mu:
            lock._object_waiters.append(entry)
        try:
            # Queued first, then marked as waiting: the owner's release, which
            # sees the mark, rings after the entry is there to be woken.
            if lib.pl_own(lock._lf, token, 1) == 0:
                _dequeue(lock, entry)
                return
            await asyncio.wait_for(future, seconds_left(deadline))
        except BaseException as exc:
            if not _dequeue(lock, entry):
                # We were woken but give up (cancelled, timed out): pass
                # the wake-up on, or the next waiter sleeps forever.
                wake_object_waiter(lock)
            if isinstance(exc, asyncio.TimeoutError):
                lock._raise_held(True, timeout)
            raise


def _dequeue(lock: ObjectOwned, entry: Waiter) -> bool:
    with lock._object_waiters_mu:
        queued = entry in lock._object_waiters
        if queued:
            lock._object_waiters.remove(entry)
    return queued


def wake_object_waiter(lock: ObjectOwned) -> None:
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
    lock: Lock,
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
    lf, claimed = lock._lf, ffi.new("int *")

    def wait_and_claim(waiter: Any, timeout_ns: int) -> int:
        return int(lib.pl_lock_wait_claim(lf, timeout_ns, waiter, claimed))

    wait = LoopWait(
        asyncio.get_running_loop(),
        wait_and_claim,
        deadline,
        lambda rc: _orphaned(lock, attempt, rc),
        f"pylock wait {lock.path}",
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
    # waiting for it here cost every contended acquisition about 30 µs.
    if rc == errno.ETIMEDOUT:
        lock._raise_held(True, timeout)
    if rc == errno.ENOTSUP:
        from .._core.wait import no_wake_signal

        raise no_wake_signal(f"{lock.path}: acquire_async()")
    if rc:
        fail(rc, lock.path)
    return int(claimed[0])


def _orphaned(lock: Lock, attempt: object, rc: int) -> None:
    """A wait whose task gave up has ended (in its thread): give back the
    grant (rc 0) and the object, which the task left to this thread."""
    if _lock._disown(lock._lf, id(attempt), 1) > 0:
        _lock._ring(lock)
    if lock._close_pending:  # close() was called while this wait ran
        lock._close_if_unused()


def _set_result(future: asyncio.Future[Any], value: Any = None) -> None:
    if not future.done():
        future.set_result(value)


def _current_task_311() -> Any:
    """asyncio.current_task() of Python 3.11, without its Python frame and
    its loop argument (a third of an uncontended acquire_async's owner
    lookup); 3.12 has it in C."""
    return _tasks_by_loop.get(asyncio.get_running_loop())


_tasks_by_loop: Any = getattr(asyncio.tasks, "_current_tasks", None)
try:
    from _asyncio import current_task as _current_task  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # Python 3.11
    _fast = isinstance(_tasks_by_loop, dict)
    _current_task = _current_task_311 if _fast else asyncio.current_task


def task_owner() -> object:
    """The task that will hold the lock, or this thread's token outside tasks.

    A task that runs nothing but acquire_async (asyncio.wait_for on Python
    3.11 wraps the coroutine in one; so does create_task(lock.acquire_async()))
    acquires for the task awaiting it, so the lock is that task's.
    """
    task = _current_task()
    if task is None:
        return _lock._this_thread.token
    # By id: a code object hashes its whole contents on every lookup.
    if id(getattr(task.get_coro(), "cr_code", None)) in ACQUIRE_ASYNC_CODES:
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


# The ids of the acquire_async methods' code objects, which live as long as
# the process (EtcdLock adds its own): a task running nothing but one of
# them acquires for the task awaiting it.
ACQUIRE_ASYNC_CODES = {id(Lock.acquire_async.__code__), id(acquire_async.__code__)}

# Lock.acquire_async loads this module; from then on the method is
# acquire_async itself: one coroutine per acquisition instead of two, and no
# import statement (0.6 µs of an uncontended acquire_async + release).
acquire_async.__doc__ = Lock.acquire_async.__doc__
Lock.acquire_async = acquire_async  # type: ignore[method-assign,assignment]
_lock._acquire_async = acquire_async
