"""Waiting for a process to exit: holder_exit, wait_exit and ExitWatcher.

The process is pinned first (a pidfd on Linux, a kqueue registration on
macOS, a process handle on Windows) and its identity verified after, so a
pid recycled in between can never make a watch attach to a newcomer.  On
Linux the event loop then simply waits for the pidfd to become readable:
no thread, no polling.

Where pinning is refused (Linux before 5.3, or a seccomp policy), pylock
falls back, detected once per process:

* children of the caller: SIGCHLD wakes a check with waitid(WNOWAIT), which
  never reaps, so subprocess.Popen and the event loop still get their
  children's status.  Exits are seen at once.
* the holder of a pylock lock (target is a Lock): a shared-lock wait on that
  lock file wakes as soon as the holder's lock goes, which is at its death.
* any other process: its pid and start identity are checked with a backoff
  from 1 ms doubling to 100 ms, so an exit is seen within about 100 ms; each
  check reads /proc (about 20 us of CPU), so a watch costs at most ten such
  reads a second.  Without pidfs the start identity is the start time, in
  10 ms clock ticks: a pid recycled within the tick its first owner started
  in cannot be told apart (with a pidfd there is no such window).

A Lock target whose holder pylock cannot identify (no record, not visible in
/proc) is waited for through the lock alone: the wait ends when it is free.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Callable, NamedTuple, Union

from ._holder import Holder
from ._lock import Lock
from ._native import ffi, lib
from ._process import (
    Pinned,
    PinUnavailable,
    ProcessIdentity,
    check_pid,
    has_start_identity,
    identity_of,
    pin,
    pinning_available,
    refuse_thread_id,
    same_process,
    self_identity,
)
from ._syscall import open_lock_file
from ._timeout import check_timeout, deadline_of, ns_left

log = logging.getLogger("pylock")

Target = Union[int, Holder, Lock]

# The non-child fallback: first check after 1 ms, doubling up to the cap.
BACKOFF_FIRST = 0.001
BACKOFF_CAP = 0.1
# With a lock wait that wakes at the holder's death, the identity checks only
# cover what the lock cannot tell (a forked child inheriting the lock keeps
# it held after the holder died).
LOCK_BACKOFF_CAP = 1.0


class ProcessExit(NamedTuple):
    """One exit seen by an ExitWatcher."""

    pid: int
    returncode: int | None
    target: Any


# -- what to watch -------------------------------------------------------------


class _Plan:
    """A target resolved to a pid, the process expected there, and its lock."""

    __slots__ = ("exited", "expected", "lock_path", "pid")

    def __init__(
        self,
        pid: int,
        expected: ProcessIdentity | None = None,
        lock_path: str | None = None,
        exited: bool = False,
    ) -> None:
        self.pid = pid  # 0: an unidentified holder, only its lock can be watched
        self.expected = expected  # None: whatever process has the pid now
        self.lock_path = lock_path
        self.exited = exited


def _refuse_self(pid: int) -> None:
    if pid == os.getpid():
        raise ValueError(f"pid {pid} is the calling process: pylock cannot wait for its own exit")


def _plan_for_holder(holder: Holder, lock_path: str | None) -> _Plan:
    ident = holder.identity
    if holder.pid <= 0:
        if lock_path is None:
            raise ValueError(
                f"the holder {holder.describe()} has no process id pylock can watch; "
                "pass the Lock itself to wait until its lock is released"
            )
        return _Plan(0, lock_path=lock_path)
    mine = self_identity()
    if ident.boot_id and ident.boot_id != mine.boot_id:
        if holder.hostname and holder.hostname != socket.gethostname():
            if lock_path is not None:
                # Another machine's process: only the lock itself can tell.
                return _Plan(0, lock_path=lock_path)
            raise ValueError(
                f"{holder.describe()} runs on another machine ({holder.hostname}); "
                "pylock can only watch processes of this machine"
            )
        return _Plan(holder.pid, ident, exited=True)  # recorded in an earlier boot
    if same_process(ident, mine) or not has_start_identity(ident):
        _refuse_self(holder.pid)
    # Without a start identity (a Holder made from a bare pid), the process
    # that has the pid now is the one to watch.
    return _Plan(holder.pid, ident if has_start_identity(ident) else None, lock_path)


def _plan(target: Target) -> _Plan:
    if isinstance(target, Lock):
        holder = target.holder()
        if holder is None:
            return _Plan(0, exited=True)  # nobody holds it now
        return _plan_for_holder(holder, target.path)
    if isinstance(target, Holder):
        return _plan_for_holder(target, None)
    pid = check_pid(target)
    _refuse_self(pid)
    refuse_thread_id(pid)
    return _Plan(pid)


def _describe(plan: _Plan) -> str:
    return f"pid {plan.pid}" if plan.pid else f"the holder of {plan.lock_path}"


# -- the fallback: children through SIGCHLD ------------------------------------


class _ChildStatus(NamedTuple):
    is_child: bool
    exited: bool
    returncode: int | None


def _child_status(pid: int) -> _ChildStatus:
    exited = ffi.new("int *")
    code = ffi.new("int *")
    rc = lib.pl_child_poll(pid, exited, code)
    if rc == errno.ECHILD:
        return _ChildStatus(False, False, None)
    if rc:
        raise OSError(rc, f"cannot check child {pid}: {os.strerror(rc)}")
    return _ChildStatus(True, bool(exited[0]), int(code[0]) if exited[0] else None)


class _SigchldFanout:
    """Hands each SIGCHLD wakeup to every waiter in this process.

    The kernel gives one wakeup descriptor per process (a self-pipe or a
    signalfd); several loops and threads draining it themselves would steal
    each other's wakeups.  One thread, started at the first child watch of
    the fallback, drains it and calls every subscriber.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def subscribe(self, wake: Callable[[], None]) -> int | None:
        """A subscription token, or None when children are reaped by the kernel
        (SIGCHLD ignored or SA_NOCLDWAIT): then there is nothing to wait for."""
        with self._lock:
            out = ffi.new("int64_t *")
            # Called every time: it also re-chains pylock's handler if the
            # application replaced it since.
            rc = lib.pl_sigchld_open(out)
            if rc == errno.ECHILD:
                return None
            if rc:
                raise OSError(rc, f"cannot watch SIGCHLD: {os.strerror(rc)}")
            self._next += 1
            token = self._next
            self._subscribers[token] = wake
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(int(out[0]),), name="pylock SIGCHLD", daemon=True
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
            events = poller.poll()
            if any(mask & (select.POLLNVAL | select.POLLERR) for _, mask in events):
                # Someone closed pylock's descriptor: stop rather than spin.
                log.error("pylock: the SIGCHLD wakeup descriptor %d was closed", fd)
                with self._lock:
                    self._thread = None
                return
            lib.pl_sigchld_drain(fd)
            with self._lock:
                wakes = list(self._subscribers.values())
            for wake in wakes:
                try:
                    wake()
                except Exception:  # one broken subscriber must not starve the others
                    log.exception("pylock: SIGCHLD subscriber failed")


