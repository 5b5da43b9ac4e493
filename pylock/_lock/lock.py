"""Lock: an OS lock on a file, with a record of who holds it."""

from __future__ import annotations

import errno
import sys as _sys

from .._core.errors import LockError
from .._core.native import fail, ffi, lib
from .._core.timeout import deadline_of, ns_left
from .._core.wait import passed, thread_waiter
from . import lockfile as _files
from .errors import LockHeld, LockTimeout, NotHeld
from .lock_async import AsyncAcquire
from .ownership import this_thread

# `import pylock` must cost little more than the interpreter's own start
# (services import it at start, operators run `pylock run` in shell loops):
# typing, logging, threading, contextlib, asyncio, the holder lookup and the
# process identity are loaded where they are first used, not here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from .holder import Holder
    from .protocol import LockStats


_acquire = lib.pl_acquire
_release = lib.pl_release
_disown = lib.pl_disown
_wait_claim = lib.pl_lock_wait_claim


class Lock(AsyncAcquire):
    """An inter-process lock on path that knows who holds it.

    The kernel's lock (flock, LockFileEx) is the only truth: it is dropped
    when the holder dies, even by SIGKILL.  After taking it, an exclusive
    holder writes a best-effort record (pid, start identity, host, program,
    time, info) that holder() and the errors use to explain, but only into a
    file that is empty or already holds a pylock record: any other file is
    locked and left untouched.  record=False never writes (nor opens the file
    for writing): for files that are not pylock's.  Locks are not reentrant;
    two Lock objects exclude each other in one process as in two.

    Lock(path, *, shared=False, mode=None, info=None, allow_network_fs=False,
    record=True) (its constructor is LockFile's): mode is a new file's
    permission bits, info a dict kept in the record, allow_network_fs lifts
    the refusal of network filesystems.
    """

    def __repr__(self) -> str:
        state = "locked" if self.locked else "unlocked"
        kind = "shared" if self.shared else "exclusive"
        return f"<pylock.Lock {self.path!r} {kind} {state}>"

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._owner is not None

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
        owner = this_thread.token
        if self._owner is owner:
            raise self._reentered("thread")
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
                    # self._ring(), inlined: a call is where a handler's
                    # exception could land before the bell rings.
                    try:
                        self._bell.release()
                    except RuntimeError:
                        pass  # rung already
                    finally:
                        if self._object_waiters:
                            self._wake_object_waiter()
            raise
        if _files.event_log is not None:
            _files.event_log.acquired(self)
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
            self._take_object(token, blocking, deadline, timeout, waited)
            rc = _acquire(self._lf, token)
        if rc == errno.EBADF:
            self._open()
            rc = _acquire(self._lf, token)
        contended = rc == errno.EWOULDBLOCK
        if _files.observer is not None and contended:
            _files.observer.conflicted(self)
        while rc > 0:  # < 0: held, but the record could not be written
            if rc == errno.EWOULDBLOCK:
                if not blocking or passed(deadline):
                    self._raise_held(blocking, timeout)
                self._refuse_self_deadlock(owner)
                rc = self._wait(deadline, timeout)
            else:
                rc = self._retry_after(rc, token)
        if _files.observer is not None and contended:
            _files.observer.waited(self)
        if rc:
            self._warn_no_record(-rc)

    def _wait(self, deadline: float | None, timeout: float | None) -> int:
        """Wait for the lock and claim it (pl_claim's code).  The C call is
        made right here, not through wait_blocking's closure: in a hand-over
        every frame between the kernel's grant and acquire() returning runs
        cold (bench/README.md)."""
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

    def _raise_held(self, blocking: bool, timeout: float | None) -> NoReturn:
        if _files.observer is not None:
            _files.observer.gave_up(self)
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
        if _files.event_log is not None:
            _files.event_log.released(self)
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
                if ring:  # self._ring(), inlined as in acquire
                    try:
                        self._bell.release()
                    except RuntimeError:
                        pass
                    finally:
                        if self._object_waiters:
                            self._wake_object_waiter()

    # What async with calls on exit: release itself, with nothing to await.
    _release_in_task = release

    # On the class: at interpreter exit a module's globals may be gone first.
    _finalizing = staticmethod(_sys.is_finalizing)

    def __del__(self) -> None:
        # A held Lock dropped (a singleton() result not kept) releases the
        # lock with its descriptor: said, as an unclosed file says it.  Not at
        # interpreter exit, where a lock held to the end is what was meant;
        # a forked child has forgotten its parent's locks (no owner).
        # (getattr: an object whose __init__ refused its arguments has no owner.)
        if getattr(self, "_owner", None) is not None and not self._finalizing():
            import warnings

            from .._core.display import display

            warnings.warn(
                f"pylock: Lock {display(self.path)} was collected while held, which "
                "released the lock; keep a reference to it for as long as it must "
                "be held (release() or close() it when done)",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
        super().__del__()

    # -- diagnostics ------------------------------------------------------

    def holder(self) -> Holder | None:
        """The process holding this lock now (maybe this one), or None when free."""
        from .lookup import find_holder

        return find_holder(self.path)

    @property
    def stats(self) -> LockStats:
        """This lock's counters in this process (all zero unless pylock.metrics is enabled)."""
        source = _files.stats_source
        if source is None:
            from .protocol import LockStats

            return LockStats(self.path)
        return source.stats_of(self.path)
