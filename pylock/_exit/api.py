"""Waiting for a process to exit: holder_exit, wait_exit and ExitWatcher.

The process is pinned first (a pidfd on Linux, a kqueue registration on
macOS, a process handle on Windows) and its identity verified after, so a
pid recycled in between can never make a watch attach to a newcomer.  On
Linux the event loop then simply waits for the pidfd to become readable:
no thread, no polling.

Where pinning is refused (Linux before 5.3, or a seccomp policy), pylock
falls back, detected once per process, to the first strategy that applies:

* children of the caller: SIGCHLD wakes a check with waitid(WNOWAIT), which
  never reaps, so subprocess.Popen and the event loop still get their
  children's status.  Exits are seen at once, or within the fan-out's
  backstop (about 100 ms) when the program takes SIGCHLD for itself
  (pylock/_exit/sigchld.py).
* the holder of a pylock lock (target is a Lock): a shared-lock wait on that
  lock file wakes as soon as the holder's lock goes, which is at its death.
* any other process: one shared schedule checks all such watches together,
  about every 100 ms, at almost no cost while nothing exits
  (pylock/_exit/schedule.py).  Without pidfs the start identity is the start
  time, in 10 ms clock ticks: a pid recycled within the tick its first owner
  started in cannot be told apart (with a pidfd there is no such window).

A Lock target whose holder pylock cannot identify (no record, not visible in
/proc) is waited for through the lock alone: the wait ends when it is free.

The strategies are one class each (pylock/_watch_*.py), with their async and
blocking forms; this module picks one and offers the public API.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from typing import Any, Callable, NamedTuple

from .._core.timeout import check_timeout, deadline_of
from .child import ChildWatch
from .lock_watch import LockWatch
from .pinned import PinnedWatch
from .plan import Plan, Target, plan
from .poll import PollWatch
from .watch import Watch

log = logging.getLogger("pylock")

__all__ = ["ExitWatcher", "ProcessExit", "Target", "holder_exit", "wait_exit"]


class ProcessExit(NamedTuple):
    """One exit seen by an ExitWatcher."""

    pid: int
    returncode: int | None
    target: Any


def _strategies(plan: Plan) -> list[type[Watch]]:
    """The strategies to try in turn; the last one always applies."""
    if plan.exited:
        return [Watch]
    if plan.pid == 0:
        return [LockWatch]  # an unidentified holder: its lock is all there is
    last: type[Watch] = PollWatch if plan.lock_path is None else LockWatch
    return [PinnedWatch, ChildWatch, last]


def _start_watch(loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> Watch:
    for strategy in _strategies(plan):
        watch = strategy(loop, plan, target)
        if watch.start():
            return watch
    raise AssertionError("the last exit-watch strategy always applies")


async def holder_exit(target: Target, *, timeout: float | None = None) -> int | None:
    """Return when the process has exited, with its exit status where the kernel tells it.

    target is a pid, a Holder (the very process its record names), or a Lock
    (the process holding it now; None at once when nobody holds it).  The
    status (exit code, or -signal as in subprocess) is known for a child of
    the caller, read without reaping it, and on Linux 6.15+ for any process
    once its parent has reaped it; otherwise the result is None.  A zombie
    has exited.  Raises TimeoutError after timeout seconds (None, -1 and
    inf wait forever, as threading.Lock; other negatives and NaN are a
    ValueError), ValueError for a pid that cannot exist, names the caller or
    is a thread id.  Cancelling the awaiting task releases everything the
    wait held, never blocking the loop (a wait in a pylock thread lets go of
    its descriptor as that thread ends, a moment after the cancel).
    """
    seconds = check_timeout(timeout)
    remote = getattr(target, "_pylock_holder_exit", None)
    if remote is not None:  # held elsewhere (etcd): the holder knows how it ends
        await remote(seconds)
        return None
    loop = asyncio.get_running_loop()
    watch = _start_watch(loop, plan(target), target)
    timer = None
    if seconds is not None and not watch.future.done():
        timer = loop.call_later(seconds, watch.expire, seconds)
    try:
        return await watch.future
    finally:
        if timer is not None:
            timer.cancel()
        watch.close()


def wait_exit(target: Target, timeout: float | None = None) -> bool:
    """Block until the process has exited: True, or False when timeout seconds pass.

    Same targets, timeouts and kernel mechanisms as holder_exit.  Signal
    handlers run while waiting (Ctrl-C interrupts it).
    """
    remote = getattr(target, "_pylock_wait_exit", None)
    if remote is not None:  # held elsewhere (etcd): the holder knows how it ends
        return bool(remote(check_timeout(timeout)))
    deadline = deadline_of(timeout)
    resolved = plan(target)
    if resolved.exited:
        return True
    for strategy in _strategies(resolved):
        exited = strategy.wait(resolved, deadline)
        if exited is not None:
            return bool(exited)
    raise AssertionError("the last exit-watch strategy always applies")


class ExitWatcher:
    """Watch many processes from one event loop; each exit is delivered as it happens.

    ::

        async with pylock.ExitWatcher() as watcher:
            for pid in pids:
                watcher.watch(pid)
            async for ended in watcher:      # in the order the processes exit
                print(ended.pid, ended.returncode)

    Each watch costs one descriptor (the pidfd) and no thread; nothing runs
    between exits.  watch() also returns a future of the returncode.  Pass
    on_exit to get a callback per exit instead of iterating: exits are then
    not queued.  Watching thousands of processes needs RLIMIT_NOFILE above
    that number.
    """

    def __init__(self, on_exit: Callable[[ProcessExit], None] | None = None) -> None:
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: set[Watch] = set()
        self._exits: collections.deque[ProcessExit] = collections.deque()
        self._reader: asyncio.Future[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        """How many watched processes have not exited yet."""
        return len(self._watches)

    def watch(self, target: Target) -> asyncio.Future[int | None]:
        """Start watching target (a pid, Holder or Lock) from the running loop.

        Returns a future of its returncode (None where the kernel cannot
        tell).  Cancelling that future stops the watch.
        """
        if self._closed:
            raise RuntimeError("this ExitWatcher is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("an ExitWatcher belongs to the event loop it was first used in")
        watch = _start_watch(loop, plan(target), target)
        self._watches.add(watch)
        watch.future.add_done_callback(lambda _future: self._done(watch))
        return watch.future

    def unwatch(self, pid: int) -> int:
        """Stop watching every target with this pid; returns how many watches ended."""
        ended = [w for w in self._watches if w.pid == pid]
        for watch in ended:
            watch.future.cancel()
            self._discard(watch)
        return len(ended)

    def _discard(self, watch: Watch) -> None:
        self._watches.discard(watch)
        watch.close()

    def _done(self, watch: Watch) -> None:
        if watch not in self._watches:
            return
        self._discard(watch)
        future = watch.future
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                self._deliver(ProcessExit(watch.pid, None, watch.target), future.exception())
            return
        self._deliver(ProcessExit(watch.pid, future.result(), watch.target), None)

    def _deliver(self, ended: ProcessExit, exc: BaseException | None) -> None:
        if exc is not None:
            log.warning("pylock: watching %s failed: %s", ended.pid, exc)
        if self._on_exit is not None:
            self._on_exit(ended)
        else:
            self._exits.append(ended)
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def next_exit(self) -> ProcessExit:
        """The next exit, waiting for it.  Raises LookupError when nothing is watched."""
        while not self._exits:
            if not self._watches:
                raise LookupError("this ExitWatcher watches no process")
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        return self._exits.popleft()

    def __aiter__(self) -> AsyncIterator[ProcessExit]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ProcessExit]:
        while self._exits or self._watches:
            try:
                ended = await self.next_exit()
            except LookupError:  # closed while waiting
                return
            yield ended

    def close(self) -> None:
        """Stop every watch and release its descriptor."""
        self._closed = True
        for watch in list(self._watches):
            self._discard(watch)
            watch.future.cancel()
        self._wake_reader()

    async def __aenter__(self) -> ExitWatcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
