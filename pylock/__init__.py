"""pylock: inter-process locks that know who holds them, and race-free
notification when a process dies.

The kernel decides (flock, LockFileEx, pidfd, kqueue, process handles); the
holder record only explains.
"""

from ._core.errors import LockError, LockFileError, UnsafeFilesystem
from ._lock.errors import LockHeld, LockTimeout, NotHeld, ReentrantAcquire
from ._lock.lock import Lock

TYPE_CHECKING = False  # typing itself is not imported at run time
if TYPE_CHECKING:
    from . import metrics
    from ._daemon.dirs import UnsafeDirectory, runtime_dir
    from ._daemon.ports import PortInUse, PortSocket, bind_port, port_lock
    from ._daemon.singleton import TakeoverRefused, singleton, singleton_async
    from ._daemon.unixsock import SocketInUse, claim_unix_socket
    from ._exit.api import ExitWatcher, ProcessExit, holder_exit, wait_exit
    from ._lock.holder import Holder
    from ._lock.lookup import holders
    from ._lock.protocol import SupportsLock

# "import pylock" stays about as cheap as starting the interpreter: the
# exit-notification API (asyncio costs more than all of the rest) and the
# holder lookup (dataclasses, json, datetime) load on first use.
_LAZY = {
    "ExitWatcher": "_exit.api",
    "ProcessExit": "_exit.api",
    "holder_exit": "_exit.api",
    "wait_exit": "_exit.api",
    "Holder": "_lock.holder",
    "holders": "_lock.lookup",
    "SupportsLock": "_lock.protocol",  # typing's Protocol
    # The daemon kit: singletons, ports, sockets (socket, signal and more).
    "TakeoverRefused": "_daemon.singleton",
    "singleton": "_daemon.singleton",
    "singleton_async": "_daemon.singleton",
    "PortInUse": "_daemon.ports",
    "PortSocket": "_daemon.ports",
    "bind_port": "_daemon.ports",
    "port_lock": "_daemon.ports",
    "SocketInUse": "_daemon.unixsock",
    "claim_unix_socket": "_daemon.unixsock",
    "UnsafeDirectory": "_daemon.dirs",
    "runtime_dir": "_daemon.dirs",
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
