"""Lock: an OS lock on a file, with a record of who holds it."""

from __future__ import annotations

import errno
import os
import time
from _thread import allocate_lock, get_ident
from _weakrefset import WeakSet  # what weakref.WeakSet is, without weakref's import cost

from . import _fs
from ._errors import (
    LockError,
    LockFileError,
    LockHeld,
    LockTimeout,
    NotHeld,
    ReentrantAcquire,
    UnsafeFilesystem,
)
from ._native import ffi, lib
from ._syscall import check, fail, open_lock_file

# `import pylock` must cost little more than the interpreter's own start
# (services import it at start, operators run `pylock run` in shell loops):
# typing, logging, threading, contextlib, asyncio, the holder lookup and the
# process identity are loaded where they are first used, not here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from types import TracebackType
    from typing import Any, Union

    from ._holder import Holder
    from .metrics import LockStats

    _Owner = Union[int, tuple[str, int]]

# Every Lock with an open descriptor: a forked child drops them, and a wait
# that could only deadlock (this owner holds the file through another Lock)
# is refused by looking here.
_open_locks: WeakSet[Lock] = WeakSet()


_acquire = lib.pl_acquire
_unlock = lib.pl_unlock
_get_ident = get_ident


def _task_owner() -> _Owner:
    import asyncio  # loaded lazily: programs that only lock never pay for it

    task = asyncio.current_task()
    return ("task", id(task)) if task is not None else _get_ident()


# pylock.metrics while enabled (None: off, and each hook costs one check).
_observer: Any = None


# Waits longer than this (about 146 years) are waits without a timeout.
_FOREVER_NS = 2**62


def _ns_until(deadline: float | None) -> int:
    if deadline is None:
        return -1
    left = (deadline - time.monotonic()) * 1e9
    return -1 if left >= _FOREVER_NS else max(0, int(left))


