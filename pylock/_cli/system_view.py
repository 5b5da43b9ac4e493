"""What `pylock who --system` shows: the kernel's lock table grouped by file,
every holder and waiter described, the deadlocks, and the filters.

The kernel decides (/proc/locks, fdinfo); a pylock record in a held file
adds only since when and the info, and only for the verified holder it
names.  The record is read through the holder's own descriptor: an O_PATH
open of /proc/PID/fd/FD opens nothing, the file is reopened for reading only
once that shows a regular file, so no FIFO or device is ever opened and no
path is looked up again.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from .._core import procfs
from .._core.lockscan import Mounts, read_table
from .._core.locktable import Descriptor, FileKey, Lock, LockTable, Waiter
from .._core.process import ProcessIdentity, identity_of, same_process
from .._core.waitgraph import Deadlock, deadlocks, edges, graph
from .._lock import record

# Where a record is read: filesystems the kernel serves itself.  On a
# network filesystem or FUSE a read waits for a server or a daemon, which
# could hold the listing up for good.
# fmt: off
LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "f2fs", "zfs", "bcachefs",
    "jfs", "reiserfs", "nilfs2", "vfat", "msdos", "exfat", "hfsplus", "ntfs3", "overlay",
    "squashfs", "erofs", "iso9660", "udf",
})
# fmt: on


@dataclass
class Process:
    pid: int
    program: str
    argv: tuple[str, ...]
    uid: int | None
    user: str


@dataclass
class HolderView:
    """A process holding a lock; pid 0 when no process pylock can see shows it."""

    pid: int
    fds: list[int] = field(default_factory=list)
    verified: bool = False
    note: str = ""
    since: float | None = None  # from the holder's own pylock record
    info: dict[str, Any] | None = None
    record_private: bool = False


@dataclass
class LockView:
    lock: Lock
    holders: list[HolderView]


@dataclass
class WaiterView:
    waiter: Waiter
    waits_for: list[int]  # every process holding a lock in its way


@dataclass
class FileView:
    key: FileKey | None
    path: str | None  # None: no process this user may inspect reveals it
    locks: list[LockView]
    waiters: list[WaiterView]

    known_pids: set[int] | None = field(default=None, repr=False)

    def pids(self) -> set[int]:
        """Every process holding or waiting (worked out once: the view is built by then)."""
        if self.known_pids is None:
            found = {h.pid for view in self.locks for h in view.holders if h.pid > 0}
            found |= {w.waiter.pid for w in self.waiters if w.waiter.pid > 0}
            self.known_pids = found
        return self.known_pids


@dataclass
class Snapshot:
    taken: float
    files: list[FileView]
    processes: dict[int, Process]
    deadlocks: list[Deadlock]
    paths: dict[FileKey, str]
    hidden: set[int]  # processes holding or waiting whose descriptors are hidden
    rendered: dict[tuple[str, int], Any] = field(default_factory=dict)  # per process, once
    clock: bool = True  # False: no figure that changes as time passes (held_for)


@dataclass
class Filter:
    """Files shown: under the path prefix, and held or waited for by one of
    the pids and by a process of one of the users (each filter when given)."""

    prefix: str | None = None
    pids: frozenset[int] | None = None
    uids: frozenset[int] | None = None

    def shows(self, view: FileView, processes: dict[int, Process]) -> bool:
        if self.prefix is not None:
            top = self.prefix.rstrip("/") or "/"
            if view.path is None or not (
                view.path == top or view.path.startswith(top if top == "/" else top + "/")
            ):
                return False
        pids = view.pids()
        if self.pids is not None and not pids & self.pids:
            return False
        if self.uids is not None:
            return any(processes[pid].uid in self.uids for pid in pids if pid in processes)
        return True


def snapshot(wanted: Filter) -> Snapshot:
    """The host's locks now, as wanted shows them (OSError: no /proc/locks)."""
    table = read_table()
    taken = time.time()
    found_edges = edges(table)
    waits_for: dict[int, list[int]] = {}
    for edge in found_edges:
        waits_for.setdefault(id(edge.waiter), []).append(edge.holder)
    files: dict[FileKey | None, FileView] = {}
    mounts = Mounts()
    for lock in table.locks:
        view = files.setdefault(lock.file, FileView(lock.file, _path(table, lock.file), [], []))
        view.locks.append(LockView(lock, _holders(table, lock, mounts)))
        for waiter in lock.waiters:
            held_by = sorted(set(waits_for.get(id(waiter), [])))
            view.waiters.append(WaiterView(waiter, held_by))
    processes = _processes(files.values())
    shown = [v for v in files.values() if wanted.shows(v, processes)]
    for view in shown:
        view.locks.sort(key=lambda v: (v.lock.kind, v.lock.start, v.lock.mode, v.lock.taker))
    shown.sort(key=lambda v: (v.path is None, v.path or "", v.key or (0, 0, 0)))
    keys = {v.key for v in shown}
    cycles = deadlocks(graph(found_edges))
    found = [d for d in cycles if any(e.lock.file in keys for e in d.cycle)]
    hidden = {pid for v in shown for pid in v.pids() if pid in table.hidden}
    return Snapshot(taken, shown, processes, found, table.paths, hidden)


