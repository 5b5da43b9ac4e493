"""The lock file a Lock keeps open between acquisitions, and who observes lock files.

A Lock opens its file on first use (read-only where it may not be
written), refuses it where no lock can be promised (pseudo and network
filesystems), and closes it only when no attempt uses the object.  Every
open lock file is known here, so that an observer (pylock.metrics, through
set_observer, the one registration point) can be pointed at them all.
"""

from __future__ import annotations

import errno
import os
from _weakrefset import WeakSet  # what weakref.WeakSet is, without weakref's import cost

from .._core.errors import LockError, LockFileError
from .._core.fs import refuse_unfit_filesystem
from .._core.native import check, fail, ffi, lib, open_lock_file
from . import by_file
from .errors import ReentrantAcquire
from .ownership import Owned

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    from typing import Any, Protocol

    from .protocol import LockStats

    class LockObserver(Protocol):
        """What the observer set_observer installs is told (pylock.metrics is one).
        Holds are timed by the C core, into the pl_hold_stats of holds_of."""

        def holds_of(self, path: str) -> Any:
            """The pl_hold_stats a lock file on path, newly opened, times its holds into."""

        def conflicted(self, lock: LockFile) -> None:
            """An attempt found the lock held (it waits, or gives up at once)."""

        def waited(self, lock: LockFile) -> None:
            """An attempt that found the lock held has taken it."""

        def gave_up(self, lock: LockFile) -> None:
            """An attempt ends without the lock: LockHeld or LockTimeout."""

        def acquired(self, lock: LockFile) -> None:
            """With log_events: every acquisition."""

        def released(self, lock: LockFile) -> None:
            """With log_events: every release."""

        def stats_of(self, path: str) -> LockStats:
            """Lock.stats of a lock on path."""


# Every lock file open in this process: a forked child forgets them (the C
# core has closed their descriptors), and an observer is pointed at each.
_open_locks: WeakSet[LockFile] = WeakSet()
# The record head of all Lock objects without info, by process (a child makes its own).
_plain_heads: dict[Any, tuple[Any, int, int]] = {}


# Told of conflicts, waits and newly opened lock files (None: nobody).
observer: LockObserver | None = None
# Told of every acquisition and release (None: nobody, and each costs one check).
event_log: LockObserver | None = None
# What answers Lock.stats: the last observer set (stopping keeps its counters).
stats_source: LockObserver | None = None


def _opened(lock: LockFile) -> None:
    _open_locks.add(lock)
    by_file.add(lock)


def _closed(lock: LockFile) -> None:
    _open_locks.discard(lock)
    by_file.discard(lock)


def set_observer(new: LockObserver | None, *, log_events: bool = False) -> None:
    """Make new the observer of every lock file of this process from now on
    (None: nobody).  log_events: tell it of every acquisition and release too.
    A hold that began before is not timed."""
    global observer, event_log, stats_source
    # Set before the lock files are pointed at their stats: one opened
    # meanwhile is pointed by _open.
    observer = new
    event_log = new if log_events else None
    if new is not None:
        stats_source = new
    for lock in list(_open_locks):
        if new is None:
            lock._lf.holds = ffi.NULL
            lock._holds = None
        else:
            lock._lf.held_since = 0
            lock._holds = lock._lf.holds = new.holds_of(lock.path)


def current_observer() -> LockObserver | None:
    return observer


def open_lock_paths() -> set[str]:
    """The paths of the lock files open in this process (an observer may
    forget the others' counters)."""
    return {lock.path for lock in list(_open_locks)}


def timed_holds(path: str) -> int:
    """How many lock objects of this process hold the lock on path in a hold
    the C core is timing."""
    return sum(
        1
        for lock in list(_open_locks)
        if lock.path == path and lock._lf.held_since != 0 and lock._owner is not None
    )


def file_key(lock: LockFile) -> tuple[int, int]:
    """(device, inode) of the file lock has (or last had) open: (0, 0) before its first."""
    return lock._key


# Why a file could not be opened for writing though it may still be locked
# read-only: another user's file, a read-only filesystem, a running program.
_READ_ONLY_FALLBACK = (errno.EACCES, errno.EROFS, errno.EPERM, errno.ETXTBSY)


