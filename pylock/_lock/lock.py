"""Lock: an OS lock on a file, with a record of who holds it."""

from __future__ import annotations

import errno
import os
from _thread import TIMEOUT_MAX as _TIMEOUT_MAX
from _thread import _local, allocate_lock
from _weakrefset import WeakSet  # what weakref.WeakSet is, without weakref's import cost

from .._core import fs as _fs
from .._core.errors import PSEUDO_FS, LockError, LockFileError, UnsafeFilesystem
from .._core.native import check, fail, ffi, lib, open_lock_file
from .._core.timeout import deadline_of, ns_left, seconds_left
from .._core.wait import passed, thread_waiter
from .errors import LockHeld, LockTimeout, NotHeld, ReentrantAcquire

# `import pylock` must cost little more than the interpreter's own start
# (services import it at start, operators run `pylock run` in shell loops):
# typing, logging, threading, contextlib, asyncio, the holder lookup and the
# process identity are loaded where they are first used, not here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from types import TracebackType
    from typing import Any, Protocol

    from ..metrics import LockStats
    from .holder import Holder

    class Ringable(Protocol):
        """A lock object with a bell (Lock, EtcdLock)."""

        _bell: Any
        _object_waiters: list[Any]

        def _wake_object_waiter(self) -> None: ...


# Every Lock with an open descriptor: a forked child forgets them (the C
# core has closed their descriptors), and a wait that could only deadlock
# (this owner holds the file through another Lock) is refused by looking here.
_open_locks: WeakSet[Lock] = WeakSet()
# Every Lock: a fork may come while another thread owns one, open or not.
_all_locks: WeakSet[Lock] = WeakSet()


_acquire = lib.pl_acquire
_release = lib.pl_release
_wait_claim = lib.pl_lock_wait_claim


class _ThreadOwner(_local):
    """A token per thread.  Thread ids are reused as soon as a thread ends;
    a token lives as long as a Lock holds it, so it cannot be."""

    def __init__(self) -> None:
        self.token = object()


_this_thread = _ThreadOwner()

# pylock.metrics while enabled (None: off): told of conflicts, waits and
# newly opened lock files.  Holds are timed by the C core, through the
# pl_hold_stats that _open points the lock file at.
_observer: Any = None
# pylock.metrics' debug log of every acquisition and release, when asked
# for (None: off, and each costs one check).
_event_log: Any = None

# Why a file could not be opened for writing though it may still be locked
# read-only: another user's file, a read-only filesystem, a running program.
_READ_ONLY_FALLBACK = (errno.EACCES, errno.EROFS, errno.EPERM, errno.ETXTBSY)