_fanout = _SigchldFanout()


def _reset_after_fork() -> None:
    global _fanout
    _fanout = _SigchldFanout()  # the thread did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _still_there(pid: int, expected: ProcessIdentity) -> bool:
    now = identity_of(pid)
    return now is not None and same_process(now, expected)


# -- a blocking C wait handed to an event loop ---------------------------------


class _ThreadWait:
    """One blocking, cancellable C wait in a daemon thread.

    Used where the kernel offers no descriptor a loop could watch: a lock
    wait in the fallback, a process handle on Windows.
    """

    __slots__ = ("_thread", "_waiter")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wait: Callable[[Any], int],
        done: Callable[[int], None],
        name: str,
    ) -> None:
        waiter = lib.pl_waiter_new()
        if waiter == ffi.NULL:
            raise MemoryError
        self._waiter = waiter

        def run() -> None:
            rc = errno.EINTR
            while rc == errno.EINTR:
                rc = wait(waiter)
            if rc != errno.ECANCELED:
                # A closed loop raises RuntimeError: nobody waits any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(done, rc)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        if self._waiter is not None:
            lib.pl_waiter_cancel(self._waiter)  # returns once the wait has ended
            self._thread.join()
            lib.pl_waiter_free(self._waiter)
            self._waiter = None


def _lock_wait(handle: int) -> Callable[[Any], int]:
    def wait(waiter: Any) -> int:
        rc = int(lib.pl_lock_wait(handle, 1, -1, waiter))
        if rc == 0:
            lib.pl_unlock(handle)  # only the release mattered, never keep it
        return rc

    return wait


