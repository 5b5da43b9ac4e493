"""pylock: inter-process locks that know who holds them, and race-free
notification when a process dies.

The kernel decides (flock, LockFileEx, pidfd, kqueue, process handles); the
holder record only explains.
"""

from ._errors import (
    LockError,
    LockFileError,
    LockHeld,
    LockTimeout,
    NotHeld,
    ReentrantAcquire,
    UnsafeFilesystem,
)
from ._exit import ExitWatcher, ProcessExit, holder_exit, wait_exit
from ._holder import Holder, holders
from ._lock import Lock

__all__ = [
    "ExitWatcher",
    "Holder",
    "Lock",
    "LockError",
    "LockFileError",
    "LockHeld",
    "LockTimeout",
    "NotHeld",
    "ProcessExit",
    "ReentrantAcquire",
    "UnsafeFilesystem",
    "holder_exit",
    "holders",
    "wait_exit",
]

__version__ = "0.1.0"
