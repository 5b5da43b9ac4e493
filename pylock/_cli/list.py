"""pylock list: the lock files of a directory, who holds them, and safe cleanup.

A lock file here is a regular file (never a symlink) that holds a pylock
record, is empty, or is locked right now.  --stale picks the files nobody
holds whose record names a process that is gone; --clean removes those the
way release(unlink=True) does: it takes the lock (without waiting), checks
again under the lock, unlinks while still holding it and only then lets go,
so nothing held is ever removed and pylock waiters, which re-check the path
after locking, are never split across two files.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from .args import HELP, Option, UsageError, parse
from .exits import EX_NOINPUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

OPTIONS = [
    Option("", ("json",), "json", "print JSON: one object per lock file"),
    Option("", ("stale",), "stale", "only the free files whose recorded holder is gone"),
    Option("", ("clean",), "clean", "remove the stale files (safely, under their lock)"),
    HELP,
]

USAGE = """\
Usage:
 pylock list [--json] [--stale] [--clean] DIR

List every lock file in DIR (not its subdirectories): held or free, the
holder and since when, or the last recorded holder and whether it is gone.
A lock file is a regular file holding a pylock record, an empty file, or a
file locked right now; other files are left out.

--clean removes stale files: free, with a record naming a process that has
exited.  Each is locked (never waited for), checked again, unlinked while
locked, then released: a held file is never removed, and pylock users
waiting for it re-check the path and move to the new file.  A flock(1)
user that opened the file in that same instant is not protected (flock(1)
never re-checks the path).

Exit status: 0, or 66 when DIR cannot be read.

Options:
"""


class Entry:
    """One lock file as seen now."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.holders: list[Any] = []
        self.record: dict[str, Any] | None = None
        self.record_alive: bool | None = None
        self.removed = False
        self.error = ""

    @property
    def held(self) -> bool:
        return bool(self.holders)

    @property
    def stale(self) -> bool:
        return not self.held and self.record is not None and self.record_alive is False


def main(argv: Sequence[str]) -> int:
    defaults = {"json": False, "stale": False, "clean": False, "help": False}
    opts, rest = parse(OPTIONS, argv, defaults)
    if opts["help"]:
        from .main import print_help

        print_help(USAGE, OPTIONS)
        return 0
    if len(rest) != 1:
        raise UsageError("needs exactly one DIR")
    directory = os.path.abspath(rest[0])
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        sys.stderr.write(f"pylock: cannot list {directory}: {exc.strerror}\n")
        return EX_NOINPUT
    entries = [e for e in (inspect(os.path.join(directory, n)) for n in names) if e is not None]
    if opts["stale"] or opts["clean"]:
        entries = [e for e in entries if e.stale]
    if opts["clean"]:
        for entry in entries:
            clean(entry)
    if opts["json"]:
        import json

        sys.stdout.write(json.dumps([as_json(e) for e in entries], indent=2) + "\n")
    else:
        for entry in entries:
            sys.stdout.write(describe(entry) + "\n")
    return 0


def inspect(path: str) -> Entry | None:
    """The lock file at path, or None when it is not one."""
    from .._core.process import identity_of, same_process
    from .._core.procfs import proc_locks
    from .._lock.lookup import held_by_probe
    from .._lock.record import MAX_RECORD, identity
    from .._lock.record import parse as parse_record

    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # a symlink, unreadable, or gone
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = os.pread(fd, MAX_RECORD, 0)
        table = proc_locks(st.st_dev, st.st_ino)
        # No lock table: a shared probe, given back at once.
        held = held_by_probe(fd) if table is None else bool(table)
    except OSError:
        return None
    finally:
        os.close(fd)
    entry = Entry(path)
    entry.record = parse_record(head)
    if entry.record is None and not held and head:
        return None  # someone's data, not a lock file
    if held:
        from .who import PathProblem, who

        try:  # as `pylock who` names them: the holder, or every shared one
            entry.holders = who(path)
        except PathProblem:
            return None
    rec = entry.record
    if rec is not None:
        recorded = identity(rec)
        now = identity_of(recorded.pid)
        entry.record_alive = now is not None and same_process(now, recorded)
    return entry


def clean(entry: Entry) -> None:
    """Remove a stale lock file under its lock; leave it if anything changed."""
    from .._core.errors import LockError
    from .._lock.lock import Lock

    lock = Lock(entry.path)
    try:
        lock.acquire(blocking=False)
    except LockError as exc:
        entry.error = f"not removed: {exc}"
        lock.close()
        return
    except OSError as exc:
        entry.error = f"not removed: {exc.strerror}"
        lock.close()
        return
    try:
        # Held by us now: nobody else holds it.  The record we just wrote
        # replaced the stale one, which is why the check came first.
        locked = os.fstat(lock.fileno())
        lock.release(unlink=True)
        entry.removed = not _same_file(entry.path, locked)
    finally:
        lock.close()


def _same_file(path: str, locked: os.stat_result) -> bool:
    """Whether path still names the file that was locked (True when unsure)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return exc.errno != errno.ENOENT
    return (st.st_dev, st.st_ino) == (locked.st_dev, locked.st_ino)


def as_json(entry: Entry) -> dict[str, Any]:
    from .report import holder_json

    record = None
    if entry.record is not None:
        record = {
            "pid": entry.record.get("pid"),
            "program": entry.record.get("program"),
            "host": entry.record.get("host"),
            "acquired_at": _iso(entry.record.get("acquired_at")),
            "alive": entry.record_alive,
        }
    result: dict[str, Any] = {
        "path": entry.path,
        "held": entry.held,
        "holders": [holder_json(h) for h in entry.holders],
        "record": record,
        "stale": entry.stale,
        "removed": entry.removed,
    }
    if entry.error:
        result["error"] = entry.error
    return result


def describe(entry: Entry) -> str:
    from .report import describe as describe_holders

    if entry.held:
        return describe_holders(entry.path, entry.holders).rstrip("\n")
    text = f"{entry.path}: free"
    rec = entry.record
    if rec is not None:
        gone = "gone" if entry.record_alive is False else "still running"
        since = _iso(rec.get("acquired_at"))
        when = f" since {since}" if since else ""
        text += f" (last held by pid {rec.get('pid')} ({rec.get('program', '')}){when}, {gone})"
    if entry.removed:
        text += ": removed"
    elif entry.error:
        text += f": {entry.error}"
    return text


def _iso(stamp: Any) -> str | None:
    if not isinstance(stamp, (int, float)):
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(stamp, dt.timezone.utc).isoformat()
