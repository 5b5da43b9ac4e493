"""Who holds a lock, as pylock describes it: the kernel decides and
describes, the record only adds what the kernel cannot know (info, since
when).  Finding the holder of a lock file is pylock._lock.lookup's job."""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from typing import Any

from .._core import procfs as _procfs
from .._core.display import display, shell_words, stamp
from .._core.process import ProcessIdentity, is_alive
from .record import hostname


@dataclass(frozen=True)
class Holder:
    """A process holding a lock, or named by its record.

    verified is True only when the kernel shows this very process holding a
    lock on this very file (Linux fdinfo); a record alone is never proof.
    For a verified holder, pid, the start identity, hostname, program and
    argv come from the kernel; only info and acquired_at come from the
    record, and record_private says whether only the holder's user (or
    root) could have written that record.
    """

    pid: int
    start_time: int = 0
    boot_id: str = ""
    pidfs_ino: int = 0
    hostname: str = ""
    program: str = ""
    argv: tuple[str, ...] = ()
    acquired_at: _dt.datetime | None = None
    info: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    verified: bool = False
    shared: bool = False
    note: str = ""
    record_private: bool = False

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_time, self.boot_id, self.pidfs_ino)

    def alive(self) -> bool:
        """Whether this very process (pid and start identity) is still running."""
        return self.pid > 0 and is_alive(self.identity)

    def command(self) -> str:
        """The holder's command line, one readable line with control characters escaped."""
        if not self.argv:
            return display(self.program)
        return shell_words([os.path.basename(self.argv[0]), *self.argv[1:]])

    def describe(self) -> str:
        """One line for messages and terminals: every string from a record or a
        process is shown with its control characters escaped."""
        if self.pid <= 0:
            text = "a process pylock cannot identify"
        else:
            text = f"pid {self.pid}"
            command = self.command()
            if command:
                text += f" ({command})"
            if self.hostname:
                text += f" on {display(self.hostname)}"
            if self.acquired_at is not None:
                text += " since " + stamp(self.acquired_at.timestamp())
        if self.note:
            text += f" [{display(self.note)}]"
        return text


# -- what the kernel says about a process -------------------------------------------


def _at(rec: dict[str, Any]) -> _dt.datetime | None:
    at = rec.get("acquired_at")
    return None if at is None else _dt.datetime.fromtimestamp(at, _dt.timezone.utc)


def from_record(rec: dict[str, Any]) -> Holder:
    """The holder a record describes, believed on its word (never verified):
    where no kernel can show who holds a lock."""
    return Holder(
        pid=rec["pid"],
        start_time=rec.get("start_time", 0),
        boot_id=rec.get("boot_id", ""),
        pidfs_ino=rec.get("pidfs_ino", 0),
        hostname=rec.get("host", ""),
        program=rec.get("program", ""),
        argv=tuple(rec.get("argv", ())),
        acquired_at=_at(rec),
        info=rec.get("info"),
        note="unverified: record only",
    )


def described_by_kernel(
    pid: int,
    ident: ProcessIdentity,
    shared: bool,
    verified: bool = True,
    note: str = "",
    rec: dict[str, Any] | None = None,
    record_private: bool = False,
) -> Holder:
    """A holder the kernel shows: everything from the kernel, but info and
    since when, which only rec (the record describing this very process) can add."""
    program, argv = _procfs.command_of(pid)
    return Holder(
        pid=pid,
        start_time=ident.start_time,
        boot_id=ident.boot_id,
        pidfs_ino=ident.pidfs_ino,
        hostname=hostname(),
        program=program,
        argv=argv,
        acquired_at=_at(rec) if rec else None,
        info=rec.get("info") if rec else None,
        verified=verified,
        shared=shared,
        note=note,
        record_private=record_private,
    )
