"""The SIGCHLD fan-out: one wakeup per process, handed to every child watch.

The fallback for children where pidfds are missing.  pylock's C handler
writes to a self-pipe and chains to the program's handler (csrc/
sigchld_posix.c); one thread drains the pipe and calls every subscriber,
which then reads its child's state with waitid(WNOWAIT): nothing is ever
reaped and no signal is ever taken from the program.

The handler is not always heard: the program may block SIGCHLD in every
thread and take it itself (sigwaitinfo, signalfd), or install its own
handler after pylock's (asyncio's and uvloop's add_signal_handler, uvloop's
first subprocess), and pylock never pushes back in front of a handler that
might chain to it.  So the thread also wakes every subscriber on a
backstop: every BACKSTOP_UNHEARD seconds while the handler is not heard,
every BACKSTOP_HEARD seconds while it is (re-checking which is the case
each time).  An exit nobody told pylock about is thus seen within about
BACKSTOP_UNHEARD seconds once pylock knows it is not heard, and within
BACKSTOP_HEARD + BACKSTOP_UNHEARD at worst.  The thread runs only while
there are child watches.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
from collections.abc import Callable
from typing import NamedTuple

from .._core.native import ffi, lib

log = logging.getLogger("pylock")

BACKSTOP_HEARD = 1.0
BACKSTOP_UNHEARD = 0.1


class ChildStatus(NamedTuple):
    is_child: bool
    exited: bool
    returncode: int | None


def child_status(pid: int) -> ChildStatus:
    """Our child's state, read with waitid(WNOWAIT): never reaps."""
    exited = ffi.new("int *")
    code = ffi.new("int *")
    rc = lib.pl_child_poll(pid, exited, code)
    if rc == errno.ECHILD:
        return ChildStatus(False, False, None)
    if rc:
        raise OSError(rc, f"cannot check child {pid}: {os.strerror(rc)}")
    return ChildStatus(True, bool(exited[0]), int(code[0]) if exited[0] else None)


class SigchldFanout:
    """Hands each SIGCHLD wakeup (and each backstop tick) to every subscriber."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._heard = False

    def _claim(self) -> int | None:
        """The wakeup descriptor (re-checking pylock's handler), None when the
        kernel reaps children itself (SIGCHLD ignored, SA_NOCLDWAIT)."""
        fd = ffi.new("int64_t *")
        heard = ffi.new("int *")
        rc = lib.pl_sigchld_open(fd, heard)
        if rc == errno.ECHILD:
            return None
        if rc:
            raise OSError(rc, f"cannot watch SIGCHLD: {os.strerror(rc)}")
        self._heard = bool(heard[0])
        return int(fd[0])

    def subscribe(self, wake: Callable[[], None]) -> int | None:
        """A subscription token, or None when there is nothing to wait for
        (children are reaped by the kernel)."""
        with self._lock:
            fd = self._claim()
            if fd is None:
                return None
            self._next += 1
            token = self._next
            self._subscribers[token] = wake
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(fd,), name="pylock SIGCHLD", daemon=True
                )
                self._thread.start()
            return token

    def unsubscribe(self, token: int | None) -> None:
        if token is not None:
            with self._lock:
                self._subscribers.pop(token, None)

    def _run(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            with self._lock:
                if not self._subscribers:
                    self._thread = None  # nothing to watch: no thread either
                    return
                backstop = BACKSTOP_HEARD if self._heard else BACKSTOP_UNHEARD
            events = poller.poll(int(backstop * 1000))
            if any(mask & (select.POLLNVAL | select.POLLERR) for _, mask in events):
                # Someone closed pylock's descriptor: stop rather than spin.
                log.error("pylock: the SIGCHLD wakeup descriptor %d was closed", fd)
                with self._lock:
                    self._thread = None
                return
            with self._lock:
                if events:
                    lib.pl_sigchld_drain(fd)
                else:
                    try:  # is the handler still heard?
                        if self._claim() is None:
                            self._heard = False
                    except OSError:
                        self._heard = False
                wakes = list(self._subscribers.values())
            for wake in wakes:
                try:
                    wake()
                except Exception:  # one broken subscriber must not starve the others
                    log.exception("pylock: SIGCHLD subscriber failed")


_fanout = SigchldFanout()


def fanout() -> SigchldFanout:
    return _fanout


def _reset_after_fork() -> None:
    global _fanout
    _fanout = SigchldFanout()  # the thread did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
