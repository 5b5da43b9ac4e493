"""SoftFileLock: filelock's existence lock.  Whoever creates the marker
file holds the lock; a marker that exists, whoever made it, counts as held.

The marker says who made it ("pid\\nhost\\n", filelock's own form, so each
side names the other's holder), but pylock never takes a marker away on
that word: a pid may be reused, a host may be another machine, and a
marker left by a holder that died stays until someone removes it (a
Timeout names it and says so).  FileLock has none of this: the kernel
drops its lock with its holder.

An existence has no kernel wake-up that works on the network filesystems
soft locks are for, so a wait looks again every poll_interval; a release
in this process wakes its waiters at once (_bell).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from threading import local
from typing import Callable, NamedTuple

from .._lock.record import hostname
from ._api import BaseFileLock
from ._bell import BELL
from ._errors import Timeout, deadlock
from ._options import UNSET_MODE, Wait

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._lock.holder import Holder

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_CREATE |= getattr(os, "O_NOFOLLOW", 0)
_LOOK = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_LOOK |= getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in must not block the look
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
# Where the directory can be held open, the marker is created and removed
# relative to it: a chdir or a renamed directory cannot move it.
_BY_DIRECTORY = {os.open, os.stat, os.unlink} <= os.supports_dir_fd
_MIN_LOOK = 0.001


class Marker(NamedTuple):
    """A marker this process created: its directory, name and identity."""

    dir_fd: int  # -1: name is an absolute path
    fd: int  # kept open while held: its inode cannot be reused by another file meanwhile
    name: str
    dev: int
    ino: int
    pid: int


class _ThreadOwner(local):
    def __init__(self) -> None:
        self.token = object()


_this_thread = _ThreadOwner()
# The markers of this process, by identity, with the thread (or task) that
# holds each: a wait for one's own marker without a limit could never end.
_held_here: dict[tuple[int, int], object] = {}


class SoftFileLock(BaseFileLock):
    """filelock's SoftFileLock: held while the marker file at lock_file
    exists; reentrant, per thread by default, like FileLock."""

    _live: set[Marker] | None = None

    def _check_backend_options(
        self, lifetime: float | None, preserve_lock_file: bool, on_acquired: object
    ) -> None:
        name = type(self).__name__
        if lifetime is not None:
            raise NotImplementedError(
                f"{name}(lifetime=...) is not supported by pylock.filelock: expiry by age "
                "takes the marker from a holder that may still be running; use FileLock, "
                "whose lock the kernel drops when its holder dies"
            )
        if preserve_lock_file:
            raise ValueError(f"{name} releases by removing its marker: preserve_lock_file=True")
        if on_acquired is not None:
            raise ValueError(f"{name} has no lock descriptor to lend: on_acquired is refused")

    def _owner(self) -> object:
        return _this_thread.token

    def _take(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
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
                seen = BELL.wait(seen, step)
        finally:
            where.close()
            if seen is not None:
                BELL.stop()

    def _directory(self) -> Directory:
        """Where this acquisition looks, fixed for all of its attempts (a
        chdir meanwhile moves nothing); makes missing directories, as filelock."""
        if "\0" in self._lock_file:
            raise ValueError(f"embedded null byte in the lock file's path {self._lock_file!r}")
        return Directory(self._lock_file)

    def _step(
        self,
        where: Directory,
        owner: object,
        wait: Wait,
        deadline: float | None,
        cancel_check: Callable[[], bool] | None,
    ) -> Marker | float:
        """One attempt: the marker created, or how long to sleep before the next."""
        marker, existing = where.create(self._mode)
        if marker is not None:
            _held_here[marker.dev, marker.ino] = owner
            with self._mu:
                if self._live is None:
                    self._live = set()
                self._live.add(marker)
            if self._relative:
                self._pin(where.path)
            return marker
        if existing is not None and _held_here.get(existing) is owner and wait.forever:
            raise deadlock(self._lock_file, type(self).__name__, self._scope)
        left = None if deadline is None else deadline - time.monotonic()
        stop = not wait.blocking or (left is not None and left <= 0)
        if stop or (cancel_check is not None and cancel_check()):
            raise Timeout(self._lock_file, _marker_holder(where.path))
        step = max(wait.poll_interval, _MIN_LOOK)
        return step if left is None else min(step, left)

    def _give_back(self, held: object) -> None:
        assert isinstance(held, Marker)
        with self._mu:
            if self._live is not None:
                self._live.discard(held)
        _remove(held, self._lock_file)
        if self._relative:
            self._unpin()
        BELL.ring()

    def holder(self) -> Holder | None:
        """The process the marker names (not verified: a marker proves
        nothing), or None when there is no marker."""
        return _marker_holder(self._pinned or self._lock_file)

    async def _pylock_holder_exit(self, timeout: float | None) -> None:
        raise ValueError(self._no_exit_watch())

    def _pylock_wait_exit(self, timeout: float | None) -> bool:
        raise ValueError(self._no_exit_watch())

    def _no_exit_watch(self) -> str:
        return (
            f"{self._lock_file}: a {type(self).__name__}'s holder is named only by its marker, "
            "which proves nothing (pids are reused, hosts differ), so pylock cannot watch it "
            "exit; FileLock's holder is the kernel's and can be watched"
        )

    def __del__(self) -> None:
        # A marker of a dropped object would stay forever: remove it, as
        # filelock does (never in a forked child: the parent holds it).
        for marker in list(self._live or ()):
            if marker.pid == os.getpid():
                _remove(marker, self._lock_file)


def _at(dir_fd: int) -> dict[str, int]:
    return {"dir_fd": dir_fd} if dir_fd >= 0 else {}


class Directory:
    """The directory an acquisition creates its marker in, held open where
    a descriptor can stand for it (else the marker's absolute path), and
    made when missing, as filelock does."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path) if path else path
        parent, self.name = os.path.split(path)
        self.fd = -1
        if not _BY_DIRECTORY:
            if parent:
                os.makedirs(parent, exist_ok=True)
            self.name = self.path
            return
        try:
            self.fd = os.open(parent or os.curdir, _DIRECTORY)
        except FileNotFoundError:
            if not parent:
                raise
            os.makedirs(parent, exist_ok=True)
            self.fd = os.open(parent, _DIRECTORY)

    def create(self, mode: int) -> tuple[Marker | None, tuple[int, int] | None]:
        """Create the marker: (it, None), or (None, the identity of the one
        that exists; None when it vanished meanwhile).  The marker takes the
        directory's descriptor with it."""
        at = _at(self.fd)
        try:
            fd = os.open(self.name, _CREATE, 0o666 if mode == UNSET_MODE else mode, **at)
        except FileExistsError:
            return None, _existing(self.path, self.name, self.fd)
        try:
            st = _write_marker(fd, mode)
        except BaseException:
            os.unlink(self.name, **at)  # just created: ours
            os.close(fd)
            raise
        marker = Marker(self.fd, fd, self.name, st.st_dev, st.st_ino, os.getpid())
        self.fd = -1
        return marker, None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _write_marker(fd: int, mode: int) -> os.stat_result:
    """Fill a new marker with filelock's "pid\\nhost\\n"."""
    if mode != UNSET_MODE and hasattr(os, "fchmod"):
        os.fchmod(fd, mode)  # the umask does not narrow a mode asked for
    os.write(fd, f"{os.getpid()}\n{hostname()}\n".encode())
    return os.fstat(fd)


def _existing(path: str, name: str, dir_fd: int) -> tuple[int, int] | None:
    """The identity of the marker that exists; a directory, a link or a
    special file there is an error no wait can cure."""
    try:
        st = os.stat(name, follow_symlinks=False, **_at(dir_fd))
    except FileNotFoundError:
        return None  # released meanwhile: look again
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory (name a file inside it)", path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(
            22,
            "Not a regular file: a link or special file is never used as a marker; remove it",
            path,
        )
    return st.st_dev, st.st_ino