def _open_lock(path: str) -> int | None:
    """A read-only handle on a lock file to wait on, or None when it is gone."""
    try:
        return open_lock_file(path, lib.PL_OPEN_READONLY)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return None
        raise


# -- one watch in an event loop ------------------------------------------------


class _Watch:
    """One process watched from an event loop; self.future gets its returncode."""

    __slots__ = (
        "_delay",
        "_expected",
        "_fd",
        "_lock_handle",
        "_pinned",
        "_sub",
        "_thread_wait",
        "_timer",
        "cap",
        "future",
        "loop",
        "pid",
        "plan",
        "target",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, plan: _Plan, target: Any) -> None:
        self.loop = loop
        self.plan = plan
        self.pid = plan.pid
        self.target = target
        self.future: asyncio.Future[int | None] = loop.create_future()
        self._pinned: Pinned | None = None
        self._fd: int | None = None
        self._sub: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._thread_wait: _ThreadWait | None = None
        self._lock_handle: int | None = None
        self._expected = plan.expected
        self._delay = BACKOFF_FIRST
        self.cap = BACKOFF_CAP

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        plan = self.plan
        if plan.exited:
            self._finish(None)
            return
        if plan.pid == 0:
            self._start_lock_wait()  # an unidentified holder: its lock is all we have
            return
        if pinning_available():
            try:
                pinned = pin(plan.pid, plan.expected)
            except PinUnavailable:
                pass
            else:
                self._start_pinned(pinned)
                return
        self._start_fallback()

    # pinned --------------------------------------------------------------

    def _start_pinned(self, pinned: Pinned | None) -> None:
        if pinned is None:
            self._finish(None)  # gone, or the pid now names someone else
            return
        self._pinned = pinned
        if pinned.exited():
            self._finish(pinned.returncode())
            return
        fd = pinned.event_fd()
        if fd is None:
            handle = pinned.handle
            self._thread_wait = _ThreadWait(
                self.loop,
                lambda w: int(lib.pl_proc_wait(handle, -1, w)),
                self._on_thread_exit,
                f"pylock wait pid {self.pid}",
            )
            return
        self.loop.add_reader(fd, self._on_readable)
        self._fd = fd

    def _on_readable(self) -> None:
        pinned = self._pinned
        if pinned is not None and not self.future.done() and pinned.exited():
            self._finish(pinned.returncode())

    def _end_thread_wait(self) -> None:
        """Join the waiting thread and free its waiter (it may have ended already)."""
        if self._thread_wait is not None:
            wait, self._thread_wait = self._thread_wait, None
            wait.cancel()

    def _on_thread_exit(self, rc: int) -> None:
        self._end_thread_wait()
        pinned = self._pinned
        if pinned is None or self.future.done():
            return
        if rc:
            self._fail(OSError(rc, f"waiting for pid {self.pid} failed: {os.strerror(rc)}"))
        else:
            self._finish(pinned.returncode())

    # fallback --------------------------------------------------------------

    def _start_fallback(self) -> None:
        pid = self.pid
        self._sub = _fanout.subscribe(self._wake_threadsafe)
        if self._sub is not None:
            status = _child_status(pid)
            if status.is_child:
                if status.exited:
                    self._finish(status.returncode)
                    return
                self._settle_expected()  # from here on, SIGCHLD tells
                return
            _fanout.unsubscribe(self._sub)
            self._sub = None
        if not self._settle_expected():
            return
        if self.plan.lock_path is not None:
            self._start_lock_wait()
            self.cap = LOCK_BACKOFF_CAP
        self._timer = self.loop.call_later(self._delay, self._poll)

    def _settle_expected(self) -> bool:
        """Fix the identity to watch; False (and finished) when it is already gone."""
        if self._expected is None:
            self._expected = identity_of(self.pid)  # a bare pid: whoever has it now
            if self._expected is None:
                self._finish(self._late_status())
                return False
        elif not _still_there(self.pid, self._expected):
            self._finish(self._late_status())
            return False
        return True

    def _late_status(self) -> int | None:
        """The status of a child found gone after waitid said it ran: it may have
        become a zombie in between (then waitid tells now), or been reaped by
        its owner (then nobody can)."""
        if self._sub is None:
            return None
        status = _child_status(self.pid)
        return status.returncode if status.is_child and status.exited else None

    def _wake_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed
            self.loop.call_soon_threadsafe(self._on_sigchld)

    def _on_sigchld(self) -> None:
        if self.future.done():
            return
        status = _child_status(self.pid)
        if not status.is_child:
            self._finish(None)  # reaped by its owner (Popen.wait) meanwhile
        elif status.exited:
            self._finish(status.returncode)
        elif self._expected is not None and not _still_there(self.pid, self._expected):
            # Exited since waitid looked, or reaped by its owner and the pid
            # given to another child of ours.
            self._finish(self._late_status())

    def _poll(self) -> None:
        self._timer = None
        if self.future.done():
            return
        assert self._expected is not None
        if not _still_there(self.pid, self._expected):
            self._finish(None)
            return
        self._delay = min(self._delay * 2, self.cap)
        self._timer = self.loop.call_later(self._delay, self._poll)

    def _start_lock_wait(self) -> None:
        assert self.plan.lock_path is not None
        handle = _open_lock(self.plan.lock_path)
        if handle is None:
            if self.pid == 0:
                self._finish(None)  # the lock file is gone: nobody holds it
            return
        self._lock_handle = handle
        self._thread_wait = _ThreadWait(
            self.loop, _lock_wait(handle), self._on_lock_free, f"pylock wait {self.plan.lock_path}"
        )

    def _on_lock_free(self, rc: int) -> None:
        self._end_thread_wait()
        self._close_lock()
        if self.future.done():
            return
        if self.pid == 0:
            if rc:
                self._fail(OSError(rc, f"waiting on {self.plan.lock_path}: {os.strerror(rc)}"))
            else:
                self._finish(None)
            return
        # Released: by death, or voluntarily by a holder that lives on.
        self.cap = BACKOFF_CAP
        if self._timer is not None:
            self._timer.cancel()
        self._delay = BACKOFF_FIRST
        self._poll()

    # ending --------------------------------------------------------------

    def _finish(self, returncode: int | None) -> None:
        if not self.future.done():
            self.future.set_result(returncode)
        self.close()

    def _fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
        self.close()

    def expire(self, timeout: float) -> None:
        if not self.future.done():
            self.future.set_exception(
                TimeoutError(f"{_describe(self.plan)} did not exit within {timeout:g} s")
            )
        self.close()

    def close(self) -> None:
        """Let go of everything: reader, descriptor, timer, thread, subscription."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if not self.loop.is_closed():
                self.loop.remove_reader(fd)
        self._end_thread_wait()
        self._close_lock()
        if self._pinned is not None:
            pinned, self._pinned = self._pinned, None
            pinned.close()
        if self._timer is not None:
            timer, self._timer = self._timer, None
            timer.cancel()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            _fanout.unsubscribe(sub)

    def _close_lock(self) -> None:
        if self._lock_handle is not None:
            handle, self._lock_handle = self._lock_handle, None
            lib.pl_close(handle)


# -- the public API --------------------------------------------------------------


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
    is a thread id.  Cancelling the awaiting task
    releases everything the wait held.
    """
    timeout = check_timeout(timeout)
    loop = asyncio.get_running_loop()
    watch = _Watch(loop, _plan(target), target)
    watch.start()
    timer = None
    if timeout is not None and not watch.future.done():
        timer = loop.call_later(timeout, watch.expire, timeout)
    try:
        return await watch.future
    finally:
        if timer is not None:
            timer.cancel()
        watch.close()


