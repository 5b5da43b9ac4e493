"""pylock list: the lock files of a directory, who holds them, and safe cleanup.

A lock file here is a regular file (never a symlink) that holds a pylock
record, is empty, or is locked right now.  --stale picks the files nobody
holds whose record names a process that is gone; --clean removes those the
way release(unlink=True) does: it takes the lock (without waiting), checks
again under the lock, unlinks while still holding it and only then lets go
(every name relative to the directory's descriptor, opened once),
so nothing held is ever removed and pylock waiters, which re-check the path
after locking, are never split across two files.
"""

from __future__ import annotations

import os
import sys

from .._core.display import display, json_text, json_texts, stamp
from .args import HELP, Option, UsageError, parse
from .exits import EX_NOINPUT, say

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
locked, then released, nothing ever written into it: a held file is never
removed, and pylock users waiting for it re-check the path and move to the
new file.  A flock(1) user that opened the file in that same instant is not
protected (flock(1) never re-checks the path).  A file that may not be
removed is named on stderr, and the others are still cleaned.  FIFOs and
devices are looked at, never opened.

Exit status: 0; 1 when --clean left a stale file it may not remove; 66 when
DIR cannot be read.

Options:
"""


class Entry:
    """One lock file as seen now."""

    def __init__(self, path: str, identity: tuple[int, int] = (0, 0)) -> None:
        self.path = path
        self.identity = identity  # (st_dev, st_ino) of the file looked at
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
        # Opened once: every name is looked at, locked and removed relative
        # to this descriptor, so a directory on the path swapped afterwards
        # (by someone who owns a parent) cannot send --clean elsewhere.
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        say(f"cannot list {display(directory)}: {exc.strerror}")
        return EX_NOINPUT
    try:
        status = _list(directory, dir_fd, opts)
    finally:
        os.close(dir_fd)
    return status


def _list(directory: str, dir_fd: int, opts: dict[str, Any]) -> int:
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        say(f"cannot list {display(directory)}: {exc.strerror}")
        return EX_NOINPUT
    found = (inspect(os.path.join(directory, n), dir_fd) for n in names)
    entries = [e for e in found if e is not None]
    if opts["stale"] or opts["clean"]:
        entries = [e for e in entries if e.stale]
    status = 0
    if opts["clean"]:
        for entry in entries:
            clean(entry, dir_fd)
            if entry.error:
                say(f"{display(entry.path)}: {entry.error}")
                status = 1
    if opts["json"]:
        import json

        sys.stdout.write(json.dumps([as_json(e) for e in entries], indent=2) + "\n")
    else:
        for entry in entries:
            sys.stdout.write(describe(entry) + "\n")
    return status


def inspect(path: str, dir_fd: int | None = None) -> Entry | None:
    """The lock file at path (its name relative to dir_fd when given), or
    None when it is not one.  Only a regular file is ever opened: a FIFO or
    a device is looked at, never opened (pylock._core.peek).  The kernel's
    table is read for this file as it is looked at (not once for the whole
    listing: a file locked meanwhile would be shown free)."""
    from .._core.locktable import flocks_on
    from .._core.peek import Peek
    from .._lock.lookup import held_by_probe
    from .._lock.record import MAX_RECORD

    try:
        look = Peek(os.path.basename(path) if dir_fd is not None else path, dir_fd)
    except OSError:
        return None  # gone
    try:
        if not look.regular:
            return None  # a symlink, a directory, a FIFO, a device: never a lock file here
        key = look.key()
        table = flocks_on(key.dev, key.ino)
        try:
            fd = look.open_to_read()
        except OSError:
            return None  # unreadable, or replaced meanwhile
        try:
            head = os.pread(fd, MAX_RECORD, 0)
            # No lock table: a shared probe, given back at once.
            held = held_by_probe(fd) if table is None else bool(table)
        except OSError:
            return None
        finally:
            os.close(fd)
    finally:
        look.close()
    entry = Entry(path, (look.st.st_dev, look.st.st_ino))
    return _fill(entry, head, held)


def _fill(entry: Entry, head: bytes, held: bool) -> Entry | None:
    """entry with its record and holders, or None when it is someone's data."""
    from .._lock.record import parse as parse_record

    if held:
        from .who import PathProblem, who

        try:  # as `pylock who` names them: the holder, or every shared one
            entry.holders = who(entry.path)
        except PathProblem:
            return None
    entry.record = parse_record(head)
    if entry.record is None and not entry.held and head:
        return None  # someone's data, not a lock file
    entry.record_alive = _alive(entry.record)
    return entry