class Lock:
    """An inter-process lock on path that knows who holds it.

    The kernel's lock (flock, LockFileEx) is the only truth: it is dropped
    when the holder dies, even by SIGKILL.  After taking it, an exclusive
    holder writes a best-effort record (pid, start identity, host, program,
    time, info) that holder() and the errors use to explain, but only into a
    file that is empty or already holds a pylock record: any other file is
    locked and left untouched.  record=False never writes (nor opens the file
    for writing): for files that are not pylock's.  Locks are not reentrant;
    two Lock objects exclude each other in one process as in two.
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
        record: bool = True,
    ) -> None:
        raw = os.fspath(path)
        if isinstance(raw, bytes):
            raw = os.fsdecode(raw)
        if not raw:
            raise LockFileError(errno.ENOENT, raw, "the path is empty: name a lock file")
        if raw.endswith(("/", os.sep)):
            raise LockFileError(errno.EISDIR, raw, "a trailing separator names a directory")
        # Resolved now: a later chdir must not move the lock.
        self.path: str = os.path.abspath(raw)
        self.shared = shared
        if mode is not None and (
            isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777
        ):
            raise ValueError(
                f"mode must be permission bits from 0o000 to 0o777 like 0o644, not {mode!r}"
            )
        self._mode = -1 if mode is None else mode
        if info is not None:  # refuse what the record could not carry, now
            from .record import check_info

            check_info(info)
            if not record:
                raise ValueError("info is kept in the record: it needs record=True")
        self._info = info
        self._record = record
        self._allow_network_fs = allow_network_fs
        self._handle = -1
        self._key = (0, 0)
        self._writable = True
        # Passed to the C core as one pointer on every acquisition.
        self._lf = ffi.new("pl_lockfile *")
        self._lf.handle = -1
        self._lf.shared = shared
        if os.name != "nt":
            self._path_c = ffi.new("char[]", os.fsencode(self.path))
            self._lf.path = self._path_c
        self._head: Any = None  # keeps the C copy of the record's head alive
        self._record_warned = False
        # close() found another attempt using the object: an abandoned
        # wait's thread closes the descriptor when it gives the object back.
        self._close_pending = False
        # One attempt at a time uses this object: the C core keeps which
        # (pl_own), named by the id of an object the attempt keeps alive; the
        # holding attempt's object lives here.  Threads waiting for the object
        # sleep on the bell, rung (released) when the owner gives it back.
        self._attempt: object | None = None
        self._bell = _new_bell()
        # The owning thread's token or task: compared by identity, and kept
        # alive while held so that its identity cannot be reused.
        self._owner: object | None = None
        # Coroutines waiting for this object (not the file) to be free.
        self._object_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._object_waiters_mu = allocate_lock()
        _all_locks.add(self)

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
        # A record-less lock never writes, so it never asks for write access.
        flags = lib.PL_OPEN_CREATE | (0 if self._record else lib.PL_OPEN_READONLY)
        try:
            handle = self._open_file(flags, self._mode)
            self._writable = self._record
            self._lf.no_record_reason = 0
        except OSError as exc:
            # A file we may read but not write (another user's, on a read-only
            # filesystem, a running program: ETXTBSY) can still be locked; only
            # the record is lost.
            if not self._record or exc.errno not in _READ_ONLY_FALLBACK:
                raise
            try:
                handle = self._open_file(lib.PL_OPEN_READONLY)
            except OSError:
                raise exc from None
            self._writable = False
            # Reported (once) when the lock is taken, like a failed write, and
            # only if the file is one a record would have gone into.
            self._lf.no_record_reason = exc.errno
        lf = self._lf
        try:
            self._check_filesystem(handle)
            check(lib.pl_file_stat(handle, ffi.addressof(lf, "st")), self.path)
            if self.shared or not self._record:
                lf.head_len = 0  # shared holders would overwrite each other's record
                if self.shared:
                    lf.no_record_reason = 0
            else:
                # Also for a read-only descriptor: the C core decides under the
                # lock whether a record belongs in the file, then reports the
                # reason it cannot write one.
                from .._core.process import self_identity
                from .record import RecordTemplate

                template = RecordTemplate(self_identity(), self._info)
                self._head = ffi.new("char[]", template.head)
                lf.head, lf.head_len = self._head, len(template.head)
                lf.head_crc = template.head_crc
        except BaseException:
            lib.pl_close(handle)
            raise
        self._key = (lf.st.dev, lf.st.ino)
        lf.record_size = 0  # a new descriptor, maybe a new file: look at it afresh
        lf.handle = handle
        lf.holds = ffi.NULL if _observer is None else _observer.holds_of(self.path)
        self._handle = handle
        _open_locks.add(self)
        return handle

    def _open_file(self, flags: int, mode: int = -1) -> int:
        """A handle on the lock file (LockAt opens it in its directory)."""
        return open_lock_file(self.path, flags, mode)

    def _unlink_file(self) -> None:
        os.unlink(self.path)

    def _check_filesystem(self, handle: int) -> None:
        fs = ffi.new("pl_fs_info *")
        check(lib.pl_fs_stat(handle, fs), self.path)
        fs_name = ffi.string(fs.name).decode()
        pseudo = _fs.pseudo_filesystem(fs.magic, fs_name)
        if pseudo is not None:
            raise LockFileError(
                PSEUDO_FS,
                self.path,
                f"it is on {pseudo}, which holds kernel state, not files: put the lock "
                "file on a real filesystem (for example under /run or /tmp)",
            )
        if self._allow_network_fs:
            return
        name = _fs.network_filesystem(fs.magic, fs.remote, fs_name)
        if name is not None:
            raise UnsafeFilesystem(self.path, name)

    def _close_handle(self) -> None:
        # Forgotten before closed: a fork in between must not see a number
        # the C core has closed (the C core's own registry makes the fork
        # itself safe).
        handle, self._handle = self._handle, -1
        if handle >= 0:
            self._lf.handle = -1  # pl_disown must never unlock a reused number
            _open_locks.discard(self)
            lib.pl_close(handle)

    def close(self) -> None:
        """Release the lock if this object holds it, and close the lock file.

        While another attempt is using this object (a thread of the
        program's mid-acquire, or the kernel wait of an acquire_async whose
        task gave up and that nothing could interrupt), its descriptor stays
        open under it: an abandoned wait closes it when it ends.
        """
        if self.locked:
            self.release()
        self._close_if_unused()

    def _close_if_unused(self) -> None:
        closer = object()
        token = id(closer)
        lf = self._lf
        if lib.pl_own(lf, token, 0) != 0:
            # Closing the number under a wait would let its late unlock land
            # on the program's next file of that number.
            self._close_pending = True
            return
        ring = 1
        try:
            self._close_pending = False
            self._close_handle()
        finally:
            try:
                ring = _disown(lf, token, 0)
            finally:
                if ring:
                    _ring(self)

    def __del__(self) -> None:
        # Closing the descriptor is what drops the kernel lock.
        if self._handle >= 0:
            lib.pl_close(self._handle)

    # -- taking the lock -----------------------------------------------------
    #
    # Exceptions from signal handlers (KeyboardInterrupt, SystemExit from a
    # SIGTERM handler) are raised only after a call returns or at a jump
    # back, never inside a C call.  So an attempt names itself (a token)
    # before its try, and owns this object, takes and gives back the kernel
    # lock only in C calls that take the token: whatever lands wherever, its
    # except clause gives back exactly what it owns, in one C call (pl_disown
    # unlocks and frees the object), and rings the bell in a finally when
    # someone may wait.  An acquire returns holding the lock or raises
    # holding nothing, and never leaves the object owned by nobody.

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock, waiting in the kernel for the holder's release or death.

        timeout follows threading.Lock: None or -1 (or inf) waits forever,
        other negative numbers and NaN are errors.  Raises LockHeld when
        blocking is False and someone holds it, LockTimeout when timeout
        seconds pass, ReentrantAcquire when this thread already holds it.
        Returns True.
        """
        owner = _this_thread.token
        if self._owner is owner:
            raise ReentrantAcquire(
                f"{self.path}: this thread already holds this Lock; pylock locks are "
                "not reentrant (release it first, or use one Lock per thread)"
            )
        if timeout is None or timeout == -1:
            deadline = None
        elif not blocking:
            raise ValueError("a timeout makes no sense with blocking=False")
        else:
            deadline = deadline_of(timeout)
        attempt = object()
        token = id(attempt)
        lf = self._lf
        waited = [False]  # slept on the bell: may have taken a ring meant for others
        try:
            # The whole uncontended acquisition: own the object, lock, check
            # the path, record.
            rc = _acquire(lf, token)
            if rc:
                self._acquire_slow(rc, token, blocking, deadline, timeout, owner, waited)
            self._attempt = attempt
            self._owner = owner
        except BaseException:
            ring = 1
            try:
                ring = _disown(lf, token, 1)  # unlocks only what this attempt owns
            finally:
                if ring > 0 or waited[0]:
                    # _ring(self), inlined: a call is where a handler's
                    # exception could land before the bell rings.
                    try:
                        self._bell.release()
                    except RuntimeError:
                        pass  # rung already
                    finally:
                        if self._object_waiters:
                            self._wake_object_waiter()
            raise
        if _event_log is not None:
            _event_log.acquired(self)
        return True

    def _acquire_slow(
        self,
        rc: int,
        token: int,
        blocking: bool,
        deadline: float | None,
        timeout: float | None,
        owner: object,
        waited: list[bool],
    ) -> None:
        """Another attempt of this process owns the object, it is not open,
        the lock is held, the file moved, or the record failed (rc < 0)."""
        if rc == lib.PL_E_BUSY:
            if not blocking:
                self._raise_held(False, timeout)
            # Marked as waiting, so that the owner's release rings; owned
            # marked too, as others may still wait and need its ring.
            while lib.pl_own(self._lf, token, 1) != 0:
                waited[0] = True
                if not self._bell.acquire(True, _seconds_until(deadline)):
                    self._raise_held(True, timeout)
            rc = _acquire(self._lf, token)
        if rc == errno.EBADF:
            self._open()
            rc = _acquire(self._lf, token)
        contended = rc == errno.EWOULDBLOCK
        if _observer is not None and contended:
            _observer.conflicted(self)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if not blocking or passed(deadline):
                    self._raise_held(blocking, timeout)
                self._refuse_self_deadlock(owner)
                rc = self._wait(deadline, timeout)
            else:
                rc = self._retry_after(rc, token)
        if _observer is not None and contended:
            _observer.waited(self)
        if rc:
            self._warn_no_record(-rc)

    def _retry_after(self, rc: int, token: int) -> int:
        """The lock file was unlinked under us (the lock is already released):
        start again on the file now at the path.  Any other code is an error."""
        if rc != lib.PL_E_UNLINKED:
            fail(rc, self.path)
        self._close_handle()
        self._open()
        return int(_acquire(self._lf, token))

    def _wait(self, deadline: float | None, timeout: float | None) -> int:
        """Wait for the lock and claim it (pl_claim's code).  The C call is
        made right here, not through wait_blocking's closure: in a hand-over
        every frame between the kernel's grant and acquire() returning runs
        cold, a few microseconds each."""
        lf, waiter, claimed = self._lf, thread_waiter(), ffi.new("int *")
        rc = errno.EINTR
        while rc == errno.EINTR:  # the program's handlers ran: wait on
            rc = _wait_claim(lf, ns_left(deadline), waiter, claimed)
        if rc:
            self._wait_failed(rc, deadline, timeout)
        return int(claimed[0])

    def _wait_failed(self, rc: int, deadline: float | None, timeout: float | None) -> None:
        if rc == errno.ETIMEDOUT:
            self._raise_held(True, timeout)
        if rc == errno.ENOTSUP and deadline is not None:
            from .._core.wait import no_wake_signal

            raise no_wake_signal(f"{self.path}: acquire(timeout={timeout!r})")
        fail(rc, self.path)

    def _refuse_self_deadlock(self, owner: object) -> None:
        # Through the set's weak references, owner first: among 64 Lock
        # objects, the WeakSet's own iterator cost a contended wait 25 µs.
        key = self._key
        for ref in list(_open_locks.data):  # type: ignore[attr-defined]  # its weakrefs
            other = ref()
            if other is None or other._owner is not owner or other is self:
                continue
            if other._key == key:
                raise ReentrantAcquire(
                    f"{self.path}: this {'thread' if owner.__class__ is object else 'task'} "
                    "already holds this lock through another Lock object; waiting would "
                    "deadlock (pylock locks are not reentrant)"
                )

    def _raise_held(self, blocking: bool, timeout: float | None) -> None:
        if _observer is not None:
            _observer.gave_up(self)
        from .lookup import find_holder

        # Naming the holder is best-effort: it never replaces the answer
        # (out of descriptors, an unreadable /proc: the holder is unknown).
        try:
            holder = find_holder(self.path, known_held=True)
        except (OSError, LockError):
            holder = None
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

    # -- asyncio (in _lock_async, loaded on first use) -------------------------

    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take the lock from a coroutine without blocking the event loop.

        While the lock is held elsewhere, a pylock thread waits in the kernel
        and hands over to the loop when the holder releases or dies.
        Cancelling the task (or the timeout) never blocks the loop and leaves
        nothing behind, never the lock.
        """
        # A caller that took this method before the first acquisition
        # (acquire = lock.acquire_async) keeps calling it: through a global,
        # not an import statement, it costs one coroutine more, 0.3 µs.
        return await _acquire_async(self, timeout)

    def _wake_object_waiter(self) -> None:
        from .lock_async import wake_object_waiter

        wake_object_waiter(self)

    # -- releasing ---------------------------------------------------------

    def release(self, unlink: bool = False) -> None:
        """Release the lock.

        unlink=True also removes the lock file, safely: it is unlinked while
        still held, and every acquirer re-checks after locking that its file
        is still linked, so waiters are never split across two inodes.
        """
        attempt = self._attempt
        if self._owner is None or attempt is None:
            raise NotHeld(f"{self.path}: release() of a lock this Lock object does not hold")
        if _event_log is not None:
            _event_log.released(self)
        if unlink:
            self._unlink_while_holding()
        token = id(attempt)
        self._owner = None
        self._attempt = None
        ring = 1
        try:
            if unlink:
                _release(self._lf)  # files the hold (metrics), unlocks
                self._close_handle()
        finally:
            try:
                ring = _disown(self._lf, token, 1)  # unlocks (if still open), frees
            finally:
                if ring:  # _ring(self), inlined as in acquire
                    try:
                        self._bell.release()
                    except RuntimeError:
                        pass
                    finally:
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
            handle = self._open_file(lib.PL_OPEN_READONLY)
        except OSError:
            return  # gone already, or no longer a plain file: not ours to remove
        try:
            st = ffi.new("pl_file_info *")
            ours = lib.pl_file_stat(handle, st) == 0 and (st.dev, st.ino) == self._key
        finally:
            lib.pl_close(handle)
        if ours:
            self._unlink_file()

    # -- diagnostics ------------------------------------------------------

    def holder(self) -> Holder | None:
        """The process holding this lock now (maybe this one), or None when free."""
        from .lookup import find_holder

        return find_holder(self.path)

    @property
    def stats(self) -> LockStats:
        """This lock's counters in this process (all zero unless pylock.metrics is enabled)."""
        from ..metrics import stats_of

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

    def fileno(self) -> int:
        """The descriptor of the lock file, kept open between acquisitions (-1
        while closed: before the first acquisition, after close(), in a
        forked child).  It is pylock's: closing, locking or unlocking it
        breaks the lock; pass it on only to keep the lock held in a child."""
        return self._handle


