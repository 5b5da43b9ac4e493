"""Record-less locks for the pylock command: descriptors, directories, devices.

flock(1) locks whatever it can open, and a descriptor the shell passed in.
pylock writes nothing into those (a directory has no content, a device or a
script is not ours): it opens them read-only, locks the descriptor with the
C core's kernel wait, and names a holder from the kernel alone (fdinfo).
"""

from __future__ import annotations

import errno
import os
import time

from .._core.errors import SYMLINK, LockFileError, advice_for
from .._core.native import ffi, lib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._lock.holder import Holder

_FOREVER_NS = 2**62


class Conflict(Exception):
    """The lock is held elsewhere (no wait, or the wait timed out)."""

    def __init__(self, timed_out: bool) -> None:
        super().__init__("timed out" if timed_out else "held")
        self.timed_out = timed_out


def open_existing(path: str) -> int:
    """A read-only descriptor on path (a directory, device or file), never through a symlink.

    O_NONBLOCK keeps a FIFO from hanging the open; it is cleared at once,
    because the command shares this open file description.
    """
    flags = os.O_RDONLY | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path.rstrip("/") or "/"):
            raise LockFileError(SYMLINK, path, advice_for(SYMLINK)) from None
        raise
    os.set_blocking(fd, True)
    return fd


def lock_descriptor(fd: int, shared: bool, blocking: bool, timeout: float | None) -> None:
    """flock(fd) as flock(1) does it; raises Conflict, or OSError for a bad descriptor."""
    rc = lib.pl_try_lock(fd, shared)
    if rc == 0:
        return
    if rc != errno.EWOULDBLOCK:
        raise OSError(rc, os.strerror(rc))
    if not blocking:
        raise Conflict(timed_out=False)
    deadline = None if timeout is None else time.monotonic() + timeout
    waiter = lib.pl_waiter_new()
    if waiter == ffi.NULL:
        raise MemoryError
    try:
        while True:
            left = -1
            if deadline is not None:
                left = max(0, int((deadline - time.monotonic()) * 1e9))
                left = -1 if left >= _FOREVER_NS else left
            rc = lib.pl_lock_wait(fd, shared, left, waiter)
            if rc == 0:
                return
            if rc == errno.ETIMEDOUT:
                raise Conflict(timed_out=True)
            if rc != errno.EINTR:
                raise OSError(rc, os.strerror(rc))
            # EINTR: back in Python the signal handlers ran (Ctrl-C raises
            # KeyboardInterrupt here); otherwise wait for the time left.
    finally:
        lib.pl_waiter_free(waiter)


def unlock_descriptor(fd: int) -> None:
    rc = lib.pl_unlock(fd)
    if rc:
        raise OSError(rc, os.strerror(rc))


def kernel_holders(fd: int) -> list[Holder]:
    """The other processes the kernel shows holding a flock on fd's file, one
    per lock, as `pylock who` names them (/proc/locks, verified by fdinfo
    where this user may look)."""
    from .._core.procfs import lock_key
    from .._lock.kernel_view import kernel_holders as holders_of_key

    key = lock_key(fd, os.fstat(fd))
    return [h for h in holders_of_key(key, every=False) if h.pid != os.getpid()]


def describe_descriptor(fd: int) -> str:
    """What fd names, for messages: its path when /proc shows it."""
    from .._core.display import display
    from .._core.procfs import fd_path

    path = fd_path(fd)
    return f"descriptor {fd}" if path is None else f"descriptor {fd} ({display(path)})"
