"""`pylock run --etcd` and `pylock who --etcd`: the command line's etcd locks.

`run` holds the lock for as long as the command runs (a cron job that must
run on one host only).  The lease is kept alive by this pylock process, which
stays the command's parent: SIGTERM, SIGHUP and SIGINT sent to pylock are
passed on to the command.  If the lock is lost while the command runs (this
host was paused or cut off from etcd for a whole TTL, and another host may
have started), pylock says so on stderr and sends the command SIGTERM: two
copies must not go on running side by side.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import LockHeld

DEFAULT_TTL = 10


def _lock(endpoints: str, name: str, ttl: int, info: dict[str, Any] | None = None) -> Any:
    try:
        from .etcd import EtcdLock
    except ImportError as exc:
        raise SystemExit(
            f"pylock: --etcd needs the etcd extra (pip install 'pylock-kernel[etcd]'): {exc}"
        ) from None
    return EtcdLock(name, endpoints=endpoints, ttl=ttl, info=info)


def run(
    endpoints: str,
    name: str,
    command: Sequence[str],
    *,
    nonblock: bool = False,
    timeout: float | None = None,
    conflict_exit_code: int = 1,
    quiet: bool = False,
    ttl: int = DEFAULT_TTL,
    info: dict[str, Any] | None = None,
) -> int:
    """Run command while holding the etcd lock name; its exit status (128+N if killed
    by signal N), conflict_exit_code when the lock is held and not waited for."""
    lock = _lock(endpoints, name, ttl, info)
    try:
        if nonblock:
            lock.acquire(blocking=False)
        else:
            lock.acquire(timeout=timeout)
    except LockHeld as exc:
        if not quiet:
            print(f"pylock: {exc}", file=sys.stderr)
        return conflict_exit_code
    try:
        child = subprocess.Popen(list(command))
    except BaseException:
        lock.release()
        raise

    def on_lost(_: object) -> None:
        print(
            f"pylock: lost the etcd lock {name!r} while '{command[0]}' ran (another host "
            "may hold it now): sending it SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        if child.poll() is None:
            child.terminate()

    lock.on_lost = on_lost
    if lock.lost:
        on_lost(lock)
    forwarded = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in forwarded:
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    try:
        while True:
            try:
                code = child.wait()
                return 128 - code if code < 0 else code
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)
        lock.release()


def holder_json(holder: Any) -> dict[str, Any]:
    return {
        "pid": holder.pid,
        "hostname": holder.hostname,
        "program": holder.program,
        "argv": list(holder.argv),
        "acquired_at": holder.acquired_at.isoformat() if holder.acquired_at else None,
        "info": holder.info,
        "lease": f"{holder.lease:x}",
        "ttl": holder.ttl,
        "fencing_token": holder.fencing_token,
        "key": holder.key.decode("utf-8", "replace"),
    }


def who(endpoints: str, name: str, *, as_json: bool = False) -> int:
    """Say who holds the etcd lock name: exit 0 when held, 1 when free."""
    lock = _lock(endpoints, name, DEFAULT_TTL)
    holder = lock.holder()
    if as_json:
        print(json.dumps([] if holder is None else [holder_json(holder)], indent=2))
    elif holder is None:
        print(f"{lock.path}: free")
    else:
        print(f"{lock.path}: held by {holder.describe()}")
        if holder.info:
            print(f"  info: {json.dumps(holder.info)}")
    return 0 if holder is not None else 1
