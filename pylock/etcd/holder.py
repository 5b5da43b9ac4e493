"""The holder of an etcd lock: its key decides, its key's value explains.

The value comes from whoever could write the key, so it is read by the same
bounded, validating reader as a lock file's record (pylock._lock.record):
any bytes give a record or none, never an exception.  A key that holds no
pylock record (etcdctl lock and Go's concurrency.Mutex write an empty value)
is named for what etcd shows of it: key, lease, creation revision.

This module never imports the etcd client, so pylock's exit-watching code
can recognise an EtcdHolder without loading gRPC.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from .._core.display import display
from .._lock.holder import Holder
from .._lock.record import parse_payload, program_fields


def encode_record(info: dict[str, Any] | None) -> bytes:
    """This process as the value of its contender key: the fields of a lock
    file's record, as JSON (etcdctl get shows it as it is)."""
    record = {"pid": os.getpid(), **program_fields(), "acquired_at": time.time()}
    if info is not None:
        record["info"] = info
    return json.dumps(record, separators=(",", ":")).encode()


def key_text(key: bytes) -> str:
    """A key as messages show it: quoted, undecodable bytes and controls escaped."""
    return "'" + display(key.decode("utf-8", "backslashreplace")) + "'"


@dataclass(frozen=True)
class EtcdHolder(Holder):
    """The holder of an etcd lock: the key with the lowest creation revision
    under the lock's prefix, and what its value says of its process.

    verified is always True: the key exists in etcd at `revision`, which is
    what holding means there (for a key bound to a lease, until the lease
    ends).  pid, hostname and the rest come from the value, written by the
    holder (pid 0 when the value is not a pylock record: etcdctl, a Go
    service, another client of etcd's lock recipe).  fencing_token is the
    key's creation revision, the same number the holder's
    EtcdLock.fencing_token shows.  ttl and ttl_left are the lease's TTL and
    the seconds it has left, as etcd said (0 and None when not known; a key
    bound to no lease has lease 0 and stays until deleted).
    """

    name: str = ""
    key: bytes = b""
    lease: int = 0
    ttl: int = 0
    ttl_left: int | None = None
    fencing_token: int = 0
    revision: int = 0  # the cluster revision at which this holder was read
    endpoints: tuple[str, ...] = ()

    def alive(self) -> bool:
        """Whether this holder's key still exists (asks etcd)."""
        from .exit import key_exists

        return key_exists(self)

    async def _pylock_holder_exit(self, timeout: float | None) -> None:
        """pylock.holder_exit() on an etcd holder: until its key is deleted."""
        from .exit import wait_deleted_async

        await wait_deleted_async(self, timeout)

    def _pylock_wait_exit(self, timeout: float | None) -> bool:
        """pylock.wait_exit() on an etcd holder: True once its key is deleted."""
        from .exit import wait_deleted

        return wait_deleted(self, timeout)

    def describe(self) -> str:
        where = f"etcd key {key_text(self.key)}, {self._lease_text()}"
        where += f", fencing token {self.fencing_token}"
        if self.pid > 0:
            return f"{super().describe()} ({where})"
        return f"{where} [{display(self.note)}]" if self.note else where

    def _lease_text(self) -> str:
        if not self.lease:
            return "bound to no lease (it stays until deleted)"
        text = f"lease {self.lease:x}"
        if self.ttl_left is None:
            return text
        if self.ttl_left < 0:
            return f"{text} (expired: the key goes with it)"
        return f"{text} ({self.ttl_left} s of its {self.ttl} s TTL left)"


def decode_holder(
    name: str,
    kv: Any,
    revision: int,
    endpoints: tuple[str, ...],
    lease_ttl: tuple[int, int] | None = None,
) -> EtcdHolder:
    """The holder a contender key names (lease_ttl: etcd's (left, granted) for
    its lease, when asked); a value pylock cannot read still names the key."""
    value = bytes(kv.value)
    rec = parse_payload(value) or {}
    at = rec.get("acquired_at")
    if rec:
        note = ""
    elif not value:
        note = "no pylock record: etcdctl lock, Go's concurrency.Mutex or another etcd client"
    else:
        note = "its value is not a pylock record"
    left, granted = lease_ttl if lease_ttl is not None else (None, 0)
    return EtcdHolder(
        pid=rec.get("pid", 0),
        hostname=rec.get("host", ""),
        program=rec.get("program", ""),
        argv=tuple(rec.get("argv", ())),
        acquired_at=None if at is None else _dt.datetime.fromtimestamp(at, _dt.timezone.utc),
        info=rec.get("info"),
        verified=True,
        note=note,
        name=name,
        key=bytes(kv.key),
        lease=int(kv.lease),
        ttl=granted,
        ttl_left=left,
        fencing_token=int(kv.create_revision),
        revision=revision,
        endpoints=endpoints,
    )