def _alive(rec: dict[str, Any] | None) -> bool | None:
    """Whether the process the record names still runs (None: no record)."""
    if rec is None:
        return None
    from .._core.process import identity_of, same_process
    from .._lock.record import identity

    recorded = identity(rec)
    now = identity_of(recorded.pid)
    return now is not None and same_process(now, recorded)


def clean(entry: Entry, dir_fd: int | None = None) -> None:
    """Remove a stale lock file under its lock; leave it if anything changed.

    The file is locked (without waiting) through a descriptor of its own,
    checked again under the lock (still the file looked at, still stale,
    still at its name), unlinked while locked, then closed: pylock waiters
    re-check the path after locking, so none is left on the removed file.
    Nothing is written to the file; a file this user may not remove is
    reported in entry.error and left as it is.
    """
    from .._core.peek import Peek
    from .fdlock import Conflict, lock_descriptor

    name = os.path.basename(entry.path) if dir_fd is not None else entry.path
    try:
        with Peek(name, dir_fd) as look:
            fd = look.open_to_read()
    except OSError:
        return  # gone or replaced: nothing of the stale file is left to remove
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != entry.identity:
            return  # another file at that name now
        try:
            lock_descriptor(fd, False, False, None)
        except Conflict:
            return  # held again: not stale any more
        entry.removed = _unlink_if_still_stale(entry, name, dir_fd, fd)
    except OSError as exc:
        entry.error = f"not removed: {exc.strerror}"
    finally:
        os.close(fd)  # closing it unlocks


def _unlink_if_still_stale(entry: Entry, name: str, dir_fd: int | None, fd: int) -> bool:
    """Under the lock: unlink the file if it is still stale and still at its name."""
    from .._lock.record import MAX_RECORD
    from .._lock.record import parse as parse_record

    rec = parse_record(os.pread(fd, MAX_RECORD, 0))
    if rec is None or _alive(rec) is not False:
        return False  # taken and released since the look: its holder lives
    if not _same_file(name, dir_fd, os.fstat(fd)):
        return False
    os.unlink(name, dir_fd=dir_fd)
    return True


def _same_file(name: str, dir_fd: int | None, locked: os.stat_result) -> bool:
    """Whether name still names the file that was locked."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (locked.st_dev, locked.st_ino)


def as_json(entry: Entry) -> dict[str, Any]:
    """One lock file as JSON: the path, its holders as `pylock who --json`
    writes them, the record's last holder with the same field names (null
    where the record does not say), and error (null when none)."""
    from .report import holder_json, path_json

    record = None
    rec = entry.record
    if rec is not None:
        record = {"pid": rec.get("pid")}
        json_text(record, "program", rec.get("program"))
        json_texts(record, "argv", rec.get("argv"))
        json_text(record, "hostname", rec.get("host"))
        at = rec.get("acquired_at")
        record.update(
            acquired_at=None if at is None else stamp(at),
            start_time=rec.get("start_time") or None,
            boot_id=rec.get("boot_id") or None,
            pidfs_ino=rec.get("pidfs_ino") or None,
            alive=entry.record_alive,
        )
    result = path_json(entry.path)
    result.update(
        held=entry.held,
        holders=[holder_json(h) for h in entry.holders],
        record=record,
        stale=entry.stale,
        removed=entry.removed,
        error=entry.error or None,
    )
    return result


def describe(entry: Entry) -> str:
    """One lock file in one line (its holders' lines when held), every
    string escaped."""
    from .report import describe as describe_holders

    if entry.held:
        return describe_holders(entry.path, entry.holders).rstrip("\n")
    text = f"{display(entry.path)}: free"
    rec = entry.record
    if rec is not None:
        gone = "gone" if entry.record_alive is False else "still running"
        at = rec.get("acquired_at")
        when = "" if at is None else f" since {stamp(at)}"
        program = display(rec.get("program", ""))
        text += f" (last held by pid {rec.get('pid')} ({program}){when}, {gone})"
    if entry.removed:
        text += ": removed"
    elif entry.error:
        text += f": {display(entry.error)}"
    return text
