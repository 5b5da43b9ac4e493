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
from collections.abc import Sequence
from typing import Any

from .._core.display import display
from .._core.errors import LockError
from .._lock.errors import LockHeld
from .args import UsageError
from .exits import EX_UNAVAILABLE, say
from .report import holder_json

DEFAULT_TTL = 10


class Unavailable(Exception):
    """etcd cannot be used: said in one line, exit 69."""


def _lock(endpoints: str, name: str, ttl: int, info: dict[str, Any] | None = None) -> Any:
    try:
        from ..etcd import EtcdLock
    except ImportError as exc:  # pylock.etcd says what to install
        raise Unavailable(f"--etcd: {exc}") from None
    try:
        return EtcdLock(name, endpoints=endpoints, ttl=ttl, info=info)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def ttl_seconds(text: str) -> int:
    """--ttl: whole seconds, at least 1."""
    stripped = text.strip()
    if not stripped.isdigit() or int(stripped) < 1:
        raise UsageError(f"invalid TTL: '{text}' (whole seconds, at least 1)")
    return int(stripped)


def main_run(call: Any) -> int:
    """pylock run --etcd ENDPOINTS [options] NAME -- COMMAND, from its Invocation."""
    opts = call.opts
    if opts["mode"] != "exclusive" or opts["fd"] is not None or opts["no_fork"]:
        raise UsageError("--etcd takes an exclusive lock by NAME: no -s, -u, --fd or -F")
    if opts.get("takeover") is not None:
        raise UsageError("--takeover goes with lock files, not --etcd")
    if call.path is None or not call.command:
        raise UsageError("--etcd needs a NAME and a COMMAND (pylock run --etcd EP NAME -- CMD)")
    try:
        return run(
            opts["etcd"],
            call.path,
            call.command,
            nonblock=call.nonblock,
            timeout=call.timeout,
            conflict_exit_code=call.conflict_exit,
            quiet=call.quiet,
            ttl=opts["ttl"] or DEFAULT_TTL,
            info=opts["info"],
        )
    except (Unavailable, LockError) as exc:
        say(str(exc))
        return EX_UNAVAILABLE


def main_who(endpoints: str, names: Sequence[str], *, as_json: bool) -> int:
    """pylock who --etcd ENDPOINTS [--json] NAME...: 0 all held, 1 some free, 69 etcd down."""
    try:
        found = [(name, _lock(endpoints, name, DEFAULT_TTL)) for name in names]
        reports = [(lock.path, name, lock.holder()) for name, lock in found]
    except (Unavailable, LockError) as exc:
        say(str(exc))
        return EX_UNAVAILABLE
    if as_json:
        doc = [
            {
                "path": path,
                "name": name,
                "held": holder is not None,
                "holders": [] if holder is None else [holder_json(holder)],
            }
            for path, name, holder in reports
        ]
        print(json.dumps(doc, indent=2))
    else:
        for path, _, holder in reports:
            if holder is None:
                print(f"{display(path)}: free")
                continue
            print(f"{display(path)}: held by {holder.describe()}")
            if holder.info:
                print(f"  info: {json.dumps(holder.info)}")
    return 0 if all(holder is not None for _, _, holder in reports) else 1


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
    except LockHeld as exc:  # LockTimeout too
        if not quiet:
            say(str(exc))
        return conflict_exit_code
    try:
        child = subprocess.Popen(list(command))
    except BaseException:
        lock.release()
        raise

    def on_lost(_: object) -> None:
        say(
            f"lost the etcd lock {name!r} while '{command[0]}' ran (another host "
            "may hold it now): sending it SIGTERM"
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
