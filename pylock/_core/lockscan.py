"""The kernel's lock table with the processes behind it: one pass over /proc.

Holders come from the "lock:" lines of /proc/PID/fdinfo/FD: a granted lock
shows on the descriptors of the open file that owns it (every process
sharing an inherited descriptor).  A lock's path is the readlink of such a
descriptor, else of any descriptor whose fdinfo names the same inode (the
mount gives the device), else a file mapping of the process the table
names.  A blocked OFD request, which /proc/locks shows with pid -1, is named
by the thread /proc/PID/task/TID/syscall shows blocked in F_OFD_SETLKW on
that file.  Nothing but /proc is opened: a FIFO or device is never touched.
Another user's descriptors are hidden without ptrace rights; their locks
keep the table's pid and MAJ:MIN:INODE, nothing invented.
"""

from __future__ import annotations

import os

from .locktable import (
    Descriptor,
    FileKey,
    Lock,
    LockTable,
    Waiter,
    group,
    parse_line,
    read_proc_locks,
)
from .procfs import PROC


def _read(path: str, limit: int = 65536) -> bytes | None:
    """A /proc file, at most limit bytes, without Python's buffered file
    objects (thousands are read per listing); None when it cannot be read.
    The kernel hands out a long one (maps, mountinfo) a page or so at a
    time: the reads go on until the end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        left = limit
        while left > 0:
            data = os.read(fd, left)
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _field(data: bytes, name: bytes) -> int | None:
    """An integer field ("ino:\\t123") of an fdinfo file."""
    at = data.find(b"\n" + name + b":\t")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = data.find(b"\n", start)
    try:
        return int(data[start : end if end >= 0 else len(data)])
    except ValueError:
        return None


class _Scan:
    """One pass over every process's descriptors."""

    def __init__(self, wanted: set[int]) -> None:
        self.wanted = wanted  # inodes of locked files (to name files no lock line shows)
        self.held: dict[tuple[object, ...], list[Descriptor]] = {}
        self.paths: dict[FileKey, str] = {}
        self.by_inode: list[tuple[Descriptor, int, int]] = []  # (descriptor, mnt_id, ino)
        self.hidden: set[int] = set()

    def process(self, pid: int) -> None:
        base = f"{PROC}/{pid}"
        try:
            names = os.listdir(f"{base}/fdinfo")
        except PermissionError:
            self.hidden.add(pid)
            return
        except OSError:
            return  # gone meanwhile
        for name in names:
            data = _read(f"{base}/fdinfo/{name}")
            if not data:
                continue
            if b"\nlock:" in data:
                self._locks(Descriptor(pid, int(name)), data)
                continue
            ino = _field(data, b"ino")
            if ino is not None and ino in self.wanted:
                mnt = _field(data, b"mnt_id")
                self.by_inode.append((Descriptor(pid, int(name)), mnt or 0, ino))

    def _locks(self, where: Descriptor, data: bytes) -> None:
        for raw in data.split(b"\n"):
            if not raw.startswith(b"lock:"):
                continue
            line = parse_line(raw[5:].lstrip())
            if line is None:
                continue
            self.held.setdefault(line.key(), []).append(where)
            if line.file is not None and line.file not in self.paths:
                link = readlink_fd(where)
                if link is not None:
                    self.paths[line.file] = link


def readlink_fd(where: Descriptor) -> str | None:
    try:
        return os.fsdecode(os.readlink(f"{PROC}/{where.pid}/fd/{where.fd}".encode()))
    except OSError:
        return None


def _pids() -> list[int]:
    return sorted(int(name) for name in os.listdir(PROC) if name.isdigit())


def read_table() -> LockTable:
    """The whole table now: raises OSError when /proc/locks cannot be read."""
    lines = read_proc_locks()
    locks, waiters = group(lines)
    scan = _Scan({line.file[2] for line in lines if line.file is not None})
    for pid in _pids():
        scan.process(pid)
    for lock in locks:
        lock.holders = scan.held.get(lock.key(), [])
    _name_ofd_waiters(waiters)
    files = {line.file for line in lines if line.file is not None}
    missing = files - scan.paths.keys()
    if missing:
        _name_by_inode(scan, missing)
        _name_by_mapping(scan, locks, waiters, files - scan.paths.keys())
    return LockTable(locks, waiters, scan.paths, scan.hidden)


def _name_by_inode(scan: _Scan, missing: set[FileKey]) -> None:
    """Name files no lock line names (a waiter's own descriptor, a holder
    whose lock shows elsewhere) from descriptors on the same inode; fdinfo
    gives the inode and the mount, the mount gives the device."""
    devices: dict[int, tuple[int, int]] = {}
    for where, mnt, ino in scan.by_inode:
        if mnt not in devices:
            devices.update(_mounts(where.pid))
        device = devices.get(mnt)
        if device is None:
            continue
        key = (device[0], device[1], ino)
        if key in missing and key not in scan.paths:
            link = readlink_fd(where)
            if link is not None:
                scan.paths[key] = link


