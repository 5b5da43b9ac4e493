"""What can go wrong with an etcd lock beyond its being held: etcd unreachable,
etcd refusing a request, a waiter's place in the queue gone, a timeout that
passed before etcd answered.

No gRPC here: the command line and the holder module name these errors
without loading the etcd client.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core.errors import LockError
from .._lock.errors import LockHeld, LockTimeout


class EtcdUnavailable(LockError, ConnectionError):
    """etcd could not be reached, or did not answer in time."""

    def __init__(self, endpoints: Sequence[str], detail: str):
        self.endpoints = tuple(endpoints)
        super().__init__(
            f"etcd at {','.join(endpoints)} is unreachable ({detail}); check that etcd runs "
            "there and that this host can reach it (etcdctl --endpoints ... endpoint health)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (EtcdUnavailable, str(self), {"endpoints": self.endpoints}))


class EtcdRefused(LockError):
    """etcd answered but refused the request (bad argument, too large, no
    permission, out of space): retrying won't help."""


class EtcdLost(LockError):
    """A waiter's place in the lock's queue went away before its turn: its key
    was deleted by another etcd client, or etcd expired its lease (this
    process was paused for a whole TTL).  Nothing is held; acquiring again
    queues anew."""

    def __init__(self, path: str, key: bytes, reason: str):
        self.path = path
        self.key = key
        super().__init__(f"{path}: not acquired: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (EtcdLost, str(self), {"path": self.path, "key": self.key}))


class EtcdTimeout(LockTimeout):
    """The timeout passed before etcd said whether the lock is held (holder is
    None): a timeout shorter than etcd's round trips, or a slow cluster."""

    def __init__(self, path: str, timeout: float, endpoints: Sequence[str]):
        self.timeout = timeout
        self.endpoints = tuple(endpoints)
        LockHeld.__init__(  # LockTimeout's own would say "held by"
            self,
            path,
            None,
            f"timed out after {timeout:g} s waiting for {path}: etcd at "
            f"{','.join(self.endpoints)} had not answered yet, so whether another process "
            "holds the lock is not known (a timeout shorter than etcd's round trips?)",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (EtcdTimeout, (self.path, self.timeout, self.endpoints))


def _rebuild(cls: type[LockError], message: str, fields: dict[str, object]) -> LockError:
    exc = cls.__new__(cls)
    exc.__dict__.update(fields)
    LockError.__init__(exc, message)
    return exc
