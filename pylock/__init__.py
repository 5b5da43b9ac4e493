"""pylock: inter-process locks that know who holds them, and race-free
notification when a process dies.

The kernel decides (flock, LockFileEx, pidfd, kqueue, process handles); the
holder record only explains.
"""

from typing import TYPE_CHECKING, Any

from ._errors import (
    LockError,
    LockFileError,
    LockHeld,
    LockTimeout,
    NotHeld,
    ReentrantAcquire,
    UnsafeFilesystem,
)
from ._holder import Holder, holders
from ._lock import Lock

if TYPE_CHECKING:
    from ._exit import ExitWatcher, ProcessExit, holder_exit, wait_exit

# The exit-notification API needs asyncio, which costs more to import than
# all of the rest: it is loaded on first use, so "import pylock" stays cheap
# for programs that only lock.
_EXIT_NAMES = {"ExitWatcher", "ProcessExit", "holder_exit", "wait_exit"}


def __getattr__(name: str) -> Any:
    if name in _EXIT_NAMES:
        from . import _exit

        value = getattr(_exit, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pylock' has no attribute {name!r}")


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