class Lock:
    """An inter-process lock on path that knows who holds it.

    The kernel's lock (flock, LockFileEx) is the only truth: it is dropped
    when the holder dies, even by SIGKILL.  After taking it, an exclusive
    holder writes a best-effort record (pid, start identity, host, program,
    time, info) that holder() and the errors use to explain.  Locks are not
    reentrant; two Lock objects exclude each other in one process as in two.
    """

    _handle = -1  # also for __del__ of an object whose __init__ refused its arguments

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shared: bool = False,
        mode: int | None = None,
        info: dict[str, Any] | None = None,
        allow_network_fs: bool = False,
    ) -> None:
        raw = os.fspath(path)
        if isinstance(raw, bytes):
            raw = os.fsdecode(raw)
        if raw.endswith(("/", os.sep)):
            raise LockFileError(errno.EISDIR, raw, "a trailing separator names a directory")
        # Resolved now: a later chdir must not move the lock.
        self.path: str = os.path.abspath(raw)
        self.shared = shared
        if mode is not None and not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be a permission mode like 0o644, not {mode!r}")
        self._mode = -1 if mode is None else mode
        if info is not None:  # refuse what the record could not carry, now
            from ._record import check_info

            check_info(info)
        self._info = info
        self._allow_network_fs = allow_network_fs
        self._handle = -1
        self._key = (0, 0)
        self._writable = True
        # Passed to the C core as one pointer on every acquisition.
        self._lf = ffi.new("pl_lockfile *")
        self._lf.shared = shared
        if os.name != "nt":
            self._path_c = ffi.new("char[]", os.fsencode(self.path))
            self._lf.path = self._path_c
        self._head: Any = None  # keeps the C copy of the record's head alive
        self._record_warned = False
        self._guard = allocate_lock()  # one owner per Lock object
        self._owner: _Owner | None = None
        self._object_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __repr__(self) -> str:
        state = "locked" if self.locked else "unlocked"
        kind = "shared" if self.shared else "exclusive"
        return f"<pylock.Lock {self.path!r} {kind} {state}>"

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._owner is not None

    # -- the descriptor, kept open between acquisitions ---------------------

    def _open(self) -> int:
        try:
            handle = open_lock_file(self.path, lib.PL_OPEN_CREATE, self._mode)
            self._writable = True
            self._lf.no_record_reason = 0
        except LockFileError as exc:
            # A lock file we may read but not write (another user's, or on a
            # read-only filesystem) can still be locked; only the record is lost.
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            try:
                handle = open_lock_file(self.path, lib.PL_OPEN_READONLY)
            except LockFileError:
                raise exc from None
            self._writable = False
            # Reported (once) when the lock is taken, like a failed write.
            self._lf.no_record_reason = 0 if self.shared else exc.errno
        lf = self._lf
        try:
            self._check_filesystem(handle)
            check(lib.pl_file_stat(handle, ffi.addressof(lf, "st")), self.path)
            if self.shared or not self._writable:
                lf.head_len = 0  # shared holders would overwrite each other's record
            else:
                from ._process import self_identity
                from ._record import RecordTemplate

                template = RecordTemplate(self_identity(), self._info)
                self._head = ffi.new("char[]", template.head)
                lf.head, lf.head_len = self._head, len(template.head)
                lf.head_crc = template.head_crc
        except BaseException:
            lib.pl_close(handle)
            raise
        self._key = (lf.st.dev, lf.st.ino)
        lf.handle = handle
        self._handle = handle
        _open_locks.add(self)
        return handle

    def _check_filesystem(self, handle: int) -> None:
        if self._allow_network_fs:
            return
        fs = ffi.new("pl_fs_info *")
        check(lib.pl_fs_stat(handle, fs), self.path)
        name = _fs.network_filesystem(fs.magic, fs.remote, ffi.string(fs.name).decode())
        if name is not None:
            raise UnsafeFilesystem(self.path, name)

    def _close_handle(self) -> None:
        if self._handle >= 0:
            lib.pl_close(self._handle)
            self._handle = -1
            _open_locks.discard(self)

    def close(self) -> None:
        """Release the lock if this object holds it, and close the lock file."""
        if self.locked:
            self.release()
        self._close_handle()

    def __del__(self) -> None:
        # Closing the descriptor is what drops the kernel lock.
        if self._handle >= 0:
            lib.pl_close(self._handle)

    # -- taking the lock -----------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock, waiting in the kernel for the holder's release or death.

        Raises LockHeld when blocking is False and someone holds it,
        LockTimeout when timeout seconds pass, ReentrantAcquire when this
        thread already holds it.  Returns True.
        """
        owner = _get_ident()
        if self._owner == owner:
            raise ReentrantAcquire(
                f"{self.path}: this thread already holds this Lock; pylock locks are "
                "not reentrant (release it first, or use one Lock per thread)"
            )
        if timeout is None:
            deadline = None
        elif not blocking:
            raise ValueError("a timeout makes no sense with blocking=False")
        else:
            deadline = time.monotonic() + max(timeout, 0.0)
        guard = self._guard
        # Another thread of this process may hold this very object.
        if not guard.acquire(False) and (
            not blocking or not guard.acquire(True, -1 if timeout is None else timeout)
        ):
            self._raise_held(blocking, timeout)
        try:
            if self._handle < 0:
                self._open()
            # The whole uncontended acquisition: lock, check the path, record.
            rc = _acquire(self._lf)
            if rc:
                self._acquire_slow(rc, blocking, deadline, timeout, owner)
        except BaseException:
            guard.release()
            raise
        self._owner = owner
        if _observer is not None:
            _observer.acquired(self)
        return True

    def _acquire_slow(
        self, rc: int, blocking: bool, deadline: float | None, timeout: float | None, owner: _Owner
    ) -> None:
        """The lock was held, the file moved, or the record failed (rc < 0)."""
        handle = self._handle
        if _observer is not None and rc == errno.EWOULDBLOCK:
            _observer.conflicted(self)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if not blocking or (deadline is not None and deadline <= time.monotonic()):
                    self._raise_held(blocking, timeout)
                self._refuse_self_deadlock(owner)
                self._wait(handle, deadline, timeout)
                rc = lib.pl_claim(self._lf)
            else:
                handle, rc = self._retry_after(rc)
        if rc:
            self._warn_no_record(-rc)

    def _retry_after(self, rc: int) -> tuple[int, int]:
        """The lock file was unlinked under us (the lock is already released):
        start again on the file now at the path.  Any other code is an error."""
        if rc != lib.PL_E_UNLINKED:
            fail(rc, self.path)
        self._close_handle()
        handle = self._open()
        return handle, lib.pl_acquire(self._lf)

    def _wait(self, handle: int, deadline: float | None, timeout: float | None) -> None:
        waiter = lib.pl_waiter_new()
        if waiter == ffi.NULL:
            raise MemoryError
        try:
            while True:
                rc = lib.pl_lock_wait(handle, self.shared, _ns_until(deadline), waiter)
                if rc == 0:
                    return
                if rc == errno.ETIMEDOUT:
                    self._raise_held(True, timeout)
                if rc != errno.EINTR:
                    fail(rc, self.path)
                # EINTR: returning to Python ran the signal handlers (which
                # may raise, e.g. KeyboardInterrupt); wait for the time left.
        finally:
            lib.pl_waiter_free(waiter)

    def _refuse_self_deadlock(self, owner: _Owner) -> None:
        if any(
            other is not self and other._key == self._key and other._owner == owner
            for other in list(_open_locks)
        ):
            raise ReentrantAcquire(
                f"{self.path}: this {'task' if isinstance(owner, tuple) else 'thread'} "
                "already holds this lock through another Lock object; waiting would "
                "deadlock (pylock locks are not reentrant)"
            )

    def _raise_held(self, blocking: bool, timeout: float | None) -> None:
        if _observer is not None:
            _observer.gave_up(self)
        from ._holder import find_holder

        holder = find_holder(self.path, known_held=True)
        if blocking:
            raise LockTimeout(self.path, holder, timeout or 0.0)
        raise LockHeld(self.path, holder)

    def _warn_no_record(self, code: int) -> None:
        if not self._record_warned:
            self._record_warned = True
            import logging

            logging.getLogger("pylock").warning(
                "pylock: holding %s, but its holder record could not be written (%s); "
                "the lock is held and safe, only diagnostics will lack the record's "
                "details (info, since when)",
                self.path,
                os.strerror(code),
            )

    # -- asyncio ---------------------------------------------------------------

    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take the lock from a coroutine without blocking the event loop.

        While the lock is held elsewhere, one thread waits in the kernel and
        hands over to the loop when the holder releases or dies; cancelling
        the task (or the timeout) interrupts that wait and leaves nothing
        behind, never the lock.
        """
        owner = _task_owner()
        if self._owner == owner:
            raise ReentrantAcquire(
                f"{self.path}: this task already holds this Lock; pylock locks are not reentrant"
            )
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while not self._guard.acquire(False):
            await self._wait_for_object(deadline, timeout)
        try:
            handle = self._handle if self._handle >= 0 else self._open()
            rc = _acquire(self._lf)
            if _observer is not None and rc == errno.EWOULDBLOCK:
                _observer.conflicted(self)
            while rc > 0:  # < 0: held, but the record could not be written
                if rc == errno.EWOULDBLOCK:
                    if deadline is not None and deadline <= time.monotonic():
                        self._raise_held(True, timeout)
                    self._refuse_self_deadlock(owner)
                    await self._wait_async(handle, deadline, timeout)
                    rc = lib.pl_claim(self._lf)
                else:
                    handle, rc = self._retry_after(rc)
            if rc:
                self._warn_no_record(-rc)
            self._owner = owner
            if _observer is not None:
                _observer.acquired(self)
        except BaseException:
            self._guard.release()
            self._wake_object_waiter()
            raise
        return True

    async def _wait_for_object(self, deadline: float | None, timeout: float | None) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        self._object_waiters.append(entry)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait_for(future, remaining)
        except BaseException as exc:
            if entry in self._object_waiters:
                self._object_waiters.remove(entry)
            elif not self._guard.locked():
                # We were handed the turn but give up (cancelled, timed
                # out): pass it on, or the next waiter sleeps forever.
                self._wake_object_waiter()
            if isinstance(exc, asyncio.TimeoutError):
                self._raise_held(True, timeout)
            raise

    def _wake_object_waiter(self) -> None:
        import contextlib

        if self._object_waiters:
            loop, future = self._object_waiters.pop(0)
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_set_result, future)

    async def _wait_async(self, handle: int, deadline: float | None, timeout: float | None) -> None:
        import asyncio
        import contextlib
        import threading

        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        waiter = lib.pl_waiter_new()
        if waiter == ffi.NULL:
            raise MemoryError
        outcome = [errno.ECANCELED]
        shared = self.shared

        def wait_in_kernel() -> None:
            rc = errno.EINTR
            try:
                while rc == errno.EINTR:
                    rc = lib.pl_lock_wait(handle, shared, _ns_until(deadline), waiter)
            finally:  # whatever happened, the awaiting task must hear of it
                outcome[0] = rc
                with contextlib.suppress(RuntimeError):  # the loop closed; nobody waits
                    loop.call_soon_threadsafe(_set_result, done, rc)

        thread = threading.Thread(target=wait_in_kernel, name=f"pylock wait {self.path}")
        thread.daemon = True
        thread.start()
        try:
            rc = await done
        except BaseException:
            lib.pl_waiter_cancel(waiter)  # returns once the thread left its wait
            thread.join()
            if outcome[0] == 0:  # granted just before the cancel: give it back
                lib.pl_unlock(handle)
            raise
        finally:
            thread.join()
            lib.pl_waiter_free(waiter)
        if rc == errno.ETIMEDOUT:
            self._raise_held(True, timeout)
        if rc:
            fail(rc, self.path)

    # -- releasing ---------------------------------------------------------

    def release(self, unlink: bool = False) -> None:
        """Release the lock.

        unlink=True also removes the lock file, safely: it is unlinked while
        still held, and every acquirer re-checks after locking that its file
        is still linked, so waiters are never split across two inodes.
        """
        if self._owner is None:
            raise NotHeld(f"{self.path}: release() of a lock this Lock object does not hold")
        if _observer is not None:
            _observer.released(self)
        if unlink:
            self._unlink_while_holding()
        _unlock(self._handle)
        self._owner = None
        if unlink:
            self._close_handle()
        self._guard.release()
        if self._object_waiters:
            self._wake_object_waiter()

    def _unlink_while_holding(self) -> None:
        if self.shared:
            raise LockError(
                f"{self.path}: release(unlink=True) needs an exclusive lock: other "
                "shared holders would keep the old file while newcomers lock a new one"
            )
        # Only if the path still names our file, asked of the C core (whose
        # dev/ino we compare against; os.stat's differ on older Windows).
        try:
            handle = open_lock_file(self.path, lib.PL_OPEN_READONLY)
        except OSError:
            return  # gone already, or no longer a plain file: not ours to remove
        try:
            st = ffi.new("pl_file_info *")
            ours = lib.pl_file_stat(handle, st) == 0 and (st.dev, st.ino) == self._key
        finally:
            lib.pl_close(handle)
        if ours:
            os.unlink(self.path)

    # -- diagnostics ------------------------------------------------------

    def holder(self) -> Holder | None:
        """The process holding this lock now (maybe this one), or None when free."""
        from ._holder import find_holder

        return find_holder(self.path)

    @property
    def stats(self) -> LockStats:
        """This lock's counters in this process (all zero unless pylock.metrics is enabled)."""
        from .metrics import stats_of

        return stats_of(self.path)

    # -- context managers ---------------------------------------------------

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Lock:
        await self.acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _set_result(future: asyncio.Future[Any], value: Any = None) -> None:
    if not future.done():
        future.set_result(value)


def _after_fork_in_child() -> None:
    # The child shares the parent's open file descriptions: unlocking would
    # release the parent's lock, keeping them would keep it alive after the
    # parent dies.  Close them, and forget everything the parent held.
    for lock in list(_open_locks):
        if lock._handle >= 0:
            lib.pl_close(lock._handle)
        lock._handle = -1
        lock._owner = None
        lock._guard = allocate_lock()
        lock._object_waiters = []
    _open_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
