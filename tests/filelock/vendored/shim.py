"""A pytest plugin that points filelock's own tests at pylock.filelock.

Loaded (as pylock_filelock_shim, copied beside the copied tests) before
their conftest: `filelock` is pylock.filelock, and the filelock-private
helpers their conftest and helper modules import are stood in for here.
The tests themselves run unchanged.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from typing import Any, Callable

import pylock.filelock


def _host_name() -> str:
    return socket.gethostname()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _override(method: Callable[..., Any]) -> Callable[..., Any]:
    return method  # typing.override, which Python 3.11 lacks


def _exchange_supported() -> bool:
    # Only filelock's stale-marker recovery exchanges names; pylock never
    # breaks a marker, so the tests that need it skip.
    return False


def _stand_in(name: str, **attributes: object) -> None:
    module = types.ModuleType(name, "stand-in for a filelock-private helper")
    module.__dict__.update(attributes)
    sys.modules[name] = module


sys.modules["filelock"] = pylock.filelock
_stand_in("filelock._identity", host_name=_host_name, process_alive=_process_alive)
_stand_in("filelock._core", override=_override)
_stand_in("filelock._filesystem", exchange_supported=_exchange_supported)
