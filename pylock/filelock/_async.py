"""filelock's async locks: BaseAsyncFileLock and AsyncFileLock, whose waits
are pylock's acquire_async (a pylock thread waits in the kernel and hands
over to the loop; nothing runs in an executor, nothing polls)."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

from .._core.errors import LockFileError
from .._lock.errors import LockHeld, LockTimeout, ReentrantAcquire
from ._api import BaseFileLock
from ._bell import BELL
from ._errors import Timeout, as_os_error, deadlock
from ._kernel import MIN_SLICE, FileLock, deadline_of, time_left
from ._options import UNSET_MODE, Wait, wait_of
from ._soft import Marker, SoftFileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import os
    from concurrent import futures
    from types import TracebackType

    from .._lock.lock import Lock

_AsyncT = TypeVar("_AsyncT", bound="BaseAsyncFileLock")
_SYNC_WITH = (
    "Use `async with`: acquire/release are coroutines and cannot be awaited in a sync "
    "context manager."
)


class AsyncAcquireReturnProxy:
    """What an async acquire() returns: `async with` gives the lock, leaving releases once."""

    def __init__(self, lock: BaseAsyncFileLock) -> None:
        self.lock = lock

    async def __aenter__(self) -> BaseAsyncFileLock:
        return self.lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lock._release_in_context(exc)


class BaseAsyncFileLock(BaseFileLock):
    """filelock's BaseAsyncFileLock: acquire() and release() are coroutines,
    the count is shared by default (thread_local=False), and the deadlock
    check is per task."""

    _thread_local_default = False
    _scope = "task"

    def __init__(
        self,
        lock_file: str | os.PathLike[str],
        timeout: float = -1,
        mode: int = UNSET_MODE,
        thread_local: bool = False,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        run_in_executor: bool = True,
        executor: futures.Executor | None = None,
        **options: Any,
    ) -> None:
        super().__init__(lock_file, timeout, mode, thread_local, **options)
        # Accepted for filelock's callers; pylock never blocks the loop, so
        # nothing of a lock's runs in an executor.
        self._loop = loop
        self._run_in_executor = run_in_executor
        self._executor = executor

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def run_in_executor(self) -> bool:
        return self._run_in_executor

    @property
    def executor(self) -> futures.Executor | None:
        return self._executor

    async def _take_async(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        raise NotImplementedError

    async def acquire(  # type: ignore[override]
        self,
        timeout: float | None = None,
        poll_interval: float | None = None,
        *,
        blocking: bool | None = None,
        cancel_check: Callable[[], bool] | None = None,
    ) -> AsyncAcquireReturnProxy:
        """Acquire as BaseFileLock.acquire does, without blocking the loop."""
        wait = wait_of(self._context, timeout, poll_interval, None, blocking)
        if self._holds.join():
            return AsyncAcquireReturnProxy(self)
        if self._singleton_shared:
            self._refuse_moved_singleton()
        debug = self._log_attempt()
        try:
            held = await self._take_async(wait, cancel_check)
        except BaseException as exc:
            if debug:
                self._log_failure(exc, wait)
            raise
        self._holds.start(held)
        if debug:
            self._log_acquired()
        return AsyncAcquireReturnProxy(self)

    async def release(self, force: bool = False) -> None:  # type: ignore[override]
        """Release one acquisition (force: all); the last gives the lock back."""
        BaseFileLock.release(self, force)

    async def __aenter__(self: _AsyncT) -> _AsyncT:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release_in_context(exc)

    def __enter__(self) -> Any:
        raise NotImplementedError(_SYNC_WITH)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise NotImplementedError(_SYNC_WITH)

    # -- construction -------------------------------------------------------

    @classmethod
    def _option_defaults(cls) -> dict[str, object]:
        return {
            **super()._option_defaults(),
            "loop": None,
            "run_in_executor": True,
            "executor": None,
        }

    @classmethod
    def _check_options(cls, options: dict[str, Any]) -> None:
        if options["thread_local"] and options.get("run_in_executor", True):
            raise ValueError("run_in_executor is not supported when thread_local is True")

    def _compare_options(self, options: dict[str, Any]) -> dict[str, tuple[object, object]]:
        compared = super()._compare_options(options)
        given = {**self._option_defaults(), **options}
        # Loops and executors are the same only when they are the same object.
        for name, mine in (("loop", self._loop), ("executor", self._executor)):
            compared[name] = (id(given[name]), id(mine))
        compared["run_in_executor"] = (given["run_in_executor"], self._run_in_executor)
        return compared


BaseAsyncFileLock._own_inits = (*BaseFileLock._own_inits, BaseAsyncFileLock.__init__)


class AsyncFileLock(FileLock, BaseAsyncFileLock):
    """filelock's AsyncFileLock on a pylock.Lock, taken with acquire_async."""

    async def _take_async(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        lock = self._lock_now()
        try:
            try:
                if wait.blocking and cancel_check is None:  # one wait in the kernel
                    await lock.acquire_async(timeout=None if wait.forever else wait.timeout)
                else:
                    await _attempt_async(lock, wait, deadline_of(wait), cancel_check)
            except ReentrantAcquire:  # raised before any wait: the deadline is still whole
                if wait.forever:
                    raise deadlock(self._lock_file, type(self).__name__, self._scope) from None
                await _outwait_self_async(lock, wait, deadline_of(wait), cancel_check)
        except LockHeld as held:
            raise Timeout(self._lock_file, held.holder) from None
        except LockFileError as error:
            raise as_os_error(error) from None
        if self._relative:
            self._pin(lock.path)
        return lock


async def _attempt_async(
    lock: Lock, wait: Wait, deadline: float | None, cancel_check: Callable[[], bool] | None
) -> None:
    if not wait.blocking:
        await lock.acquire_async(timeout=0)
        return
    if cancel_check is None:
        await lock.acquire_async(timeout=time_left(deadline))
        return
    step = max(wait.poll_interval, MIN_SLICE)
    while True:
        left = time_left(deadline)
        try:
            await lock.acquire_async(timeout=step if left is None else min(step, left))
            return
        except LockTimeout:
            if (left is not None and left <= step) or cancel_check():
                raise


async def _outwait_self_async(
    lock: Lock, wait: Wait, deadline: float | None, cancel_check: Callable[[], bool] | None
) -> None:
    """As _kernel._outwait_self, for a task: another task may release."""
    step = max(wait.poll_interval, MIN_SLICE)
    seen = BELL.listen()
    try:
        while True:
            try:
                await _attempt_async(lock, wait, deadline, cancel_check)
                return
            except ReentrantAcquire:
                left = time_left(deadline) or 0.0
                if left <= 0 or (cancel_check is not None and cancel_check()):
                    await lock.acquire_async(timeout=0)  # LockTimeout, naming this process
                    return
                timeout = left if cancel_check is None else min(left, step)
                seen = await BELL.wait_async(seen, timeout)
    finally:
        BELL.stop()


class AsyncSoftFileLock(SoftFileLock, BaseAsyncFileLock):
    """filelock's AsyncSoftFileLock: the soft marker, waited for from a task
    (a release in this process wakes it at once; one elsewhere is seen at
    the next look, poll_interval later)."""

    def _owner(self) -> object:
        import asyncio

        return asyncio.current_task() or super()._owner()

    async def _take_async(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        owner = self._owner()
        deadline = None if wait.forever else time.monotonic() + wait.timeout
        where = self._directory()
        seen = None
        try:
            while True:
                step = self._step(where, owner, wait, deadline, cancel_check)
                if isinstance(step, Marker):
                    return step
                if seen is None:  # listen, then look again before sleeping
                    seen = BELL.listen()
                    continue
                seen = await BELL.wait_async(seen, step)
        finally:
            where.close()
            if seen is not None:
                BELL.stop()
