"""The pylock command: run a command under a lock, say who holds one, wait for a process.

Flags and exit codes follow util-linux flock(1) where they overlap:
-s shared, -n fail at once, -w SECONDS wait at most, -E CODE on conflict
(default 1), -o do not pass the lock to the command.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import LockError, LockHeld
from ._exit import wait_exit
from ._holder import Holder, find_holder, holders
from ._lock import Lock

EXIT_CONFLICT = 1
EXIT_USAGE = 64  # EX_USAGE, as flock(1)
EXIT_CANTCREAT = 73  # EX_CANTCREAT: the lock file cannot be used


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pylock", description="Locks that know who holds them (see 'pylock CMD -h')."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser(
        "run",
        help="run a command while holding a lock",
        usage="pylock run [options] PATH -- COMMAND [ARGS...]",
    )
    run.add_argument("path", help="the lock file (created if missing)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.add_argument("-s", "--shared", action="store_true", help="take a shared lock")
    group = run.add_mutually_exclusive_group()
    group.add_argument("-n", "--nonblock", action="store_true", help="fail if held")
    group.add_argument("-w", "--timeout", type=float, help="wait at most SECONDS")
    run.add_argument("-E", "--conflict-exit-code", type=int, default=EXIT_CONFLICT)
    run.add_argument(
        "-o", "--close", action="store_true", help="do not pass the lock to the command"
    )
    run.add_argument("--info", type=json.loads, help="JSON object recorded with the holder")
    run.add_argument("--unlink", action="store_true", help="remove the lock file on release")
    run.add_argument("-q", "--quiet", action="store_true", help="no message on conflict")

    who = sub.add_parser("who", help="say who holds a lock (exit 0 held, 1 free)")
    who.add_argument("path")
    who.add_argument("--all", action="store_true", help="every holder the kernel shows")
    who.add_argument("--json", action="store_true", help="machine-readable output")

    wait = sub.add_parser("wait-exit", help="wait until a process exits (exit 0; 1 on timeout)")
    wait.add_argument("pid", type=int)
    wait.add_argument("-w", "--timeout", type=float)
    return parser


def _holder_json(holder: Holder) -> dict[str, Any]:
    return {
        "pid": holder.pid,
        "program": holder.program,
        "argv": list(holder.argv),
        "hostname": holder.hostname,
        "acquired_at": holder.acquired_at.isoformat() if holder.acquired_at else None,
        "info": holder.info,
        "verified": holder.verified,
        "shared": holder.shared,
        "start_time": holder.start_time,
        "boot_id": holder.boot_id,
        "note": holder.note,
    }


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("pylock run: no command given (pylock run PATH -- COMMAND...)", file=sys.stderr)
        return EXIT_USAGE
    lock = Lock(args.path, shared=args.shared, info=args.info)
    try:
        if args.nonblock:
            lock.acquire(blocking=False)
        else:
            lock.acquire(timeout=args.timeout)
    except LockHeld as exc:
        if not args.quiet:
            print(f"pylock: {exc}", file=sys.stderr)
        return int(args.conflict_exit_code)
    try:
        # Passing the descriptor keeps the lock held for as long as the
        # command lives, even if this process is killed (as flock(1) does).
        keep = () if args.close or os.name == "nt" else (lock._handle,)
        child = subprocess.Popen(command, pass_fds=keep)
        while True:
            try:
                return _returncode(child.wait())
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
    finally:
        lock.release(unlink=args.unlink)
        lock.close()


def _returncode(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


def _who(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.path)
    found = holders(path) if args.all else [h for h in [find_holder(path)] if h is not None]
    if args.json:
        print(json.dumps([_holder_json(h) for h in found], indent=2))
    elif not found:
        print(f"{path}: free")
    else:
        for holder in found:
            mark = "" if holder.verified else " (unverified)"
            kind = "shared" if holder.shared else "held"
            print(f"{path}: {kind} by {holder.describe()}{mark}")
            if holder.info:
                print(f"  info: {json.dumps(holder.info)}")
    return 0 if found else 1


def _wait_exit(args: argparse.Namespace) -> int:
    return 0 if wait_exit(args.pid, timeout=args.timeout) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "who":
            return _who(args)
        return _wait_exit(args)
    except (LockError, ValueError) as exc:
        print(f"pylock: {exc}", file=sys.stderr)
        return EXIT_CANTCREAT
    except FileNotFoundError as exc:
        print(f"pylock: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
