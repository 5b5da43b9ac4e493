"""Who holds a lock, as the Linux kernel shows it in /proc/<pid>/fdinfo.

An fdinfo file carries a "lock:" line for each lock owned by that open file
description, so it names the real holders: the processes sharing an
inherited descriptor, shared holders, holders inside pid namespaces.  The
pid column of /proc/locks names whoever took the lock, which goes wrong
after fork, so it is only used to answer "is anyone holding it".
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


def pid_holds(pid: int, dev: int, ino: int) -> bool | None:
    """Whether pid has a descriptor that owns a flock on (dev, ino).

    True or False when the kernel showed us; None when we may not look
    (another user's process without ptrace rights) or it has gone.
    """
    key = _lock_key(dev, ino)
    try:
        fds = os.listdir(f"{PROC}/{pid}/fdinfo")
    except OSError:
        return None
    return any(_fd_locks(pid, fd, key) is not None for fd in fds)


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


def listed_in_proc_locks(dev: int, ino: int) -> bool | None:
    """Whether /proc/locks lists a flock on (dev, ino); None if unreadable."""
    key = _lock_key(dev, ino).encode()
    try:
        with open(f"{PROC}/locks", "rb") as f:
            return any(key in line and b"FLOCK" in line for line in f)
    except OSError:
        return None
