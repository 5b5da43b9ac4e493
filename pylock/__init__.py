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
    from . import metrics
    from ._dirs import UnsafeDirectory, runtime_dir
    from ._exit import ExitWatcher, ProcessExit, holder_exit, wait_exit
    from ._holder import Holder, holders
    from ._ports import PortInUse, PortSocket, bind_port, port_lock
    from ._protocol import SupportsLock
    from ._singleton import TakeoverRefused, singleton, singleton_async
    from ._unixsock import SocketInUse, claim_unix_socket

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
    "SupportsLock": "_protocol",  # typing's Protocol
    # The daemon kit: singletons, ports, sockets (socket, signal and more).
    "TakeoverRefused": "_singleton",
    "singleton": "_singleton",
    "singleton_async": "_singleton",
    "PortInUse": "_ports",
    "PortSocket": "_ports",
    "bind_port": "_ports",
    "port_lock": "_ports",
    "SocketInUse": "_unixsock",
    "claim_unix_socket": "_unixsock",
    "UnsafeDirectory": "_dirs",
    "runtime_dir": "_dirs",
    "metrics": "",  # the submodule itself
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pylock' has no attribute {name!r}")
    # __import__, not importlib.import_module: importlib itself costs an import.
    if not module:
        __import__(f"{__name__}.{name}")
        return globals()[name]  # the import system set it as an attribute
    value = getattr(__import__(f"{__name__}.{module}", fromlist=[name]), name)
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
    "PortInUse",
    "PortSocket",
    "ProcessExit",
    "ReentrantAcquire",
    "SocketInUse",
    "SupportsLock",
    "TakeoverRefused",
    "UnsafeDirectory",
    "UnsafeFilesystem",
    "bind_port",
    "claim_unix_socket",
    "holder_exit",
    "holders",
    "metrics",
    "port_lock",
    "runtime_dir",
    "singleton",
    "singleton_async",
    "wait_exit",
]

__version__ = "0.1.0"
