"""Who holds a lock: the record explains, the kernel decides."""

from __future__ import annotations

import datetime as _dt
import errno
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from . import _procfs, _record
from ._native import ffi, lib
from ._process import ProcessIdentity, identity_of, is_alive, same_process
from ._record import hostname
from ._syscall import check, open_lock_file

_LINUX = sys.platform.startswith("linux")


@dataclass(frozen=True)
class Holder:
    """A process holding a lock, or named by its record.

    verified is True only when the kernel shows this very process holding a
    lock on this very file (Linux fdinfo); a record alone is never proof.
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

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_time, self.boot_id, self.pidfs_ino)

    def alive(self) -> bool:
        """Whether this very process (pid and start identity) is still running."""
        return self.pid > 0 and is_alive(self.identity)

    def command(self) -> str:
        """The holder's command line, shortened to one readable line."""
        if not self.argv:
            return _one_line(self.program)
        words = [os.path.basename(self.argv[0]), *self.argv[1:]]
        text = " ".join(_word(word) for word in words)
        return text if len(text) <= 80 else text[:77] + "..."

    def describe(self) -> str:
        if self.pid <= 0:
            text = "a process pylock cannot identify"
        else:
            text = f"pid {self.pid}"
            command = self.command()
            if command:
                text += f" ({command})"
            if self.hostname:
                text += f" on {self.hostname}"
            if self.acquired_at is not None:
                text += " since " + self.acquired_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.note:
            text += f" [{self.note}]"
        return text


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _word(word: str) -> str:
    """One argv word for a message: one line, at most 40 characters, quoted if spaced."""
    text = _one_line(word)
    if len(text) > 40:
        text = text[:37] + "..."
    return shlex.quote(text) if text != word or " " in text else text


