"""pylock who --system: every lock on this host, who holds it, who waits, and the deadlocks.

Linux only: the kernel's lock table (/proc/locks) and each process's
descriptors (/proc/PID/fdinfo) answer; nothing is locked or opened to ask.
--watch is a live view: redrawn in place on a terminal, a stream of
snapshots (one each time something changed) when piped.  The kernel has no
event for a change of its lock table, so the view looks again every
--interval seconds, as top(1) does.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

from . import args
from .args import HELP, Option, UsageError, parse
from .exits import EX_NOINPUT, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .system_view import Filter, Snapshot

EX_DEADLOCK = 1  # a deadlock among the files shown


def _pids(text: str) -> frozenset[int]:
    return frozenset(args.decimal(part, "invalid pid") for part in text.split(","))


def _uids(text: str) -> frozenset[int]:
    import pwd

    found = set()
    for name in text.split(","):
        if name.isdigit():
            found.add(int(name))
            continue
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise UsageError(f"no such user: '{name}'") from None
    return frozenset(found)


OPTIONS = [
    Option("", ("system",), "system", "every lock on this host (Linux)"),
    Option("", ("json",), "json", "print JSON (with --watch: one line per change)"),
    Option("", ("watch",), "watch", "a live view: in place on a terminal, a stream when piped"),
    Option(
        "",
        ("interval",),
        "interval",
        "seconds between looks with --watch (default 1)",
        args.seconds,
        metavar="SECS",
    ),
    Option("", ("path",), "prefix", "only files under PREFIX", str, metavar="PREFIX"),
    Option(
        "",
        ("pid",),
        "pids",
        "only files these processes hold or wait for",
        _pids,
        metavar="PID,...",
    ),
    Option(
        "",
        ("user",),
        "uids",
        "only files these users' processes hold or wait for",
        _uids,
        metavar="USER,...",
    ),
    HELP,
]

USAGE = """\
Usage:
 pylock who --system [--json] [--path PREFIX] [--pid PID,...] [--user USER,...]
 pylock who --system --watch [--interval SECS] [--json] [filters]

Every lock the kernel lists (flock, POSIX and OFD record locks, leases):
its file, kind and mode, every process holding it (pid, user, command,
since when where a pylock record says so, verified by the kernel or not)
and every process waiting for it, with whom it waits for.  A cycle of
processes each waiting for the next is reported as a DEADLOCK: flock(2)
detects none, and the kernel's fcntl check misses cycles that mix flock
and POSIX locks.  As another user, pylock shows what the kernel shows that
user: pids and the file's MAJ:MIN:INODE where it may not see the path.

Exit status: 0 no deadlock, 1 a deadlock among the files shown, 64 usage,
66 the kernel's lock table cannot be read.

Options:
"""


def main(argv: Sequence[str]) -> int:
    defaults = {
        "system": False,
        "json": False,
        "watch": False,
        "interval": None,
        "prefix": None,
        "pids": None,
        "uids": None,
        "help": False,
    }
    opts, rest = parse(OPTIONS, argv, defaults)
    if opts["help"]:
        from .main import print_help

        print_help(USAGE, OPTIONS)
        return 0
    if rest:
        raise UsageError("--system takes no PATH (--path PREFIX picks files)")
    if opts["interval"] is not None and not opts["watch"]:
        raise UsageError("--interval goes with --watch")
    if not sys.platform.startswith("linux"):
        say("who --system needs Linux's /proc/locks")
        return EX_NOINPUT
    from .system_view import Filter

    # A listing makes tens of thousands of small objects and drops none
    # before it ends: the cycle collector would only rescan them (a third
    # of the time of a large listing).  --watch collects after each look.
    gc.disable()
    prefix = opts["prefix"]
    wanted = Filter(None if prefix is None else os.path.abspath(prefix), opts["pids"], opts["uids"])
    if opts["watch"]:
        interval = opts["interval"]
        return watch(wanted, bool(opts["json"]), 1.0 if interval is None else max(interval, 0.1))
    snap = _look(wanted)
    if snap is None:
        return EX_NOINPUT
    sys.stdout.write(_render(snap, bool(opts["json"]), pretty=True))
    return EX_DEADLOCK if snap.deadlocks else 0


def _look(wanted: Filter) -> Snapshot | None:
    from .system_view import snapshot

    try:
        return snapshot(wanted)
    except OSError as exc:
        say(f"cannot read the kernel's lock table /proc/locks: {exc.strerror}")
        return None


def _render(snap: Snapshot, as_json: bool, pretty: bool) -> str:
    from . import system_render

    if not as_json:
        return "\n".join(system_render.text_lines(snap)) + "\n"
    import json

    doc = system_render.json_doc(snap)
    if not pretty:
        return json.dumps(doc, separators=(",", ":")) + "\n"
    # A key per line and a file or deadlock per line: json's indent= would
    # take its pure-Python encoder, seconds for a host of thousands of locks.
    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"    {json.dumps(item)}" for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _signature(snap: Snapshot) -> str:
    """What a stream compares to decide that something changed: everything but the clock."""
    import json

    from . import system_render

    snap.clock = False
    try:
        doc = system_render.json_doc(snap)
    finally:
        snap.clock = True
    del doc["time"]
    return json.dumps(doc, sort_keys=True)


def watch(wanted: Filter, as_json: bool, interval: float) -> int:
    """Look every interval seconds until interrupted; returns only if a look fails."""
    screen = None
    if os.isatty(1) and not as_json:
        from .system_screen import Screen

        screen = Screen()
    last = ""
    interrupted = _catch_interrupt()
    try:
        while not interrupted:
            snap = _look(wanted)
            if snap is None:
                return EX_NOINPUT
            if screen is not None:
                from . import system_render

                screen.draw(system_render.text_lines(snap))
                del snap
                gc.collect()
                screen.pause(interval)
                continue
            now = _signature(snap)
            if now != last:
                sys.stdout.write(_render(snap, as_json, pretty=False) + ("" if as_json else "\n"))
                sys.stdout.flush()
                last = now
            del snap
            gc.collect()
            time.sleep(interval)
        raise KeyboardInterrupt
    finally:
        if interrupted is not _NOT_CAUGHT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if screen is not None:
            screen.close()


_NOT_CAUGHT: list[int] = []


def _catch_interrupt() -> list[int]:
    """Ctrl-C, also when its KeyboardInterrupt is lost: raised inside a
    weakref callback or finalizer the collector runs (every look collects,
    and PyPy runs them then), it is only "ignored"; the note stays."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return _NOT_CAUGHT  # the caller's choice (ignored, say): left alone
    seen: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    return seen


def asks_for_system(argv: Sequence[str]) -> bool:
    """Whether `pylock who`'s options include --system (or a prefix of it, as
    getopt_long takes): that command line is this module's."""
    for word in argv:
        if word == "--" or not word.startswith("-") or word == "-":
            return False
        name = word.partition("=")[0]
        if len(name) >= 3 and "--system".startswith(name):
            return True
    return False