_disown = lib.pl_disown


async def _load_acquire_async(lock: Lock, timeout: float | None) -> bool:
    """Loads _lock_async, which then replaces this function and the method."""
    from .lock_async import acquire_async

    return await acquire_async(lock, timeout)


_acquire_async = _load_acquire_async


def _new_bell() -> Any:
    bell = allocate_lock()
    bell.acquire()  # locked: silent until rung
    return bell


def _ring(lock: Ringable) -> None:
    """Wake a thread and a coroutine waiting for this Lock object (each
    retries pl_own; a wake-up too many costs one retry).  Where a signal
    handler's exception may land (the program's threads), it is inlined."""
    try:
        lock._bell.release()
    except RuntimeError:
        pass  # rung already, and not yet heard
    finally:
        if lock._object_waiters:
            lock._wake_object_waiter()


def _seconds_until(deadline: float | None) -> float:
    """threading.Lock.acquire's timeout for the time left (-1: forever)."""
    left = seconds_left(deadline)
    return -1 if left is None else min(left, _TIMEOUT_MAX)


def _after_fork_in_child() -> None:
    # The C core has closed every lock file in the child (it shares the
    # parent's open file descriptions: unlocking would release the parent's
    # lock, keeping them would keep it alive after the parent dies).  Forget
    # everything the parent held; close nothing here: the numbers are free.
    for lock in list(_all_locks):
        lock._handle = -1
        lock._lf.handle = -1
        lock._lf.owner = 0  # the child has one thread: nobody owns anything
        lock._owner = None
        lock._attempt = None
        lock._bell = _new_bell()
        lock._object_waiters = []
        lock._object_waiters_mu = allocate_lock()
        lock._close_pending = False
    _open_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