class LockFile(Owned):
    """A lock object's file: its path, its descriptor (kept open between
    acquisitions) and its record.  The arguments are Lock's."""

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
        # Resolved now: a later chdir must not move the lock.
        self.path: str = _absolute_path(path)
        self.shared = shared
        self._mode = _permission_bits(mode)
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
        super().__init__()
        # Passed to the C core as one pointer on every acquisition.
        self._lf.shared = shared
        if os.name != "nt":
            self._path_c = ffi.new("char[]", os.fsencode(self.path))
            self._lf.path = self._path_c
        self._head: Any = None  # keeps the C copy of the record's head alive
        self._holds: Any = None  # keeps the pl_hold_stats the C core times into alive
        self._record_warned = False
        # close() found another attempt using the object: an abandoned
        # wait's thread closes the descriptor when it gives the object back.
        self._close_pending = False

    def fileno(self) -> int:
        """The descriptor of the lock file (a HANDLE on Windows), kept open
        between acquisitions (-1 while closed: before the first acquisition,
        after close(), in a forked child).  It is pylock's: closing, locking or unlocking it
        breaks the lock; pass it on only to keep the lock held in a child."""
        return self._handle

    # -- opening -------------------------------------------------------------

    def _open(self) -> int:
        handle = self._open_descriptor()
        lf = self._lf
        try:
            refuse_unfit_filesystem(
                handle, self.path, network=not self._allow_network_fs, strict=True
            )
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

                me = self_identity()
                head = _plain_heads.get(me) if self._info is None else None
                if head is None:
                    template = RecordTemplate(me, self._info)
                    head = (ffi.new("char[]", template.head), len(template.head), template.head_crc)
                    if self._info is None:  # one copy for all of them, kept: it is read-only
                        _plain_heads.clear()  # another process's after a fork
                        _plain_heads[me] = head
                self._head = head[0]
                lf.head, lf.head_len, lf.head_crc = head
        except BaseException:
            lib.pl_close(handle)
            raise
        self._key = (lf.st.dev, lf.st.ino)
        lf.record_size = 0  # a new descriptor, maybe a new file: look at it afresh
        lf.handle = handle
        # Kept alive by this object too: the observer may forget a path's
        # counters (a lock being opened is not yet one it sees open).
        self._holds = ffi.NULL if observer is None else observer.holds_of(self.path)
        lf.holds = self._holds
        self._handle = handle
        _opened(self)
        return handle

    def _open_descriptor(self) -> int:
        # A record-less lock never writes, so it never asks for write access.
        flags = lib.PL_OPEN_CREATE | (0 if self._record else lib.PL_OPEN_READONLY)
        try:
            handle = self._open_file(flags, self._mode)
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
            return handle
        self._writable = self._record
        self._lf.no_record_reason = 0
        return handle

    def _open_file(self, flags: int, mode: int = -1) -> int:
        """A handle on the lock file (LockAt opens it in its directory)."""
        return open_lock_file(self.path, flags, mode)

    def _unlink_file(self) -> None:
        os.unlink(self.path)

    def _retry_after(self, rc: int, token: int) -> int:
        """The lock file was unlinked under us (the lock is already released):
        start again on the file now at the path.  Any other code is an error."""
        if rc != lib.PL_E_UNLINKED:
            fail(rc, self.path)
        self._close_handle()
        self._open()
        return int(lib.pl_acquire(self._lf, token))

    # -- closing -------------------------------------------------------------

    def _close_handle(self) -> None:
        # Forgotten before closed: a fork in between must not see a number
        # the C core has closed (the C core's own registry makes the fork
        # itself safe).
        handle, self._handle = self._handle, -1
        if handle >= 0:
            self._lf.handle = -1  # pl_disown must never unlock a reused number
            _closed(self)
            lib.pl_close(handle)

    def close(self) -> None:
        """Release the lock if this object holds it, and close the lock file.

        While another attempt is using this object (a thread of the
        program's mid-acquire, or the kernel wait of an acquire_async whose
        task gave up and that nothing could interrupt), its descriptor stays
        open under it: an abandoned wait closes it when it ends.
        """
        if self._owner is not None:
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
                ring = lib.pl_disown(lf, token, 0)
            finally:
                if ring:
                    self._ring()

    def __del__(self) -> None:
        # Closing the descriptor is what drops the kernel lock.
        if self._handle >= 0:
            lib.pl_close(self._handle)

    def _after_fork(self) -> None:
        # The C core has closed every lock file in the child (it shares the
        # parent's open file descriptions: unlocking would release the
        # parent's lock, keeping them would keep it alive after the parent
        # dies).  Forget the descriptor; close nothing: the number is free.
        super()._after_fork()
        self._handle = -1
        self._lf.handle = -1
        self._close_pending = False
        _closed(self)

    # -- what the acquisitions check -------------------------------------------

    def _reentered(self, who: str) -> ReentrantAcquire:
        return ReentrantAcquire(
            f"{self.path}: this {who} already holds this Lock; pylock locks are "
            f"not reentrant (release it first, or use one Lock per {who})"
        )

    def _refuse_self_deadlock(self, owner: object) -> None:
        # Only the lock objects on this file (bench/README.md: walking all
        # of them cost 25 µs per wait with 64 open, seconds with thousands).
        for other in by_file.open_on(self._key):
            if other._owner is owner and other is not self:
                raise ReentrantAcquire(
                    f"{self.path}: this {'thread' if owner.__class__ is object else 'task'} "
                    "already holds this lock through another Lock object; waiting would "
                    "deadlock (pylock locks are not reentrant)"
                )

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


def _absolute_path(path: str | os.PathLike[str]) -> str:
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if not raw:
        raise LockFileError(errno.ENOENT, raw, "the path is empty: name a lock file")
    if raw.endswith(("/", os.sep)):
        raise LockFileError(errno.EISDIR, raw, "a trailing separator names a directory")
    return os.path.abspath(raw)


def _permission_bits(mode: int | None) -> int:
    """The lock file's mode when pylock creates it (-1: the default)."""
    if mode is None:
        return -1
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError(
            f"mode must be permission bits from 0o000 to 0o777 like 0o644, not {mode!r}"
        )
    return mode
