"""filelock's locks that pylock.filelock does not offer, each refusing to
be made with the reason, so a program that switched finds out at once."""

from __future__ import annotations

import sys
from typing import Any, ClassVar


class _Refused:
    reason: ClassVar[str]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"pylock.filelock.{cls.__name__} is not supported: {cls.reason}")


_SQLITE = (
    "filelock's read-write lock is an SQLite database at the path, whose readers and writers "
    "exclude each other with SQLite's own byte-range locks, which no flock excludes: a pylock "
    "lock there would let a filelock process and a pylock one hold it at once. Where every "
    "process uses pylock, take pylock.Lock(path, shared=True) to read and pylock.Lock(path) "
    "to write"
)
_EXPIRY = (
    "it ends a holder's lock when the holder stops refreshing it, by age, and pylock never "
    "takes a lock from a holder that may still be running; use FileLock, whose lock the "
    "kernel drops when its holder dies (SoftFileLock where flock cannot be used)"
)
_PID_FILES = (
    "its stale-marker recovery judges the holder dead from the pid and host in a file, "
    "which pylock never does (pids are reused, hosts differ); use FileLock, whose lock the "
    "kernel drops when its holder dies (SoftFileLock where flock cannot be used)"
)


class ReadWriteLock(_Refused):
    reason = _SQLITE


class AsyncReadWriteLock(_Refused):
    reason = _SQLITE


class SoftReadWriteLock(_Refused):
    reason = _EXPIRY


class AsyncSoftReadWriteLock(_Refused):
    reason = _EXPIRY


class SoftFileLease(_Refused):
    reason = _EXPIRY


class AsyncSoftFileLease(_Refused):
    reason = _EXPIRY


class MarkerSoftFileLock(_Refused):
    reason = _PID_FILES


class StrictSoftFileLock(_Refused):
    reason = _PID_FILES


class AsyncStrictSoftFileLock(_Refused):
    reason = _PID_FILES


_OTHER_PLATFORM = "this is not its platform; FileLock is pylock's lock on every platform"

if sys.platform == "win32":

    class UnixFileLock(_Refused):
        reason = _OTHER_PLATFORM

    class AsyncUnixFileLock(_Refused):
        reason = _OTHER_PLATFORM

else:

    class WindowsFileLock(_Refused):
        reason = _OTHER_PLATFORM

    class AsyncWindowsFileLock(_Refused):
        reason = _OTHER_PLATFORM