def _remove(marker: Marker, path: str) -> None:
    """Remove our marker, only if the name still is ours: compared by
    identity while our descriptor keeps its inode from being reused."""
    _held_here.pop((marker.dev, marker.ino), None)
    at = _at(marker.dir_fd)
    try:
        st = os.stat(marker.name, follow_symlinks=False, **at)
        if (st.st_dev, st.st_ino) == (marker.dev, marker.ino):
            os.unlink(marker.name, **at)
        else:
            logging.getLogger("pylock").warning(
                "pylock: %s no longer names the marker this process created (another "
                "process replaced it); its file was left alone",
                path,
            )
    except FileNotFoundError:
        pass  # removed by someone else: nothing of ours is left
    finally:
        os.close(marker.fd)
        if marker.dir_fd >= 0:
            os.close(marker.dir_fd)


def _marker_holder(path: str) -> Holder | None:
    from .._lock.holder import Holder

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(path, _LOOK)
    except OSError:
        return None
    try:
        seen = os.fstat(fd)
        if (seen.st_dev, seen.st_ino) != (st.st_dev, st.st_ino):
            return None
        text = os.read(fd, 512).decode("utf-8", "replace")
    finally:
        os.close(fd)
    lines = text.split("\n")
    unverified = "named by its marker, not verified"
    if not lines[0].strip().isdigit():
        return Holder(pid=0, note=f"a marker that names no process; {unverified}")
    host = lines[1].strip() if len(lines) > 1 else ""
    return Holder(pid=int(lines[0]), hostname=host, note=unverified)
