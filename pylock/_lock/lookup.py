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
from .._core.errors import NOT_REGULAR, SYMLINK, LockFileError, advice_for
from .._core.native import check, ffi, lib, open_lock_file
from .._core.peek import Peek, close_read
from .._core.process import ProcessIdentity, identity_of, same_process
from . import record as _record
from .holder import Holder, described_by_kernel, from_record
from .kernel_view import KernelView

_LINUX = sys.platform.startswith("linux")


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
    when readable (read only when a holder needs it).  close() when done.

    On Linux the name is looked at with O_PATH (pylock._core.peek): nothing
    but a regular file is ever opened, so looking never releases a writer
    blocked on a FIFO or opens a device, even one swapped in meanwhile.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._record: dict[str, Any] | None = None
        self._unread = False  # the record is read only when a holder needs it
        if _LINUX:
            self._look_linux(path)
            return
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
            self.key = _procfs.LockKey(st.st_dev, st.st_ino)
            self.uid, self.mode = st.st_uid, st.st_mode
            return
        try:
            info = ffi.new("pl_file_info *")
            check(lib.pl_file_stat(handle, info), path)
            self.key = _procfs.LockKey(info.dev, info.ino)
            _refuse_pseudo_filesystem(handle, path)
            owner = os.fstat(handle) if os.name != "nt" else None
            self.uid = owner.st_uid if owner else -1
            self.mode = owner.st_mode if owner else 0o666
        except BaseException:
            lib.pl_close(handle)
            raise
        self._handle = handle
        self._unread = True

    def _look_linux(self, path: str) -> None:
        with Peek(path) as look:
            _refuse_kind(look.st.st_mode, path)
            _refuse_pseudo_filesystem(look.fd, path)
            self.key = look.key()
            self.uid, self.mode = look.st.st_uid, look.st.st_mode
            try:
                self._handle = look.open_to_read()
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM):
                    raise
                # The kernel's lock table needs only the device and inode: a
                # file this user may not read still has a holder pylock can name.
                return
            self._unread = True

    @property
    def dev(self) -> int:
        return int(self.key.dev)

    @property
    def ino(self) -> int:
        return int(self.key.ino)

    def close(self) -> None:
        if self._unread:
            self._unread = False
            if _LINUX:
                close_read(self._handle)
            else:
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

    def linux_holders(self, every: bool) -> tuple[list[Holder], bool | None]:
        """The holders the kernel shows, verified first, and whether
        /proc/locks lists the lock (None: unreadable): KernelView.holders,
        each holder with what the record says of it."""
        return KernelView(self.key, self.kernel_holder).holders(every)

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
        mode = _procfs.pid_lock_mode(recorded.pid, *self.key)
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
            if _LINUX:
                with Peek(self.path) as look:
                    fd = look.open_to_read()
                try:
                    return held_by_probe(fd)
                finally:
                    close_read(fd)
            handle = open_lock_file(self.path, lib.PL_OPEN_READONLY)
        except OSError:
            return False
        try:
            return held_by_probe(handle)
        finally:
            lib.pl_close(handle)


def _refuse_kind(mode: int, path: str) -> None:
    """The LockFileError pl_open gives for what is not a regular file."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISLNK(mode):
        raise LockFileError(SYMLINK, path, advice_for(SYMLINK))
    if stat.S_ISDIR(mode):
        raise LockFileError(errno.EISDIR, path, advice_for(errno.EISDIR))
    raise LockFileError(NOT_REGULAR, path, advice_for(NOT_REGULAR))


def _refuse_pseudo_filesystem(handle: int, path: str) -> None:
    _fs.refuse_unfit_filesystem(handle, path, network=False)


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
            raise LockFileError(errno.ENOENT, path, advice_for(errno.ENOENT, path)) from None
        return None


def _preferred(holder: Holder) -> tuple[bool, bool, bool]:
    """The exclusive holder the record describes first, then any verified one."""
    return (not holder.verified, holder.shared, holder.info is None)


def lock_holders(path: str, every: bool = False, known_held: bool = False) -> list[Holder]:
    """Who holds the lock at path, best first: [] when free.

    every=False: one holder per lock (the exclusive holder, or each shared
    one); every=True: also each process sharing a holder's descriptor.  On
    Linux the kernel's tables answer, and nothing is locked to ask.
    """
    look = inspect(path)
    if look is None:
        return []
    try:
        if _LINUX:
            found, listed = look.linux_holders(every)
            if found:
                return sorted(found, key=_preferred)
            if listed is None and (known_held or look.held_by_probe()):
                return [Holder(pid=0, note="/proc/locks is unreadable")]
            return []
        holder, note = look.recorded_holder()
        if not known_held and not look.held_by_probe():
            return []
        return [holder if holder is not None else Holder(pid=0, note=note or "no record")]
    finally:
        look.close()


def find_holder(path: str, known_held: bool = False) -> Holder | None:
    """The holder of the lock at path, or None when nobody holds it.

    On Linux the kernel's tables answer, and nothing is locked to ask.
    """
    found = lock_holders(path, known_held=known_held)
    return found[0] if found else None


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
