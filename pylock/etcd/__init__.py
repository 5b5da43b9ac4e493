"""Locks held in an etcd cluster, with the interface of pylock.Lock.

Needs the `etcd` extra (``pip install pylock-kernel[etcd]``), which brings
aetcd (etcd's v3 API for asyncio gRPC) on Python 3.10 and newer; on older
Pythons the extra installs nothing.  ``import pylock`` never loads it.
"""

from __future__ import annotations

import sys


def _missing_client(exc: ImportError | None) -> ModuleNotFoundError:
    """What importing pylock.etcd without its client says: how to get it."""
    if sys.version_info < (3, 10):
        version = ".".join(map(str, sys.version_info[:3]))
        message = (
            f"pylock.etcd needs Python 3.10 or newer (this is Python {version}): its etcd "
            "client, aetcd, supports no older Python, so the `etcd` extra installs nothing here"
        )
    else:
        message = (
            "pylock.etcd needs the etcd extra: pip install 'pylock-kernel[etcd]' (it brings "
            f"aetcd, etcd's v3 client for asyncio gRPC; {exc})"
        )
    return ModuleNotFoundError(message, name="aetcd")


if sys.version_info < (3, 10):
    raise _missing_client(None)
try:
    from . import client  # noqa: F401  (the only importer of aetcd, and so of gRPC)
except ModuleNotFoundError as _exc:
    if (_exc.name or "").partition(".")[0] not in ("aetcd", "grpc", "google"):
        raise
    raise _missing_client(_exc) from _exc

from .errors import EtcdLost, EtcdRefused, EtcdTimeout, EtcdUnavailable  # noqa: E402
from .holder import EtcdHolder  # noqa: E402
from .lock import EtcdLock  # noqa: E402

__all__ = ["EtcdHolder", "EtcdLock", "EtcdLost", "EtcdRefused", "EtcdTimeout", "EtcdUnavailable"]