def wait_exit(target: Target, timeout: float | None = None) -> bool:
    """Block until the process has exited: True, or False when timeout seconds pass.

    Same targets and the same kernel mechanisms as holder_exit.  Signal
    handlers run while waiting (Ctrl-C interrupts it).
    """
    deadline = deadline_of(timeout)
    plan = _plan(target)
    if plan.exited:
        return True
    if plan.pid == 0:
        return _wait_lock_sync(plan, deadline) is True
    if pinning_available():
        try:
            pinned = pin(plan.pid, plan.expected)
        except PinUnavailable:
            pass
        else:
            if pinned is None:
                return True
            try:
                return _wait_pinned_sync(pinned, deadline)
            finally:
                pinned.close()
    return _wait_fallback_sync(plan, deadline)


def _wait_pinned_sync(pinned: Pinned, deadline: float | None) -> bool:
    while True:
        rc = lib.pl_proc_wait(pinned.handle, ns_left(deadline), ffi.NULL)
        if rc == 0:
            return True
        if rc == errno.ETIMEDOUT:
            return False
        if rc != errno.EINTR:
            raise OSError(rc, f"waiting for pid {pinned.pid} failed: {os.strerror(rc)}")
        # EINTR: returning to Python ran the signal handlers; wait for the rest.


def _wait_fallback_sync(plan: _Plan, deadline: float | None) -> bool:
    pid = plan.pid
    expected = plan.expected
    woken = threading.Event()
    sub = _fanout.subscribe(woken.set)
    try:
        if sub is not None:
            status = _child_status(pid)
            if status.is_child:
                if expected is None:
                    expected = identity_of(pid)
                while True:
                    if status.exited or not status.is_child:
                        return True
                    if expected is None or not _still_there(pid, expected):
                        return True
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    woken.wait(left)
                    woken.clear()
                    status = _child_status(pid)
    finally:
        _fanout.unsubscribe(sub)
    if expected is None:
        expected = identity_of(pid)
        if expected is None:
            return True
    return _poll_sync(plan, expected, deadline)


