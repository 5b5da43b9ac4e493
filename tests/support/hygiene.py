"""Resource hygiene run: many acquisitions, timeouts and cancellations in one
process, measuring descriptors, threads and RSS before and after.

    python -m tests.support.hygiene PATH CYCLES TIMEOUTS CANCELS

The lock at PATH must be free; a holder for the timeout and cancel phases is
started here (a child holding it). Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pylock
from tests.support.procs import wait_threads_end


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def snapshot() -> dict[str, int]:
    gc.collect()
    wait_threads_end()
    return {
        "fds": fds(),
        "threads": threads(),
        "py_threads": threading.active_count(),
        "rss": rss(),
    }


def cycles(path: str, n: int) -> None:
    lock = pylock.Lock(path, info={"cycle": True})
    for i in range(n):
        if i % 4 == 0:
            with lock:
                pass
        else:
            lock.acquire()
            lock.release()
    lock.close()
    # Fresh objects too: every one opens and must close its descriptor.
    for _ in range(n // 20):
        fresh = pylock.Lock(path)
        fresh.acquire(blocking=False)
        fresh.release()
        fresh.close()
    for _ in range(n // 20):
        with pylock.Lock(path):
            pass


async def async_cycles(path: str, n: int) -> None:
    lock = pylock.Lock(path)
    for _ in range(n):
        async with lock:
            pass
    lock.close()


def timeouts(path: str, n: int) -> int:
    lock = pylock.Lock(path)
    got = 0
    for i in range(n):
        try:
            if i % 2:
                lock.acquire(timeout=0.001)
            else:
                lock.acquire(blocking=False)
        except pylock.LockHeld:
            got += 1
        assert not lock.locked
    lock.close()
    return got


async def cancels(path: str, n: int) -> int:
    lock = pylock.Lock(path)
    got = 0
    for i in range(n):
        try:
            if i % 2:
                await asyncio.wait_for(lock.acquire_async(), 0.001)
            else:
                task = asyncio.ensure_future(lock.acquire_async())
                await asyncio.sleep(0.001)
                task.cancel()
                await task
        except (asyncio.TimeoutError, asyncio.CancelledError):
            got += 1
        assert not lock.locked
    # And timed out inside acquire_async itself.
    for _ in range(n // 10):
        try:
            await lock.acquire_async(timeout=0.001)
        except pylock.LockTimeout:
            got += 1
    lock.close()
    return got


def main() -> None:
    path, n_cycles, n_timeouts, n_cancels = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    # Warm up every path once, so lazily created state (the wake signal, the
    # event loop's selector, cffi types, logging) is in the baseline.
    cycles(path, 2000)
    asyncio.run(async_cycles(path, 200))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pylock; l = pylock.Lock(sys.argv[1]); l.acquire(); "
            "print('held', flush=True); sys.stdin.read()",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    timeouts(path, 50)
    asyncio.run(cancels(path, 50))
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait()
    holder.stdout.close()

    out: dict[str, Any] = {"base": snapshot()}
    t0 = time.monotonic()
    cycles(path, n_cycles)
    asyncio.run(async_cycles(path, n_cycles // 10))
    out["cycles_s"] = round(time.monotonic() - t0, 2)
    out["after_cycles"] = snapshot()

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pylock; l = pylock.Lock(sys.argv[1]); l.acquire(); "
            "print('held', flush=True); sys.stdin.read()",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    out["during_holder"] = snapshot()  # the Popen pipes are ours now
    t0 = time.monotonic()
    out["timed_out"] = timeouts(path, n_timeouts)
    out["timeouts_s"] = round(time.monotonic() - t0, 2)
    out["after_timeouts"] = snapshot()
    t0 = time.monotonic()
    out["cancelled"] = asyncio.run(cancels(path, n_cancels))
    out["cancels_s"] = round(time.monotonic() - t0, 2)
    out["after_cancels"] = snapshot()
    # The holder goes: nothing of ours may have kept or queued for the lock.
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait()
    holder.stdout.close()
    out["holders_after"] = [h.pid for h in pylock.holders(path)]
    out["end"] = snapshot()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
