"""Who uses a lock object: the ownership protocol Lock and EtcdLock share.

One attempt at a time uses a lock object.  The C core keeps which in the
object's owner word (pl_own, pl_disown on its pl_lockfile), naming the
attempt by the id of an object the attempt keeps alive; a mark bit says
that others wait.  Threads waiting for the object sleep on its bell, a lock
that is released ("rung") when the owner gives the object back; coroutines
wait on futures in a queue, woken one at a time.  The holder (a thread's
token, or a task) is kept alive while it holds, so that no later thread or
task can pass for it.  A forked child owns nothing: one handler forgets
every object's owner.

asyncio is not imported here (`import pylock` must not load it): the
coroutine side loads it on first use, from a running loop.
"""

from __future__ import annotations

import os
from _thread import TIMEOUT_MAX, _local, allocate_lock
from _weakrefset import WeakSet  # what weakref.WeakSet is, without weakref's import cost

from .._core.native import ffi, lib
from .._core.timeout import seconds_left

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    import asyncio
    from abc import abstractmethod
    from collections.abc import Awaitable
    from types import TracebackType
    from typing import Any, Callable, NoReturn, TypeVar

    Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]
    _Self = TypeVar("_Self", bound="Owned")
    _Method = TypeVar("_Method", bound=Callable[..., Any])


class _ThreadOwner(_local):
    """A token per thread.  Thread ids are reused as soon as a thread ends;
    a token lives as long as a lock object holds it, so it cannot be."""

    def __init__(self) -> None:
        self.token = object()


# This thread's token: `this_thread.token` names the owner in a blocking acquire.
this_thread = _ThreadOwner()

# Every lock object: a fork may come while another thread owns one.
_owned: WeakSet[Owned] = WeakSet()


def new_bell() -> Any:
    bell = allocate_lock()
    bell.acquire()  # locked: silent until rung
    return bell


def bell_timeout(deadline: float | None) -> float:
    """The bell's timeout for the time left: -1 waits forever, and it is never
    above TIMEOUT_MAX (about 49.7 days on Windows), which a lock refuses."""
    left = seconds_left(deadline)
    return -1 if left is None else min(left, TIMEOUT_MAX)


class Owned:
    """A lock object that one attempt at a time uses (Lock, EtcdLock), and
    the with statements that take and give it back.

    Exceptions from signal handlers are raised only after a call returns or
    at a jump back, never inside a C call: an attempt names itself (a
    token) before its try, owns the object and gives it back only in C calls
    that take the token, and its except clause gives back exactly what it
    owns.  Where such an exception may land (the program's threads), the
    acquisitions inline the ring instead of calling _ring.
    """

    def __init__(self) -> None:
        # The C core's owner word lives in lf (a Lock's also carries its lock file).
        self._lf = ffi.new("pl_lockfile *")
        self._lf.handle = -1
        # The holding attempt's object: its id names the owner in the C core.
        self._attempt: object | None = None
        # The holding thread's token or task, compared by identity.
        self._owner: object | None = None
        self._bell = new_bell()
        # Coroutines waiting for this object (not for the lock) to be free.
        self._object_waiters: list[Waiter] = []
        self._object_waiters_mu = allocate_lock()
        _owned.add(self)

    if TYPE_CHECKING:
        # What each kind of lock defines.

        @abstractmethod
        def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool: ...

        @abstractmethod
        async def acquire_async(self, timeout: float | None = None) -> bool: ...

        @abstractmethod
        def release(self) -> None: ...

        @abstractmethod
        def _release_in_task(self) -> Awaitable[None] | None:
            """Release from a coroutine: None when done, else what to await."""

        @abstractmethod
        def _raise_held(self, blocking: bool, timeout: float | None) -> NoReturn:
            """LockHeld (not blocking) or LockTimeout, naming the holder."""

    def _owned_by(self, token: int) -> bool:
        """Whether the attempt named token owns this object now."""
        return bool((self._lf.owner & ~1) == token)

    def _own(self, token: int) -> bool:
        """Own this object for the attempt named token, unless another owns it."""
        return lib.pl_own(self._lf, token, 0) == 0

    def _take_object(
        self,
        token: int,
        blocking: bool,
        deadline: float | None,
        timeout: float | None,
        waited: list[bool],
    ) -> None:
        """Another attempt of this process owns the object: sleep on the bell
        until it is given back, then own it for the attempt named token.
        waited[0] turns True once slept (a ring meant for others may have
        been taken: the attempt rings when it gives up)."""
        if not blocking:
            self._raise_held(False, timeout)
        # Marked as waiting, so that the owner's release rings; owned marked
        # too, as others may still wait and need its ring.
        while lib.pl_own(self._lf, token, 1) != 0:
            waited[0] = True
            if not self._bell.acquire(True, bell_timeout(deadline)):
                self._raise_held(True, timeout)

    async def _take_object_async(
        self, token: int, deadline: float | None, timeout: float | None
    ) -> None:
        """_take_object for a coroutine: queued on a future, never blocking the loop."""
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            future: asyncio.Future[None] = loop.create_future()
            entry = (loop, future)
            with self._object_waiters_mu:
                self._object_waiters.append(entry)
            try:
                # Queued first, then marked as waiting: the owner's release, which
                # sees the mark, rings after the entry is there to be woken.
                if lib.pl_own(self._lf, token, 1) == 0:
                    self._dequeue(entry)
                    return
                await asyncio.wait_for(future, seconds_left(deadline))
            except BaseException as exc:
                if not self._dequeue(entry):
                    # We were woken but give up (cancelled, timed out): pass
                    # the wake-up on, or the next waiter sleeps forever.
                    self._wake_object_waiter()
                if isinstance(exc, asyncio.TimeoutError):
                    self._raise_held(True, timeout)
                raise

    def _dequeue(self, entry: Waiter) -> bool:
        with self._object_waiters_mu:
            queued = entry in self._object_waiters
            if queued:
                self._object_waiters.remove(entry)
        return queued

    def _ring(self) -> None:
        """Wake a thread and a coroutine waiting for this object (each retries
        pl_own; a wake-up too many costs one retry)."""
        try:
            self._bell.release()
        except RuntimeError:
            pass  # rung already, and not yet heard
        finally:
            if self._object_waiters:
                self._wake_object_waiter()

    def _wake_object_waiter(self) -> None:
        """Wake the first waiting coroutine whose loop still runs."""
        while True:
            with self._object_waiters_mu:
                if not self._object_waiters:
                    return
                loop, future = self._object_waiters.pop(0)
            try:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_set_result, future)
                    return
            except RuntimeError:  # closed meanwhile
                pass

    def _after_fork(self) -> None:
        """In a forked child, which has one thread: nobody owns or waits for anything."""
        self._lf.owner = 0
        self._owner = None
        self._attempt = None
        self._bell = new_bell()
        self._object_waiters = []
        self._object_waiters_mu = allocate_lock()

    # -- context managers ----------------------------------------------------

    def __enter__(self: _Self) -> _Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self: _Self) -> _Self:
        await self.acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pending = self._release_in_task()
        if pending is not None:
            await pending


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- the owner of an asynchronous acquisition ---------------------------------

