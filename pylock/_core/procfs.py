"""Who holds a lock, as the Linux kernel shows it in /proc/<pid>/fdinfo and
/proc/locks.  Reading them takes no lock, so looking never disturbs anyone.

An fdinfo file carries a "lock:" line for each lock owned by that open file
description, so it names the real holders: the processes sharing an
inherited descriptor, shared holders, holders inside pid namespaces.  Only
the owner of a process (or root) may read its fdinfo.  /proc/locks is
readable by everyone and lists every lock, but its pid column names whoever
took the lock, which goes wrong after fork: it answers "is anyone holding
it" and names holders whose fdinfo this user may not read, never verified.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

PROC = "/proc"


class FdLock(NamedTuple):
    pid: int
    fd: int
    shared: bool


class TableLock(NamedTuple):
    """A line of /proc/locks: pid 0 when the taker is outside our pid namespace."""

    pid: int
    shared: bool


def _lock_key(dev: int, ino: int) -> str:
    # Spaces on both sides: a major of 0x103 must not match one of 0x03.
    return f" {os.major(dev):02x}:{os.minor(dev):02x}:{ino} "


def _fd_locks(pid: int, fd_name: str, key: str) -> bool | None:
    """True/False (shared or not) when this descriptor holds a flock on key."""
    try:
        with open(f"{PROC}/{pid}/fdinfo/{fd_name}", "rb") as f:
            text = f.read(8192)
    except OSError:
        return None
    if b"lock:" not in text:
        return None
    for line in text.decode("ascii", "replace").splitlines():
        if line.startswith("lock:") and "FLOCK" in line and key in line:
            return " READ " in line
    return None


def pid_lock_mode(pid: int, dev: int, ino: int) -> str | None:
    """How pid holds a flock on (dev, ino): "exclusive", "shared" or "" (not
    at all), as the kernel shows it; None when we may not look (another
    user's process without ptrace rights) or it has gone.
    """
    key = _lock_key(dev, ino)
    try:
        fds = os.listdir(f"{PROC}/{pid}/fdinfo")
    except OSError:
        return None
    modes = {_fd_locks(pid, fd, key) for fd in fds}
    if False in modes:
        return "exclusive"
    return "shared" if True in modes else ""


def pid_holds(pid: int, dev: int, ino: int) -> bool | None:
    """Whether pid has a descriptor that owns a flock on (dev, ino); None
    when we may not look."""
    mode = pid_lock_mode(pid, dev, ino)
    return None if mode is None else mode != ""


def holders_of(dev: int, ino: int) -> Iterator[FdLock]:
    """Every (pid, fd) whose open file description owns a flock on (dev, ino)."""
    key = _lock_key(dev, ino)
    try:
        pids = [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return
    for pid in sorted(pids):
        try:
            fds = os.listdir(f"{PROC}/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            shared = _fd_locks(pid, fd, key)
            if shared is not None:
                yield FdLock(pid, int(fd), shared)


def proc_locks(dev: int, ino: int) -> list[TableLock] | None:
    """The flocks /proc/locks lists on (dev, ino) (not the blocked waiters'
    "->" lines); None when /proc/locks cannot be read."""
    key = _lock_key(dev, ino).encode()
    found = []
    try:
        with open(f"{PROC}/locks", "rb") as f:
            lines = [line for line in f if key in line]
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"
        words = line.split()
        if len(words) < 6 or words[1] != b"FLOCK" or words[5] != key.strip():
            continue
        try:
            pid = int(words[4])
        except ValueError:
            continue
        found.append(TableLock(max(pid, 0), words[3] == b"READ"))
    return found


def _read(pid: int, name: str) -> bytes:
    try:
        with open(f"{PROC}/{pid}/{name}", "rb") as f:
            return f.read(8192)
    except OSError:
        return b""


def command_of(pid: int) -> tuple[str, tuple[str, ...]]:
    """(program, argv) of a process as the kernel shows them: argv from
    cmdline, the program its first word's name, or comm when cmdline is empty
    (a kernel thread, a zombie)."""
    argv = tuple(os.fsdecode(part) for part in _read(pid, "cmdline").split(b"\0") if part)
    if argv:
        return os.path.basename(argv[0]), argv
    return os.fsdecode(_read(pid, "comm").rstrip(b"\n")), ()


def euid_of(pid: int) -> int | None:
    """pid's effective uid, from its status; None when it cannot be read."""
    for line in _read(pid, "status").splitlines():
        if line.startswith(b"Uid:"):
            try:
                return int(line.split()[2])
            except (IndexError, ValueError):
                return None
    return None
