"""Finding who holds a lock file: one look at it (the kernel's lock tables,
the processes' descriptors, the record), and find_holder() and holders()
on top.  On Linux the kernel's tables answer and nothing is locked to ask;
elsewhere a shared lock taken for a moment says whether anyone holds it.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any

from .._core import fs as _fs
from .._core import procfs as _procfs
from .._core.errors import PSEUDO_FS, LockFileError, advice_for
from .._core.native import check, ffi, lib, open_lock_file
from .._core.process import ProcessIdentity, identity_of, same_process
from . import record as _record
from .holder import Holder, described_by_kernel, from_record

_LINUX = sys.platform.startswith("linux")


def kernel_holders_of(dev: int, ino: int) -> list[Holder]:
    """Every process whose descriptor holds a flock on (dev, ino) (Linux
    fdinfo), verified and described by the kernel alone: for files that hold
    no record (directories, devices, other programs' files)."""
    found = []
    for lock in _procfs.holders_of(dev, ino):
        ident = identity_of(lock.pid)
        if ident is not None:  # None: exited meanwhile
            found.append(described_by_kernel(lock.pid, ident, lock.shared))
    return found


def held_by_probe(handle: int) -> bool:
    """Whether anyone holds the lock on handle's file, by taking a shared lock
    for a moment (macOS, Windows: their kernels show no lock table).  A racing
    acquire(blocking=False) elsewhere can be refused while it lasts."""
    if lib.pl_try_lock(handle, 1) == 0:
        lib.pl_unlock(handle)
        return False
    return True


def _same_holder(seen: ProcessIdentity, recorded: ProcessIdentity) -> bool:
    """Whether the record describes a process the kernel shows holding the lock.

    The pidfs inode is unique for the boot across pid namespaces, so it also
    matches a holder that recorded its pid inside a container.
    """
    if seen.pidfs_ino and seen.pidfs_ino == recorded.pidfs_ino:
        return not (seen.boot_id and recorded.boot_id and seen.boot_id != recorded.boot_id)
    return same_process(seen, recorded)


# -- one look at a lock file ------------------------------------------------------


class Inspection:
    """One look at a lock file: its identity, owner and mode, and its record
    when readable (read only when a holder needs it).  close() when done."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._record: dict[str, Any] | None = None
        self._unread = False  # the record is read only when a holder needs it
        try:
            handle = open_lock_file(path, lib.PL_OPEN_READONLY)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM):
                raise
            # The kernel's lock table needs only the device and inode: a file
            # this user may not read still has a holder pylock can name.
            try:
                st = os.lstat(path)
            except OSError:
                raise exc from None
            if not stat.S_ISREG(st.st_mode):
                raise
            self.dev, self.ino, self.uid, self.mode = st.st_dev, st.st_ino, st.st_uid, st.st_mode
            return
        try:
            info = ffi.new("pl_file_info *")
            check(lib.pl_file_stat(handle, info), path)
            self.dev, self.ino = info.dev, info.ino
            _refuse_pseudo_filesystem(handle, path)
            owner = os.fstat(handle) if os.name != "nt" else None
            self.uid = owner.st_uid if owner else -1
            self.mode = owner.st_mode if owner else 0o666
        except BaseException:
            lib.pl_close(handle)
            raise
        self._handle = handle
        self._unread = True

    def close(self) -> None:
        if self._unread:
            self._unread = False
            lib.pl_close(self._handle)

    @property
    def record(self) -> dict[str, Any] | None:
        if self._unread:
            self._record = _record.read(self._handle)
            self.close()
        return self._record

    def private_to(self, pid: int) -> bool:
        """Whether only pid's user (and root) can write the lock file."""
        ids = _procfs.uids(pid)
        return ids is not None and self.uid == ids[1] and not self.mode & 0o022

    def record_for(self, ident: ProcessIdentity, shared: bool) -> dict[str, Any] | None:
        """The record, if it describes this process holding the lock exclusively:
        a shared holder writes no record, so one found is an older one."""
        rec = self.record
        if rec is None or shared or not _same_holder(ident, _record.identity(rec)):
            return None
        return rec

    def kernel_holder(
        self, pid: int, ident: ProcessIdentity, shared: bool, verified: bool, note: str = ""
    ) -> Holder:
        """A holder the kernel shows, with the record's info if it describes that process."""
        rec = self.record_for(ident, shared)
        private = rec is not None and self.private_to(pid)
        return described_by_kernel(pid, ident, shared, verified, note, rec, private)

    # -- Linux: fdinfo, then /proc/locks for what fdinfo may not show ------------

    def linux_holders(self, every: bool) -> tuple[list[Holder], bool | None]:
        """The holders the kernel shows, verified first, and whether
        /proc/locks lists the lock (None: unreadable).

        /proc/locks answers "is it held" and names each lock's taker; the
        taker's own fdinfo verifies it.  Only every=True, a taker that no
        longer holds it (an inherited descriptor) or an unreadable table
        need the scan of every process's fdinfo.
        """
        table = _procfs.proc_locks(self.dev, self.ino)
        if table is not None and not table:
            return [], False  # the kernel lists no lock on this file
        if table and not every:
            direct = [h for h in map(self._taker, table) if h is not None]
            if direct:
                return direct, True
        found: list[Holder] = []
        for lock in _procfs.holders_of(self.dev, self.ino):
            ident = identity_of(lock.pid)
            if ident is not None:
                found.append(self.kernel_holder(lock.pid, ident, lock.shared, True))
        if table is None:
            return found, None
        seen = {h.pid for h in found}
        for entry in table:
            if entry.pid not in seen:
                seen.add(entry.pid)
                holder = self._taker(entry)
                if holder is not None and not holder.verified:
                    found.append(holder)
        if not found:
            # Listed, yet no process shows it: an inherited descriptor in a
            # process this user cannot see, or a taker in another namespace.
            found.append(Holder(pid=0, note=self._unknown_note(table[0].pid)))
        return found, True

    def _taker(self, entry: _procfs.TableLock) -> Holder | None:
        """The process /proc/locks names, if it still holds the lock: verified
        when its fdinfo shows it, unverified when we may not look."""
        if entry.pid <= 0:
            return None
        ident = identity_of(entry.pid)
        mode = _procfs.pid_lock_mode(entry.pid, self.dev, self.ino)
        if ident is None or mode == "":
            # Gone, or not holding: its descriptor lives on in another process.
            return None
        if mode is not None:
            return self.kernel_holder(entry.pid, ident, mode == "shared", True)
        note = (
            f"unverified: the kernel's lock table names pid {entry.pid}, but pylock "
            "may not inspect that process's descriptors"
        )
        return self.kernel_holder(entry.pid, ident, entry.shared, False, note)

    def _unknown_note(self, pid: int) -> str:
        if pid <= 0:
            return "held by a process outside this pid namespace"
        return f"the kernel's lock table names pid {pid}, which no longer holds it itself"

    # -- elsewhere: the record, checked against the live process -----------------

    def recorded_holder(self) -> tuple[Holder | None, str]:
        """The record's process if it is alive, with a note otherwise.

        On Linux it is the holder only while its fdinfo shows it holding the
        lock exclusively (verified, described by the kernel); where no kernel
        shows holders (macOS, Windows) the record's word, unverified.
        """
        rec = self.record
        if rec is None:
            return None, ""
        recorded = _record.identity(rec)
        now = identity_of(recorded.pid)
        if now is None or not same_process(now, recorded):
            why = "has exited" if now is None else "now belongs to another process"
            return None, f"the record names pid {recorded.pid}, which {why}"
        if not _LINUX:
            return from_record(rec), ""
        mode = _procfs.pid_lock_mode(recorded.pid, self.dev, self.ino)
        if mode is None:
            note = "unverified: pylock may not inspect that process's descriptors"
            return self.kernel_holder(recorded.pid, now, False, False, note), ""
        if mode != "exclusive":
            why = "holds it shared" if mode else "no longer holds it"
            return None, f"the record names pid {recorded.pid}, which {why}"
        return self.kernel_holder(recorded.pid, now, False, True), ""

    def kernel_holders(self) -> list[Holder]:
        """The holders whose own descriptors show the lock (Linux), all verified."""
        return [h for h in self.linux_holders(every=True)[0] if h.verified]

    def held_by_probe(self) -> bool:
        """held_by_probe() on a descriptor of its own (False when the file went away)."""
        try:
            handle = open_lock_file(self.path, lib.PL_OPEN_READONLY)
        except OSError:
            return False
        try:
            return held_by_probe(handle)
        finally:
            lib.pl_close(handle)


def _refuse_pseudo_filesystem(handle: int, path: str) -> None:
    fs = ffi.new("pl_fs_info *")
    if lib.pl_fs_stat(handle, fs) != 0:
        return
    name = _fs.pseudo_filesystem(fs.magic, ffi.string(fs.name).decode())
    if name is not None:
        raise LockFileError(PSEUDO_FS, path, f"it is on {name}, which holds kernel state")


def inspect(path: str) -> Inspection | None:
    """A look at the lock file, or None when there is no file (nobody holds
    it).  A missing directory is an error, as acquire() reports it."""
    if not path:
        raise LockFileError(errno.ENOENT, path, "the path is empty: name a lock file")
    try:
        return Inspection(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
        if not os.path.isdir(os.path.dirname(path) or "."):
            raise LockFileError(errno.ENOENT, path, advice_for(errno.ENOENT)) from None
        return None


def find_holder(path: str, known_held: bool = False) -> Holder | None:
    """The holder of the lock at path, or None when nobody holds it.

    On Linux the kernel's tables answer, and nothing is locked to ask.
    """
    look = inspect(path)
    if look is None:
        return None
    try:
        if _LINUX:
            found, listed = look.linux_holders(every=False)
            if found:
                # The exclusive holder the record describes, else any exclusive one.
                return min(found, key=lambda h: (not h.verified, h.shared, h.info is None))
            if listed is None and (known_held or look.held_by_probe()):
                return Holder(pid=0, note="/proc/locks is unreadable")
            return None
        holder, note = look.recorded_holder()
        if not known_held and not look.held_by_probe():
            return None
        return holder if holder is not None else Holder(pid=0, note=note or "no record")
    finally:
        look.close()


def holders(path: str) -> list[Holder]:
    """Every process the kernel shows holding the lock at path.

    On Linux: every process whose descriptors show the lock (shared holders,
    processes sharing an inherited descriptor), verified, and those listed
    only in /proc/locks (another user's), unverified.  Never empty while the
    kernel lists a lock on the file.  Elsewhere: the record's live process.
    """
    path = os.path.abspath(os.fspath(path))
    look = inspect(path)
    if look is None:
        return []
    try:
        if _LINUX:
            return look.linux_holders(every=True)[0]
        holder, _ = look.recorded_holder()
        if holder is not None and look.held_by_probe():
            return [holder]
        return []
    finally:
        look.close()