# fcntl's number where /proc/PID/syscall shows it (native processes only).
_FCNTL = {"x86_64": 72, "aarch64": 25}
_F_OFD_SETLKW = 38


def _name_ofd_waiters(waiters: list[Waiter]) -> None:
    """/proc/locks names no process for a blocked OFD request (pid -1); a
    thread blocked in fcntl(F_OFD_SETLKW) on a descriptor of that file is
    it.  Named only where that is unambiguous: as many such threads as
    requests on the file, and requests that cannot be told apart anyway."""
    anonymous: dict[FileKey, list[Waiter]] = {}
    for want in waiters:
        if want.kind == "OFDLCK" and want.pid < 0 and want.file is not None:
            anonymous.setdefault(want.file, []).append(want)
    number = _FCNTL.get(os.uname().machine)
    if not anonymous or number is None:
        return
    blocked: dict[FileKey, list[int]] = {}
    devices: dict[int, tuple[int, int]] = {}
    for pid in _pids():
        for fd in _blocked_in_ofd_wait(pid, number):
            key = _descriptor_file(Descriptor(pid, fd), devices)
            if key in anonymous:
                blocked.setdefault(key, []).append(pid)
    for key, wants in anonymous.items():
        pids = sorted(blocked.get(key, []))
        alike = len({(w.mode, w.start, w.end) for w in wants}) == 1
        if len(pids) == len(wants) and alike:
            for want, pid in zip(wants, pids):
                want.pid = pid
                want.pid_from_syscall = True


def _blocked_in_ofd_wait(pid: int, number: int) -> list[int]:
    """The descriptors pid's threads are blocked on in fcntl(F_OFD_SETLKW)
    ("72 0x3 0x26 0x7ffd..." in /proc/PID/task/TID/syscall)."""
    try:
        tids = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return []
    found = []
    for tid in tids:
        words = (_read(f"{PROC}/{pid}/task/{tid}/syscall", 512) or b"").split()
        try:
            if len(words) > 2 and int(words[0]) == number and int(words[2], 16) == _F_OFD_SETLKW:
                found.append(int(words[1], 16))
        except ValueError:
            continue
    return found


def _descriptor_file(where: Descriptor, devices: dict[int, tuple[int, int]]) -> FileKey | None:
    """The (major, minor, inode) of where's file, from its fdinfo and mountinfo."""
    data = _read(f"{PROC}/{where.pid}/fdinfo/{where.fd}") or b""
    ino, mnt = _field(data, b"ino"), _field(data, b"mnt_id")
    if ino is None or mnt is None:
        return None
    if mnt not in devices:
        devices.update(_mounts(where.pid))
    device = devices.get(mnt)
    return None if device is None else (device[0], device[1], ino)


def _mounts(pid: int) -> dict[int, tuple[int, int]]:
    """mount id -> (major, minor) from pid's mountinfo ("36 35 98:0 / /mnt ...")."""
    data = _read(f"{PROC}/{pid}/mountinfo", 1 << 22) or b""
    found = {}
    for line in data.splitlines():
        words = line.split(b" ", 3)
        if len(words) < 3:
            continue
        major, _, minor = words[2].partition(b":")
        try:
            found[int(words[0])] = (int(major), int(minor))
        except ValueError:
            continue
    return found


def _name_by_mapping(
    scan: _Scan, locks: list[Lock], waiters: list[Waiter], missing: set[FileKey]
) -> None:
    """A flock lives on while a mapping of its open file does: name the file
    from the maps of the processes the table names for it."""
    named = [(lock.file, lock.taker) for lock in locks]
    named += [(want.file, want.pid) for want in waiters]
    pids: dict[FileKey, set[int]] = {}
    for key, pid in named:
        if key is not None and key in missing and pid > 0:
            pids.setdefault(key, set()).add(pid)
    for key, candidates in pids.items():
        for pid in sorted(candidates):
            name = mapped_path(pid, key)
            if name is not None:
                scan.paths[key] = name
                break


def mapped_path(pid: int, key: FileKey) -> str | None:
    """The path of a file pid maps: the readlink of its map_files entry (root
    only), else the name /proc/PID/maps shows (the kernel escapes a newline
    in it as \\012)."""
    data = _read(f"{PROC}/{pid}/maps", 1 << 24)
    if not data:
        return None
    device = f"{key[0]:02x}:{key[1]:02x}".encode()
    for line in data.splitlines():
        words = line.split(None, 5)
        if len(words) < 6 or words[3] != device or words[4] != str(key[2]).encode():
            continue
        try:
            link = os.readlink(f"{PROC}/{pid}/map_files/".encode() + words[0])
            return os.fsdecode(link)
        except OSError:
            return os.fsdecode(words[5])
    return None
