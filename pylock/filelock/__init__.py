"""pylock.filelock: filelock's API on pylock, so a program switches by
changing one import::

    from pylock.filelock import FileLock, AsyncFileLock, Timeout   # was: from filelock import ...

FileLock and AsyncFileLock are pylock locks: every wait is the kernel's
(woken by the holder's release or death, never a poll), Timeout names the
holder, and holder() and pylock.holder_exit() work on them.  Their
reentrancy counters, thread_local, is_singleton, mode, timeouts and
filelock's DEBUG log lines behave as filelock's.  SoftFileLock is
filelock's existence lock.  What is not offered refuses to be made, naming
why (the README's "Switching from filelock" lists each).
"""

from __future__ import annotations

import sys

from .. import __version__
from ._api import AcquireReturnProxy, BaseFileLock
from ._async import AsyncAcquireReturnProxy, AsyncFileLock, AsyncSoftFileLock, BaseAsyncFileLock
from ._errors import Timeout
from ._kernel import FileLock
from ._options import CloseErrorPolicy, ContextErrorPolicy
from ._refused import (
    AsyncReadWriteLock,
    AsyncSoftFileLease,
    AsyncSoftReadWriteLock,
    AsyncStrictSoftFileLock,
    MarkerSoftFileLock,
    ReadWriteLock,
    SoftFileLease,
    SoftReadWriteLock,
    StrictSoftFileLock,
)
from ._soft import SoftFileLock

# filelock's name for "FileLock is the platform's OS lock", which it always is here.
has_fcntl = sys.platform != "win32"

if sys.platform == "win32":
    from ._refused import AsyncUnixFileLock, UnixFileLock

    WindowsFileLock = FileLock
    AsyncWindowsFileLock = AsyncFileLock
else:
    from ._refused import AsyncWindowsFileLock, WindowsFileLock

    UnixFileLock = FileLock
    AsyncUnixFileLock = AsyncFileLock

__all__ = [
    "AcquireReturnProxy",
    "AsyncAcquireReturnProxy",
    "AsyncFileLock",
    "AsyncReadWriteLock",
    "AsyncSoftFileLease",
    "AsyncSoftFileLock",
    "AsyncSoftReadWriteLock",
    "AsyncStrictSoftFileLock",
    "AsyncUnixFileLock",
    "AsyncWindowsFileLock",
    "BaseAsyncFileLock",
    "BaseFileLock",
    "CloseErrorPolicy",
    "ContextErrorPolicy",
    "FileLock",
    "MarkerSoftFileLock",
    "ReadWriteLock",
    "SoftFileLease",
    "SoftFileLock",
    "SoftReadWriteLock",
    "StrictSoftFileLock",
    "Timeout",
    "UnixFileLock",
    "WindowsFileLock",
    "__version__",
    "has_fcntl",
]
