"""Locks held in an etcd cluster, with the interface of pylock.Lock.

Needs the `etcd` extra (``pip install pylock-kernel[etcd]``), which brings
aetcd (etcd's v3 API for asyncio gRPC).  ``import pylock`` never loads it.
"""

from .client import EtcdRefused, EtcdUnavailable
from .holder import EtcdHolder
from .lock import EtcdLock

__all__ = ["EtcdHolder", "EtcdLock", "EtcdRefused", "EtcdUnavailable"]
