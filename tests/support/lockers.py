"""Processes that take flock, POSIX and OFD locks one line at a time: real
holders, real waiters blocked in the kernel and real deadlocks, for the
host-wide view (`pylock who --system`).

A `Locker` reads one JSON step per line: `[kind, mode, path_hex, start,
length]` (kind "flock", "posix" or "ofd"; mode "ex" or "sh"; the path as
the hex of its bytes, so any name works) opens the path (creating it) and
takes the lock, then prints "took"; a blocked step prints nothing until the
kernel grants it, and the test waits for the kernel to list the request
(`until_waiting`, a "->" line of /proc/locks).  `["fork"]` forks a copy
that keeps every descriptor (so it shares every lock taken so far) and
sleeps; its pid is printed.  `close()` kills the forked copies and the
locker and reaps the locker (the copies die with it too: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
import time

from tests.support.children import Script
from tests.support.kernel_locks import lock_key

LOCKER = textwrap.dedent(
    """
    import ctypes, fcntl, json, os, signal, struct, sys
    F_OFD_SETLKW = 38
    PR_SET_PDEATHSIG = 1
    parent = os.getpid()
    for line in sys.stdin:
        step = json.loads(line)
        if step[0] == "fork":
            pid = os.fork()
            if pid == 0:
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != parent:
                    os._exit(0)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                while True:
                    signal.pause()
            print("forked", pid, flush=True)
            continue
        kind, mode, path, start, length = step
        fd = os.open(bytes.fromhex(path), os.O_RDWR | os.O_CREAT, 0o666)
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX if mode == "ex" else fcntl.LOCK_SH)
        else:
            command = fcntl.F_SETLKW if kind == "posix" else F_OFD_SETLKW
            kind_ = fcntl.F_WRLCK if mode == "ex" else fcntl.F_RDLCK
            fcntl.fcntl(fd, command, struct.pack("hhqqi4x", kind_, 0, start, length, 0))
        print("took", flush=True)
    """
)


class Locker(Script):
    """A process taking locks when told (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__(LOCKER)
        self.copies: list[int] = []

    def ask(self, kind: str, mode: str, path: str | bytes, start: int = 0, length: int = 0) -> None:
        """Ask for a lock without waiting for it (the step may block)."""
        raw = os.fsencode(path)
        self.send(json.dumps([kind, mode, raw.hex(), start, length]))

    def take(
        self, kind: str, mode: str, path: str | bytes, start: int = 0, length: int = 0
    ) -> None:
        """Take a lock that is free: returns once the locker holds it."""
        self.ask(kind, mode, path, start, length)
        self.expect("took", within=30)

    def fork(self) -> int:
        """A copy of the locker sharing its descriptors (and so its flocks and OFD locks)."""
        self.send('["fork"]')
        pid = int(self.expect("forked", within=30))
        self.copies.append(pid)
        return pid

    def close(self) -> None:
        for pid in self.copies:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        super().close()


def waiting_pids(path: str | bytes) -> list[int]:
    """The pid of every request /proc/locks shows blocked on path's file
    (-1 for an OFD request), once per request, of every kind."""
    key = lock_key(os.fsdecode(path)).strip()
    found = []
    with open("/proc/locks") as f:
        for line in f:
            words = line.split()
            if "->" in words and key in words:
                found.append(int(words[words.index("->") + 4]))
    return found


def until_waiting(path: str | bytes, pid: int, count: int = 1, timeout: float = 30.0) -> None:
    """Return once the kernel shows count requests of pid blocked on path."""
    deadline = time.monotonic() + timeout
    while waiting_pids(path).count(pid) < count:
        assert time.monotonic() < deadline, f"pid {pid} never blocked on {path!r}"
        time.sleep(0.001)  # re-reading kernel state, not standing in for a signal
