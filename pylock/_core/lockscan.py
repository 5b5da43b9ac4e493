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
    file_key,
    group,
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


def _read_one(name: str, directory: int) -> bytes | None:
    """An fdinfo file: the kernel writes it whole into the first read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
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
        self.held: dict[tuple[bytes, ...], list[Descriptor]] = {}
        self.named: dict[bytes, str] = {}  # b"MAJ:MIN:INODE" -> path
        self.paths: dict[FileKey, str] = {}
        self.by_inode: list[tuple[Descriptor, int]] = []  # (descriptor, inode)
        self.hidden: set[int] = set()

    def process(self, pid: int) -> None:
        # Opened relative to the directory's descriptor: thousands of opens
        # per listing, each spared the walk of /proc/PID/fdinfo.
        try:
            directory = os.open(f"{PROC}/{pid}/fdinfo", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except PermissionError:
            self.hidden.add(pid)
            return
        except OSError:
            return  # gone meanwhile
        try:
            names = os.listdir(directory)
        except PermissionError:
            self.hidden.add(pid)
            names = []
        except OSError:
            names = []
        try:
            for name in names:
                data = _read_one(name, directory)
                if not data:
                    continue
                if b"\nlock:" in data:
                    self._locks(Descriptor(pid, int(name), _field(data, b"mnt_id") or 0), data)
                    continue
                ino = _field(data, b"ino")
                if ino is not None and ino in self.wanted:
                    where = Descriptor(pid, int(name), _field(data, b"mnt_id") or 0)
                    self.by_inode.append((where, ino))
        finally:
            os.close(directory)

    def _locks(self, where: Descriptor, data: bytes) -> None:
        # "lock:\t1: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF": the words
        # from the kind on are those of the lock's own line in /proc/locks.
        for raw in data.split(b"\n"):
            if not raw.startswith(b"lock:"):
                continue
            words = tuple(raw.split()[2:9])
            if len(words) != 7:
                continue
            self.held.setdefault(words, []).append(where)
            if words[4] not in self.named:
                link = readlink_fd(where)
                if link is not None:
                    self.named[words[4]] = link

    def name_files(self) -> None:
        for devino, link in self.named.items():
            try:
                key = file_key(devino)
            except ValueError:
                continue
            if key is not None:
                self.paths.setdefault(key, link)


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
    scan.name_files()
    for lock in locks:
        lock.holders = scan.held.get(lock.words, [])
    _name_ofd_waiters(waiters, _descriptors_on(scan, locks))
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
    mounts = Mounts()
    for where, ino in scan.by_inode:
        mount = mounts.of(where)
        if mount is None:
            continue
        key = (mount[0], mount[1], ino)
        if key in missing and key not in scan.paths:
            link = readlink_fd(where)
            if link is not None:
                scan.paths[key] = link


# fcntl's number where /proc/PID/syscall shows it (native processes only).
_FCNTL = {"x86_64": 72, "aarch64": 25}
_F_OFD_SETLKW = 38


def _descriptors_on(scan: _Scan, locks: list[Lock]) -> dict[int, set[int]]:
    """inode -> the processes with a descriptor on it (holding a lock there or not)."""
    found: dict[int, set[int]] = {}
    for where, ino in scan.by_inode:
        found.setdefault(ino, set()).add(where.pid)
    for lock in locks:
        if lock.file is not None:
            found.setdefault(lock.file[2], set()).update(where.pid for where in lock.holders)
    return found


def _name_ofd_waiters(waiters: list[Waiter], on: dict[int, set[int]]) -> None:
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
    mounts = Mounts()
    # Only a process with a descriptor on the file can be blocked on it.
    candidates = set().union(*(on.get(key[2], set()) for key in anonymous))
    for pid in sorted(candidates):
        for fd in _blocked_in_ofd_wait(pid, number):
            key = _descriptor_file(pid, fd, mounts)
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


def _descriptor_file(pid: int, fd: int, mounts: Mounts) -> FileKey | None:
    """The (major, minor, inode) of pid's descriptor fd, from its fdinfo and mountinfo."""
    data = _read(f"{PROC}/{pid}/fdinfo/{fd}") or b""
    ino, mount_id = _field(data, b"ino"), _field(data, b"mnt_id")
    if ino is None or mount_id is None:
        return None
    mount = mounts.of(Descriptor(pid, fd, mount_id))
    return None if mount is None else (mount[0], mount[1], ino)


class Mounts:
    """Mount id -> (major, minor, filesystem type), from mountinfo: read once
    per process asked about whose mount is not known yet (a process in
    another mount namespace has mounts of its own)."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[int, int, str]] = {}
        self._read: set[int] = set()

    def of(self, where: Descriptor) -> tuple[int, int, str] | None:
        if where.mount not in self._known and where.pid not in self._read:
            self._read.add(where.pid)
            self._known.update(_mounts(where.pid))
        return self._known.get(where.mount)


def _mounts(pid: int) -> dict[int, tuple[int, int, str]]:
    """From pid's mountinfo ("36 35 98:0 /mnt1 /mnt/parent rw master:1 - ext3 /dev/root rw")."""
    data = _read(f"{PROC}/{pid}/mountinfo", 1 << 22) or b""
    found = {}
    for line in data.splitlines():
        words = line.split(b" ", 3)
        _, dash, rest = line.partition(b" - ")
        if len(words) < 3 or not dash:
            continue
        major, _, minor = words[2].partition(b":")
        try:
            found[int(words[0])] = (int(major), int(minor), rest.split(b" ", 1)[0].decode())
        except (ValueError, UnicodeDecodeError):
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
