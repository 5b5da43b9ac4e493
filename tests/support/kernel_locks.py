"""What the kernel says about a lock file, read from outside pylock.

/proc/locks (Linux) lists every flock; a waiter shows as a "->" line
under the lock it waits for.  util-linux flock(1) is a second, independent
flock user.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable

from tests.support import LINUX


def lock_key(path: str) -> str:
    """The "MAJ:MIN:INODE " column /proc/locks uses for the file at path."""
    st = os.stat(path)
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "


def granted_pids(path: str) -> list[int]:
    """The pid column of the flocks /proc/locks shows granted on path's inode
    ("N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"): whoever took each,
    which is not always who holds it now."""
    key = lock_key(path)
    pids = []
    with open("/proc/locks") as f:
        for line in f:
            if key in line and " -> " not in line and "FLOCK" in line:
                pids.append(int(line.split()[4]))
    return pids


def blocked_waiters(path: str) -> list[int]:
    """Pids the kernel shows waiting on path's inode, once per waiter: blocked
    in flock, or (an async waiter of pylock's, without a thread) watching the
    file for its release with inotify, once per watch.

    A "->" line reads "N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF":
    the pid is the fourth field after the arrow.
    """
    key = lock_key(path)
    pids = []
    with open("/proc/locks") as f:
        for line in f:
            if key in line and " -> " in line and "FLOCK" in line:
                fields = line.split()
                pids.append(int(fields[fields.index("->") + 4]))
    for name in os.listdir("/proc"):
        if name.isdigit():
            pids += [int(name)] * hint_watches(path, int(name))
    return pids


def hint_watches(path: str, pid: int) -> int:
    """How many inotify watches of pid are on path's file: a task of pid's
    that waits for the lock without a thread (pylock._core.hints) watches
    the file instead of blocking in flock, one watch per event loop."""
    st = os.stat(path)
    sdev = (os.major(st.st_dev) << 20) | os.minor(st.st_dev)  # the kernel's own dev_t
    want = f"ino:{st.st_ino:x} sdev:{sdev:x} "
    found = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                found += sum(1 for line in f if line.startswith("inotify ") and want in line)
        except OSError:
            continue
    return found


def sleeps_in_epoll(pid: int) -> bool:
    """Whether a thread of pid sleeps in epoll_wait: an event loop with
    nothing to run (every task of it parked on a future)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                if f.read() in ("do_epoll_wait", "ep_poll"):
                    return True
        except OSError:
            continue
    return False


def waiting_in_kernel(path: str, pid: int) -> int:
    """How many waits of pid the kernel shows on path: blocked in flock, or
    watching the file for its release from a loop that sleeps in epoll (a
    watch alone is set up before the task last tries the lock).  In this
    process, whose loop is running the caller, a watch is enough: the
    caller's next await lets the waiting task finish its setup."""
    waits = blocked_waiters(path).count(pid)
    if pid != os.getpid() and hint_watches(path, pid) and not sleeps_in_epoll(pid):
        waits -= hint_watches(path, pid)  # watching, but maybe not parked yet
    return waits


def wait_blocked(path: str, pid: int, count: int = 1, timeout: float = 20.0) -> None:
    """Return once count waiters of pid are blocked in the kernel on path
    (in flock, or watching the file for its release)."""
    deadline = time.monotonic() + timeout
    while waiting_in_kernel(path, pid) < count:
        assert time.monotonic() < deadline, f"pid {pid} never blocked on {path}"
        time.sleep(0.001)  # re-reading kernel state, not standing in for a signal


async def until_blocked(path: str, pid: int, timeout: float = 20.0) -> None:
    """wait_blocked for a coroutine: the event loop keeps running meanwhile."""
    deadline = time.monotonic() + timeout
    while not waiting_in_kernel(path, pid):
        assert time.monotonic() < deadline, f"pid {pid} never blocked on {path}"
        await asyncio.sleep(0.0005)  # re-reading kernel state, not standing in for a signal


def flock_n(path: str, *args: str) -> int:
    """Exit status of `flock -n [args] path true`: 0 taken, 1 refused."""
    return subprocess.run(["flock", "-n", *args, path, "true"]).returncode


def free_from_elsewhere(path: str) -> bool:
    """Whether another process can take the lock right now (util-linux flock -n)."""
    return flock_n(path) == 0


def free_now(path: str) -> bool:
    """Whether an exclusive flock(2) on path would be granted right now (nothing
    written): free_from_elsewhere without starting a process."""
    import fcntl  # not on Windows, where this module is imported too

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    finally:
        os.close(fd)


def open_fds() -> set[int]:
    """This process's open descriptors."""
    return {int(name) for name in os.listdir("/proc/self/fd")}


# Where the kernel shows no waiters (macOS, Windows), a waiter is taken to be
# waiting once it has stayed waiting, with the lock held elsewhere, for this
# long: the one bounded observation a test can make of "not yet".
WAITING_WINDOW = 0.5


def wait_until_waiting(
    path: str, still_waiting: Callable[[], bool], pid: int | None = None, timeout: float = 20.0
) -> None:
    """Return once process pid (default: this one) waits for the lock on path.

    On Linux that is when /proc/locks shows it blocked in flock; elsewhere,
    after WAITING_WINDOW with still_waiting() true throughout.  Fails at once
    when still_waiting() turns false first: the waiter got the lock (or gave
    up) while it was held elsewhere.
    """
    pid = os.getpid() if pid is None else pid
    deadline = time.monotonic() + (timeout if LINUX else WAITING_WINDOW)
    while not (LINUX and waiting_in_kernel(path, pid)):
        assert still_waiting(), f"the waiter stopped waiting while {path} was held elsewhere"
        if time.monotonic() >= deadline:
            assert not LINUX, f"pid {pid} never blocked on {path}"
            return
        time.sleep(0.001)  # re-reading kernel state, not standing in for a signal


async def until_waiting(
    path: str, still_waiting: Callable[[], bool], pid: int | None = None, timeout: float = 20.0
) -> None:
    """wait_until_waiting for a coroutine: the event loop keeps running meanwhile."""
    pid = os.getpid() if pid is None else pid
    deadline = time.monotonic() + (timeout if LINUX else WAITING_WINDOW)
    while not (LINUX and waiting_in_kernel(path, pid)):
        assert still_waiting(), f"the waiter stopped waiting while {path} was held elsewhere"
        if time.monotonic() >= deadline:
            assert not LINUX, f"pid {pid} never blocked on {path}"
            return
        await asyncio.sleep(0.0005)  # re-reading kernel state, not standing in for a signal
