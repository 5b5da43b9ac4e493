"""The holder of an etcd lock: its key's value explains, the key's existence decides.

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

from .._lock.holder import Holder
from .._lock.record import hostname, program_argv

RECORD_VERSION = 1


def encode_record(info: dict[str, Any] | None, lease: int, ttl: int) -> bytes:
    """This process as the value of its contender key."""
    argv = program_argv()
    record = {
        "v": RECORD_VERSION,
        "pid": os.getpid(),
        "host": hostname(),
        "program": os.path.basename(argv[0]) if argv else "",
        "argv": argv,
        "acquired_at": time.time(),
        "lease": lease,
        "ttl": ttl,
    }
    if info is not None:
        record["info"] = info
    return json.dumps(record, separators=(",", ":")).encode()


@dataclass(frozen=True)
class EtcdHolder(Holder):
    """The holder of an etcd lock, as its key's value names it.

    verified is always True: the key exists in etcd at `revision` and is bound
    to a live lease, which is what holding means there.  pid and hostname are
    the holder's own, on its own host.  fencing_token is the key's creation
    revision, the same number the holder's EtcdLock.fencing_token shows.
    """

    name: str = ""
    key: bytes = b""
    lease: int = 0
    ttl: int = 0
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
        return (
            f"{super().describe()} (etcd lease {self.lease:x}, fencing token {self.fencing_token})"
        )


def decode_holder(name: str, kv: Any, revision: int, endpoints: tuple[str, ...]) -> EtcdHolder:
    """The holder a contender key names; a value pylock cannot read still names the key."""
    try:
        rec = json.loads(bytes(kv.value))
        if not isinstance(rec, dict):
            raise ValueError
    except ValueError:
        rec = {}
    at = rec.get("acquired_at")
    argv = rec.get("argv")
    info = rec.get("info")
    pid = rec.get("pid")
    return EtcdHolder(
        pid=pid if isinstance(pid, int) else 0,
        hostname=str(rec.get("host", "")),
        program=str(rec.get("program", "")),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
        acquired_at=(
            _dt.datetime.fromtimestamp(at, _dt.timezone.utc)
            if isinstance(at, (int, float))
            else None
        ),
        info=info if isinstance(info, dict) else None,
        verified=True,
        note="" if rec else "the key's value is not a pylock record",
        name=name,
        key=bytes(kv.key),
        lease=int(kv.lease),
        ttl=int(rec.get("ttl", 0)) if isinstance(rec.get("ttl", 0), int) else 0,
        fencing_token=int(kv.create_revision),
        revision=revision,
        endpoints=endpoints,
    )