# The ids of the code objects of the acquire_async methods (which live as
# long as the process): a task running nothing but one of them acquires for
# the task awaiting it.
_acquire_async_codes: set[int] = set()


def acquires_for_awaiting_task(method: _Method) -> _Method:
    """Marks an acquire_async method: a task that runs nothing but it
    (asyncio.wait_for on Python 3.11 wraps the coroutine in one; so does
    create_task(lock.acquire_async())) acquires for the task awaiting it."""
    _acquire_async_codes.add(id(method.__code__))
    return method


def task_owner() -> object:
    """The task that will hold the lock, or this thread's token outside tasks."""
    task = _current_task()
    if task is None:
        return this_thread.token
    # By id: a code object hashes its whole contents on every lookup.
    if id(getattr(task.get_coro(), "cr_code", None)) in _acquire_async_codes:
        awaiting = _awaiting_task(task)
        if awaiting is not None:
            return awaiting
    return task


# Annotated before the function that rebinds it: PyPy 3.9 refuses an
# annotation after a function's `global` of the name.
_current_task: Callable[[], Any]


def _first_current_task() -> Any:
    """Finds asyncio's current_task on the first call, from a coroutine (so
    asyncio is loaded by then), and from then on is replaced by it."""
    global _current_task
    _current_task = _current_task_function()
    return _current_task()


_current_task = _first_current_task


def _current_task_function() -> Callable[[], Any]:
    """asyncio.current_task without its Python frame and its loop argument
    before Python 3.12, which has it in C (what it saves: bench/README.md)."""
    import asyncio

    try:
        from _asyncio import current_task  # type: ignore[attr-defined,unused-ignore]

        return current_task  # type: ignore[no-any-return,unused-ignore]
    except ImportError:
        pass
    tasks_by_loop = getattr(asyncio.tasks, "_current_tasks", None)
    if not isinstance(tasks_by_loop, dict):
        return asyncio.current_task
    running_loop = asyncio.get_running_loop

    def current_task_before_312() -> Any:
        return tasks_by_loop.get(running_loop())

    return current_task_before_312


def _awaiting_task(task: Any) -> object | None:
    """The task awaiting `task`, found from the callbacks on what it awaits (an
    awaiting task's wakeup is bound to it), not by walking every task: a
    loop with thousands of create_task(lock.acquire_async()) asks this for
    each of them."""
    import asyncio

    awaited = [task]
    # wait_for on 3.9-3.11 awaits a future that a done-callback of the inner
    # task completes; a plain await waits on the task itself.
    for callback, _ in getattr(task, "_callbacks", None) or ():
        awaited.extend(
            arg for arg in getattr(callback, "args", ()) if isinstance(arg, asyncio.Future)
        )
    for future in awaited:
        for callback, _ in getattr(future, "_callbacks", None) or ():
            other = getattr(callback, "__self__", None)
            if (
                other is not task
                and isinstance(other, asyncio.Task)
                and getattr(other, "_fut_waiter", None) is future
            ):
                return other
    if any(future.done() for future in awaited[1:]):
        # wait_for's caller was cancelled before this step: cancelling its
        # waiter dropped the callbacks, and wait_for may still hand the
        # lock to that caller, which only a walk finds (a rare race).
        for other in asyncio.all_tasks(task.get_loop()):
            if other is not task and getattr(other, "_fut_waiter", None) in awaited:
                return other
    return None


# -- fork ----------------------------------------------------------------------


def _forget_owners_after_fork() -> None:
    for owned in list(_owned):
        owned._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_owners_after_fork)
