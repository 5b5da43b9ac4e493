"""The front's errors: filelock's Timeout, which here names the holder, the
deadlock refusal, and pylock's lock-file errors as the OSError subclasses
filelock's callers catch."""

from __future__ import annotations

import os

from .._core.errors import LockFileError
from .._lock.errors import LockHeld, ReentrantAcquire, describe_holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._lock.holder import Holder


class Timeout(LockHeld, TimeoutError):
    """The lock could not be acquired: held elsewhere when a non-blocking
    attempt was made, until the timeout passed, or until cancel_check said
    to stop.  Also a pylock.LockHeld: `holder` is the process holding it
    (None when it released before it could be named)."""

    def __init__(self, lock_file: str, holder: Holder | str | None = None) -> None:
        self._lock_file = lock_file
        if isinstance(holder, str):  # filelock's own form: a description
            described, holder = holder, None
        else:
            described = describe_holder(holder)
        super().__init__(
            lock_file,
            holder,
            f"The file lock '{lock_file}' could not be acquired. It is held by {described}.",
        )

    @property
    def lock_file(self) -> str:
        """The path of the file lock, as the lock was given it."""
        return self._lock_file

    def __reduce__(self) -> tuple[object, ...]:
        return (Timeout, (self._lock_file, self.holder))

    def __repr__(self) -> str:
        return f"Timeout({self._lock_file!r})"


def deadlock(lock_file: str, kind: str, scope: str) -> ReentrantAcquire:
    """A wait without a limit for a lock this thread (or task) already holds
    through another object: it could never end."""
    return ReentrantAcquire(
        f"Deadlock: {lock_file} is already held by this {scope} through another {kind} "
        "object, so waiting for it without a timeout would never end. Acquire the same "
        "object again (it is reentrant; is_singleton=True gives one object per path), or "
        "pass a timeout."
    )


def as_os_error(error: LockFileError) -> OSError:
    """pylock's LockFileError as the OSError subclass its errno names
    (PermissionError, IsADirectoryError, ...), keeping pylock's advice."""
    reason = error.strerror or os.strerror(error.errno or 0)
    if error.advice:
        reason = f"{reason} ({error.advice})"
    converted = OSError(error.errno, reason, error.filename)
    converted.__cause__ = error
    converted.__suppress_context__ = True
    return converted
