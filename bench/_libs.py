"""The locks under test, each behind the same small interface.

A sync lock is a pair of callables ``(acquire, release)``; an async lock is
``(acquire, release)`` where ``acquire`` is a coroutine function and
``release`` is a coroutine function too (filelock's async release is one).
Every lock blocks until it gets the lock: the peers are used with their
defaults except for a timeout long enough never to fire, because their
defaults (poll intervals, backoff) are what their users get.

The floors do exactly the work pylock must do and nothing else: a blocking
``flock`` on an already-open descriptor, then a ``pwrite`` of a record of the
same size as pylock's; the async floor does that in a thread and hands over
to the event loop with ``call_soon_threadsafe`` (after one non-blocking try,
so a free lock costs no thread).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from collections.abc import Awaitable
from typing import Callable

SyncLock = tuple[Callable[[], object], Callable[[], object]]
AsyncLock = tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[object]]]

# A timeout no trial ever reaches; the peers' defaults (filelock: wait
# forever, portalocker: 5 s) would either be the same or abort a slow trial.
NEVER = 3600.0

SYNC_LIBS = ("pylock", "filelock", "fasteners", "portalocker", "floor", "pylock-filelock")
ASYNC_LIBS = ("pylock-async", "filelock-async", "floor-async")


def holder_lib(lib: str) -> str:
    """The sync library whose holder releases to (or dies under) this waiter."""
    return lib[: -len("-async")] if lib.endswith("-async") else lib


def sync_lock(lib: str, path: str, record: bytes) -> SyncLock:
    if lib == "pylock":
        import pylock

        lock = pylock.Lock(path)
        return lock.acquire, lock.release
    if lib == "pylock-core":
        # pylock's C core called straight through cffi, without the Lock
        # object around it: what the Python layer costs, and what cffi does.
        import pylock
        from pylock._native import lib as core

        lock = pylock.Lock(path)
        lock.acquire()  # opens the file and builds the record
        lock.release()
        lf, claim, disown = lock._lf, core.pl_acquire, core.pl_disown
        token = id(lock)  # any live object's id names the attempt

        def acquire_core() -> None:
            # The Lock stays referenced here: dropping it would close the file.
            if claim(lf, token) or lock is None:
                raise RuntimeError(f"{path}: pl_acquire failed")

        return acquire_core, (lambda: disown(lf, token, 1))
    if lib == "filelock":
        import filelock

        flk = filelock.FileLock(path, timeout=NEVER)
        return flk.acquire, flk.release
    if lib == "pylock-filelock":
        # pylock's filelock front with filelock's default, waiting forever
        # (as the pylock row does: a finite timeout makes pylock's kernel
        # wait a timed one, which costs its hand-over more).
        from pylock.filelock import FileLock

        front = FileLock(path)
        return front.acquire, front.release
    if lib == "fasteners":
        import fasteners

        ipl = fasteners.InterProcessLock(path)
        return (lambda: ipl.acquire(timeout=NEVER)), ipl.release
    if lib == "portalocker":
        import portalocker

        plk = portalocker.Lock(path, timeout=NEVER)
        return plk.acquire, plk.release
    if lib == "floor":
        return _floor(path, record)
    raise ValueError(f"unknown sync library {lib!r}")


def _floor(path: str, record: bytes) -> SyncLock:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    flock, pwrite = fcntl.flock, os.pwrite
    ex, un = fcntl.LOCK_EX, fcntl.LOCK_UN

    def acquire() -> None:
        flock(fd, ex)
        pwrite(fd, record, 0)

    def release() -> None:
        flock(fd, un)

    return acquire, release


def async_lock(lib: str, path: str, record: bytes) -> AsyncLock:
    if lib == "pylock-async":
        import pylock

        lock = pylock.Lock(path)

        async def release_pylock() -> None:
            lock.release()

        return lock.acquire_async, release_pylock
    if lib == "filelock-async":
        import filelock

        alk = filelock.AsyncFileLock(path, timeout=NEVER)
        return alk.acquire, alk.release
    if lib == "floor-async":
        return _async_floor(path, record)
    if lib == "fasteners-thread":
        # fasteners has no asyncio API: its users run the blocking acquire in
        # a worker thread.
        acquire, release = sync_lock("fasteners", path, record)

        async def acquire_in_thread() -> None:
            await asyncio.get_running_loop().run_in_executor(None, acquire)

        async def release_now() -> None:
            release()

        return acquire_in_thread, release_now
    raise ValueError(f"unknown async library {lib!r}")


def _async_floor(path: str, record: bytes) -> AsyncLock:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    async def acquire() -> None:
        # A free lock is taken inline; only a wait goes to a thread.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            os.pwrite(fd, record, 0)
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def in_thread() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, record, 0)
            loop.call_soon_threadsafe(done.set_result, None)

        threading.Thread(target=in_thread, daemon=True).start()
        await done

    async def release() -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    return acquire, release
