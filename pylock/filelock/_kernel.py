"""FileLock: filelock's lock on a pylock.Lock, so every wait is the
kernel's (woken by the holder's release or death), Timeout names the
holder, and holder() and pylock.holder_exit() work on it."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import Callable

from .._core.errors import LockFileError
from .._lock.errors import LockHeld, LockTimeout, ReentrantAcquire
from .._lock.lock import Lock
from ._api import BaseFileLock
from ._bell import BELL
from ._errors import Timeout, as_os_error, deadlock
from ._options import UNSET_MODE, Wait

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._lock.holder import Holder

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_CREATE |= getattr(os, "O_NOFOLLOW", 0)
# The shortest wait between two cancel_check calls (poll_interval=0 would spin).
MIN_SLICE = 0.001


class FileLock(BaseFileLock):
    """A reentrant inter-process lock on lock_file, as filelock's FileLock,
    held by pylock (flock on Linux and macOS, LockFileEx on Windows)."""

    _pylock: Lock | None = None

    def _check_backend_options(
        self, lifetime: float | None, preserve_lock_file: bool, on_acquired: object
    ) -> None:
        if lifetime is not None:
            warnings.warn(
                f"lifetime is ignored for {type(self).__name__}: the kernel drops its lock "
                "when the holder dies, so it never goes stale",
                stacklevel=4,
            )
        if on_acquired is not None:
            raise NotImplementedError(
                f"{type(self).__name__}(on_acquired=...) is not supported by pylock.filelock: "
                "pylock lends nobody its lock descriptor (closing or unlocking it would drop "
                "the lock under the holder); do that work after acquire() returns"
            )

    def __del__(self) -> None:
        # filelock gives back a lock dropped while held, without a word; the
        # pylock.Lock underneath would otherwise warn of a dropped hold.
        lock = self._pylock
        if lock is not None and lock.locked:
            with contextlib.suppress(Exception):  # nothing may escape a finalizer
                lock.release()

    # -- the pylock.Lock underneath ----------------------------------------

    def _lock_now(self) -> Lock:
        """The pylock.Lock for the lock file: a relative path is resolved
        against the working directory of each first acquisition."""
        lock = self._pylock
        if lock is not None and (
            not self._relative or lock.path == os.path.abspath(self._lock_file)
        ):
            return lock
        with self._mu:
            return self._new_lock()

    def _new_lock(self) -> Lock:
        path = self._lock_file
        if "\0" in path:
            raise ValueError(f"embedded null byte in the lock file's path {path!r}")
        _create_as_filelock_does(path, self._mode)
        try:
            lock = Lock(path, mode=None if self._mode == UNSET_MODE else self._mode)
        except LockFileError as error:
            raise as_os_error(error) from None
        self._pylock = lock
        return lock

    # -- taking it -----------------------------------------------------------

    def _take(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        lock = self._lock_now()
        try:
            try:
                if wait.blocking and cancel_check is None:  # one wait in the kernel
                    lock.acquire(timeout=None if wait.forever else wait.timeout)
                else:
                    _attempt(lock, wait, deadline_of(wait), cancel_check)
            except ReentrantAcquire:  # raised before any wait: the deadline is still whole
                if wait.forever:
                    raise deadlock(self._lock_file, type(self).__name__, self._scope) from None
                _outwait_self(lock, wait, deadline_of(wait), cancel_check)
        except LockHeld as held:
            raise Timeout(self._lock_file, held.holder) from None
        except LockFileError as error:
            raise as_os_error(error) from None
        if self._relative:
            self._pin(lock.path)
        return lock

    def _give_back(self, held: object) -> None:
        held.release()  # type: ignore[attr-defined]  # the pylock.Lock _take returned
        if self._relative:
            self._unpin()
        if BELL.listeners:
            BELL.ring()

    # -- who holds it ------------------------------------------------------

    def _lock_to_look_at(self) -> Lock:
        lock = self._pylock
        if lock is not None and (
            not self._relative or lock.path == os.path.abspath(self._lock_file)
        ):
            return lock
        try:
            return Lock(self._lock_file)  # only looked at: opened by nobody
        except LockFileError as error:
            raise as_os_error(error) from None

    def holder(self) -> Holder | None:
        """The process holding this lock now (maybe this one), or None when free."""
        return self._lock_to_look_at().holder()

    async def _pylock_holder_exit(self, timeout: float | None) -> None:
        # pylock.holder_exit(this lock): the holder of its file, as for a Lock.
        from .._exit.api import holder_exit

        await holder_exit(self._lock_to_look_at(), timeout=timeout)

    def _pylock_wait_exit(self, timeout: float | None) -> bool:
        from .._exit.api import wait_exit

        return wait_exit(self._lock_to_look_at(), timeout)


def deadline_of(wait: Wait) -> float | None:
    return None if wait.forever else time.monotonic() + wait.timeout


def time_left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _attempt(
    lock: Lock, wait: Wait, deadline: float | None, cancel_check: Callable[[], bool] | None
) -> None:
    """One acquisition by pylock's rules: one kernel wait for the whole
    timeout, or waits of poll_interval between cancel_check calls."""
    if not wait.blocking:
        lock.acquire(blocking=False)
        return
    if cancel_check is None:
        lock.acquire(timeout=time_left(deadline))
        return
    step = max(wait.poll_interval, MIN_SLICE)
    while True:
        left = time_left(deadline)
        try:
            lock.acquire(timeout=step if left is None else min(step, left))
            return
        except LockTimeout:
            if (left is not None and left <= step) or cancel_check():
                raise


def _outwait_self(
    lock: Lock, wait: Wait, deadline: float | None, cancel_check: Callable[[], bool] | None
) -> None:
    """This thread holds the file through another object, and the wait has
    a limit: as filelock, wait it out, taking the lock if another thread of
    this process releases it meanwhile (the release rings the bell)."""
    step = max(wait.poll_interval, MIN_SLICE)
    seen = BELL.listen()
    try:
        while True:
            try:
                _attempt(lock, wait, deadline, cancel_check)
                return
            except ReentrantAcquire:
                left = time_left(deadline) or 0.0
                if left <= 0 or (cancel_check is not None and cancel_check()):
                    lock.acquire(blocking=False)  # LockHeld, naming this process
                    return
                seen = BELL.wait(seen, left if cancel_check is None else min(left, step))
    finally:
        BELL.stop()


def _create_as_filelock_does(path: str, mode: int) -> None:
    """Create a missing lock file with filelock's mode (0o666 less the
    umask, or mode exactly) and its missing directories.  Only ever creates
    (O_EXCL, which follows no link); any other failure is left to pylock's
    own open, which names what is wrong."""
    if not path or path.endswith(("/", os.sep)):
        return
    for first in (True, False):
        try:
            fd = os.open(path, _CREATE, 0o666 if mode == UNSET_MODE else mode)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not first or not parent:
                return
            os.makedirs(parent, exist_ok=True)
            continue
        except OSError:
            return
        try:
            if mode != UNSET_MODE and hasattr(os, "fchmod"):
                os.fchmod(fd, mode)  # the umask does not narrow a mode asked for
        finally:
            os.close(fd)
        return