def _poll_sync(plan: _Plan, expected: ProcessIdentity, deadline: float | None) -> bool:
    handle = _open_lock(plan.lock_path) if plan.lock_path is not None else None
    waiter = lib.pl_waiter_new() if handle is not None else ffi.NULL
    if handle is not None and waiter == ffi.NULL:
        lib.pl_close(handle)
        raise MemoryError
    delay = BACKOFF_FIRST
    try:
        while True:
            if not _still_there(plan.pid, expected):
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            step = delay if left is None else min(delay, left)
            if handle is not None:
                rc = lib.pl_lock_wait(handle, 1, int(step * 1e9), waiter)
                if rc == 0:
                    # Released: by death, or by a holder that lives on; from
                    # here on only the identity can tell.
                    lib.pl_unlock(handle)
                    lib.pl_close(handle)
                    handle = None
                    delay = BACKOFF_FIRST
                    continue
                if rc not in (errno.ETIMEDOUT, errno.EINTR):
                    raise OSError(rc, f"waiting on {plan.lock_path}: {os.strerror(rc)}")
                delay = min(delay * 2, LOCK_BACKOFF_CAP)
            else:
                time.sleep(step)
                delay = min(delay * 2, BACKOFF_CAP)
    finally:
        if handle is not None:
            lib.pl_close(handle)
        if waiter != ffi.NULL:
            lib.pl_waiter_free(waiter)


def _wait_lock_sync(plan: _Plan, deadline: float | None) -> bool:
    """Wait for the lock at plan.lock_path to be free (its holder is unidentified)."""
    assert plan.lock_path is not None
    handle = _open_lock(plan.lock_path)
    if handle is None:
        return True
    waiter = lib.pl_waiter_new()
    if waiter == ffi.NULL:
        lib.pl_close(handle)
        raise MemoryError
    try:
        while True:
            rc = lib.pl_lock_wait(handle, 1, ns_left(deadline), waiter)
            if rc == 0:
                lib.pl_unlock(handle)
                return True
            if rc == errno.ETIMEDOUT:
                return False
            if rc != errno.EINTR:
                raise OSError(rc, f"waiting on {plan.lock_path}: {os.strerror(rc)}")
    finally:
        lib.pl_close(handle)
        lib.pl_waiter_free(waiter)


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
        self._watches: set[_Watch] = set()
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
        watch = _Watch(loop, _plan(target), target)
        self._watches.add(watch)
        try:
            watch.start()
        except BaseException:
            self._watches.discard(watch)
            raise
        watch.future.add_done_callback(lambda _future: self._done(watch))
        return watch.future

    def unwatch(self, pid: int) -> int:
        """Stop watching every target with this pid; returns how many watches ended."""
        ended = [w for w in self._watches if w.pid == pid]
        for watch in ended:
            watch.future.cancel()
            self._discard(watch)
        return len(ended)

    def _discard(self, watch: _Watch) -> None:
        self._watches.discard(watch)
        watch.close()

    def _done(self, watch: _Watch) -> None:
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