def _from_record(rec: dict[str, Any], verified: bool, note: str = "") -> Holder:
    at = rec.get("acquired_at")
    acquired_at = None
    if isinstance(at, (int, float)):
        acquired_at = _dt.datetime.fromtimestamp(at, _dt.timezone.utc)
    argv = rec.get("argv")
    info = rec.get("info")
    return Holder(
        pid=int(rec["pid"]),
        start_time=_int(rec.get("start_time")),
        boot_id=str(rec.get("boot_id", "")),
        pidfs_ino=_int(rec.get("pidfs_ino")),
        hostname=str(rec.get("host", "")),
        program=str(rec.get("program", "")),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
        acquired_at=acquired_at,
        info=info if isinstance(info, dict) else None,
        verified=verified,
        note=note,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return ()
    return tuple(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)


def _from_kernel(
    lock: _procfs.FdLock, ident: ProcessIdentity, rec: dict[str, Any] | None
) -> Holder:
    """A holder seen in fdinfo, with the record's details when it is the same process."""
    if rec is not None and _same_holder(ident, _record_identity(rec)):
        # The kernel's pid: the record may hold the pid seen inside a container.
        return replace(_from_record(rec, verified=True), pid=lock.pid, shared=lock.shared)
    argv = _cmdline(lock.pid)
    return Holder(
        pid=lock.pid,
        start_time=ident.start_time,
        boot_id=ident.boot_id,
        pidfs_ino=ident.pidfs_ino,
        hostname=hostname(),
        program=os.path.basename(argv[0]) if argv else "",
        argv=argv,
        verified=True,
        shared=lock.shared,
    )


def _same_holder(seen: ProcessIdentity, recorded: ProcessIdentity) -> bool:
    """Whether the record describes a process the kernel shows holding the lock.

    The pidfs inode is unique for the boot across pid namespaces, so it also
    matches a holder that recorded its pid inside a container.
    """
    if seen.pidfs_ino and seen.pidfs_ino == recorded.pidfs_ino:
        return not (seen.boot_id and recorded.boot_id and seen.boot_id != recorded.boot_id)
    return same_process(seen, recorded)


def _record_identity(rec: dict[str, Any]) -> ProcessIdentity:
    return ProcessIdentity(
        int(rec["pid"]),
        _int(rec.get("start_time")),
        str(rec.get("boot_id", "")),
        _int(rec.get("pidfs_ino")),
    )


class _Inspection:
    """One look at a lock file: its identity, its record, its kernel holders."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handle = open_lock_file(path, lib.PL_OPEN_READONLY)
        info = ffi.new("pl_file_info *")
        try:
            check(lib.pl_file_stat(self.handle, info), path)
            self.dev, self.ino = info.dev, info.ino
            self.record = _record.parse(self._read_raw())
        except BaseException:
            lib.pl_close(self.handle)
            raise

    def close(self) -> None:
        lib.pl_close(self.handle)

    def _read_raw(self) -> bytes:
        buf = ffi.new("char[]", _record.MAX_RECORD)
        length = ffi.new("size_t *")
        if lib.pl_read_record(self.handle, buf, _record.MAX_RECORD, length) != 0:
            return b""
        return bytes(ffi.buffer(buf, length[0]))

    def recorded_holder(self) -> tuple[Holder | None, str]:
        """The record's process if it is alive and holds the lock, with a note otherwise."""
        rec = self.record
        if rec is None:
            return None, ""
        recorded = _record_identity(rec)
        now = identity_of(recorded.pid)
        if now is None or not same_process(now, recorded):
            why = "has exited" if now is None else "now belongs to another process"
            return None, f"the record names pid {recorded.pid}, which {why}"
        if not _LINUX:
            return _from_record(rec, verified=False, note="unverified: record only"), ""
        holds = _procfs.pid_holds(recorded.pid, self.dev, self.ino)
        again = identity_of(recorded.pid)
        if again is None or not same_process(again, recorded):
            return None, f"the record names pid {recorded.pid}, which has exited"
        if holds is True:
            return _from_record(rec, verified=True), ""
        if holds is None:
            note = "unverified: pylock may not inspect that process's descriptors"
            return _from_record(rec, verified=False, note=note), ""
        return None, f"the record names pid {recorded.pid}, which no longer holds it"

    def kernel_holders(self) -> list[Holder]:
        found = []
        for lock in _procfs.holders_of(self.dev, self.ino):
            ident = identity_of(lock.pid)
            if ident is not None:
                found.append(_from_kernel(lock, ident, self.record))
        return found

    def held(self) -> bool:
        """Whether anyone holds the lock, without disturbing holders when we can."""
        if _LINUX and _procfs.listed_in_proc_locks(self.dev, self.ino):
            return True
        # A shared probe: only reached when nothing visible holds the lock.
        rc = lib.pl_try_lock(self.handle, 1)
        if rc == 0:
            lib.pl_unlock(self.handle)
            return False
        return True


def _inspect(path: str) -> _Inspection | None:
    """A look at the lock file, or None when there is no file (nobody holds it)."""
    try:
        return _Inspection(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def find_holder(path: str, known_held: bool = False) -> Holder | None:
    """The holder of the lock at path, or None when nobody holds it."""
    look = _inspect(path)
    if look is None:
        return None
    try:
        holder, note = look.recorded_holder()
        if holder is not None and holder.verified:
            return holder
        if _LINUX:
            seen = look.kernel_holders()
            if seen:
                return seen[0]
        if not known_held and not look.held():
            return None
        if holder is not None:
            return holder
        return Holder(pid=0, note=note or "no record")
    finally:
        look.close()


def holders(path: str) -> list[Holder]:
    """Every process the kernel shows holding the lock at path.

    On Linux this scans /proc/*/fdinfo (shared holders, processes sharing an
    inherited descriptor); elsewhere it is the verified-or-recorded holder.
    """
    path = os.path.abspath(os.fspath(path))
    look = _inspect(path)
    if look is None:
        return []
    try:
        if _LINUX:
            return look.kernel_holders()
        holder, _ = look.recorded_holder()
        if holder is not None and look.held():
            return [holder]
        return []
    finally:
        look.close()