def _path(table: LockTable, key: FileKey | None) -> str | None:
    return None if key is None else table.paths.get(key)


def _holders(table: LockTable, lock: Lock, mounts: Mounts) -> list[HolderView]:
    by_pid: dict[int, HolderView] = {}
    for where in lock.holders:
        view = by_pid.setdefault(where.pid, HolderView(where.pid, verified=True))
        view.fds.append(where.fd)
    if by_pid:
        found = sorted(by_pid.values(), key=lambda h: h.pid)
        where = lock.holders[0]
        mount = mounts.of(where)
        local = mount is not None and mount[2] in LOCAL_FILESYSTEMS
        if lock.kind == "FLOCK" and lock.mode == "WRITE" and lock.file is not None and local:
            _add_record(found, where, lock.file)
        return found
    pids = table.holding_pids(lock)
    if lock.kind == "POSIX" and pids:
        # A POSIX lock's owner is the process /proc/locks names.
        return [HolderView(pids[0], verified=True)]
    if pids:
        note = "the kernel's lock table names it; pylock may not inspect its descriptors"
        return [HolderView(pids[0], note=note)]
    note = "no descriptor pylock can see holds it (a file mapping, a descriptor in flight)"
    if lock.taker > 0:
        note = f"taken by pid {lock.taker}; {note}"
    return [HolderView(0, note=note)]


def _add_record(holders: list[HolderView], where: Descriptor, key: FileKey) -> None:
    """Since when and info from the file's pylock record, for the holder it names."""
    found = _read_record(where, key)
    if found is None:
        return
    rec, owner_uid, mode = found
    for holder in holders:
        if holder.pid != rec["pid"]:
            continue
        now = identity_of(holder.pid)
        recorded = ProcessIdentity(
            rec["pid"], rec.get("start_time", 0), rec.get("boot_id", ""), rec.get("pidfs_ino", 0)
        )
        if now is not None and same_process(now, recorded):
            holder.since = rec.get("acquired_at")
            holder.info = rec.get("info")
            private = owner_uid == _euid(holder.pid) and not mode & 0o022
            holder.record_private = private


def _read_record(where: Descriptor, key: FileKey) -> tuple[dict[str, Any], int, int] | None:
    """(record, file owner, file mode) of the regular file behind where's
    descriptor, or None: not a regular file, not this lock's, no record."""
    try:
        handle = os.open(f"{procfs.PROC}/{where.pid}/fd/{where.fd}", procfs.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(handle)
        # The inode alone: btrfs shows a subvolume's device where /proc/locks
        # shows the filesystem's.
        if not stat.S_ISREG(st.st_mode) or st.st_ino != key[2] or st.st_size == 0:
            return None
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    finally:
        os.close(handle)
    try:
        raw = os.pread(fd, record.MAX_RECORD, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    rec = record.parse(raw)
    return None if rec is None else (rec, st.st_uid, st.st_mode)


def _processes(files: Any) -> dict[int, Process]:
    users: dict[int, str] = {}
    found: dict[int, Process] = {}
    for view in files:
        for pid in sorted(view.pids()):
            if pid not in found:
                program, argv = procfs.command_of(pid)
                uid = _euid(pid)
                found[pid] = Process(pid, program, argv, uid, _user(uid, users))
    return found


def _euid(pid: int) -> int | None:
    found = procfs.uids(pid)
    return None if found is None else found[1]


def _user(uid: int | None, known: dict[int, str]) -> str:
    if uid is None:
        return ""
    if uid not in known:
        try:
            import pwd

            known[uid] = pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            known[uid] = str(uid)
    return known[uid]
