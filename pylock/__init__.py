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
from ._lock import Lock

TYPE_CHECKING = False  # typing itself is not imported at run time
if TYPE_CHECKING:
    from ._exit import ExitWatcher, ProcessExit, holder_exit, wait_exit
    from ._holder import Holder, holders

# "import pylock" stays about as cheap as starting the interpreter: the
# exit-notification API (asyncio costs more than all of the rest) and the
# holder lookup (dataclasses, json, datetime) load on first use.
_LAZY = {
    "ExitWatcher": "_exit",
    "ProcessExit": "_exit",
    "holder_exit": "_exit",
    "wait_exit": "_exit",
    "Holder": "_holder",
    "holders": "_holder",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pylock' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
