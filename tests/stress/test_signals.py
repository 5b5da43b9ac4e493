"""Signals and interruptions: a storm of EINTR neither breaks a wait nor loses
its wakeup; Ctrl-C during a blocking acquire leaves no lock and no thread.

The waiters run as separate processes (their own signal handlers, timers and
Ctrl-C, away from pytest's), synchronised by pipes and /proc/locks.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import pylock
from tests.support.kernel_locks import blocked_waiters, wait_blocked
from tests.support.procs import Script, fds_on
from tests.support.sizes import Figures

HOLDER = r"""
import sys, time, pylock
lock = pylock.Lock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
t = time.monotonic_ns()
lock.release()
print("released", t, flush=True)
sys.stdin.readline()
"""

# A waiter under a SIGALRM storm (every 200 us). The handler prints a tick
# every 250 signals, so the test knows the storm is running during the wait.
STORM_WAITER = r"""
import asyncio, os, signal, sys, time, pylock
path, mode = sys.argv[1], sys.argv[2]
count = 0
def on_alarm(signum, frame):
    global count
    count += 1
    if count % 250 == 0:
        os.write(1, b"tick\n")
signal.signal(signal.SIGALRM, on_alarm)
lock = pylock.Lock(path)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
t0 = time.monotonic()
outcome = "acquired"
try:
    if mode == "sync":
        lock.acquire()
    elif mode == "sync_timed":
        lock.acquire(timeout=float(sys.argv[3]))
    elif mode == "async":
        asyncio.run(lock.acquire_async())
    elif mode == "async_timed":
        asyncio.run(lock.acquire_async(timeout=float(sys.argv[3])))
except pylock.LockTimeout:
    outcome = "timeout"
t_got = time.monotonic_ns()
elapsed = time.monotonic() - t0
signal.setitimer(signal.ITIMER_REAL, 0, 0)
os.write(1, f"done {outcome} {t_got} {elapsed} {count} {lock.locked}\n".encode())
sys.stdin.readline()
"""


def _read_done(waiter: Script) -> list[str]:
    while True:
        line = waiter.expect()
        if line.startswith("done"):
            return line.split()[1:]
        assert line == "tick", line


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_eintr_storm_neither_breaks_the_wait_nor_loses_the_wakeup(
    tmp_path: Path, mode: str, figures: Figures
) -> None:
    path = str(tmp_path / "storm.lock")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        waiter = Script(STORM_WAITER, path, mode)
        wait_blocked(path, waiter.pid)
        # Let the storm hit the blocked wait: 2,000 signals, counted by ticks.
        for _ in range(8):
            assert waiter.expect() == "tick"
        # Sampled until seen: one look can fall between a signal's EINTR and
        # the wait's next flock; a broken wait is never seen again.
        assert any(waiter.pid in blocked_waiters(path) for _ in range(200)), (
            "the storm broke the wait"
        )
        holder.send()
        released = int(holder.expect("released"))
        outcome, t_got, _elapsed, count, locked = _read_done(waiter)
        handover_ms = (int(t_got) - released) / 1e6
        figures(mode=mode, signals_during_wait=int(count), release_to_acquired_ms=handover_ms)
        assert outcome == "acquired" and locked == "True"
        assert int(count) >= 2000
        assert handover_ms < 500, "the wakeup was lost and found late"
        assert [h.pid for h in pylock.holders(path)] == [waiter.pid]
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()


@pytest.mark.parametrize("mode", ["sync_timed", "async_timed"])
def test_eintr_storm_keeps_the_timeout(tmp_path: Path, mode: str, figures: Figures) -> None:
    """Interrupted waits resume with the time left: no early timeout, no endless one."""
    path = str(tmp_path / "storm.lock")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        timeout = 1.0
        waiter = Script(STORM_WAITER, path, mode, str(timeout))
        outcome, _t, elapsed, count, locked = _read_done(waiter)
        figures(mode=mode, timeout_s=timeout, elapsed_s=float(elapsed), signals=int(count))
        assert outcome == "timeout" and locked == "False"
        # A wait that began its timeout again after each signal would never end:
        # the upper bound only has to catch that, on a loaded machine too.
        assert timeout <= float(elapsed) < timeout + 2.0
        assert int(count) > 1000
        assert [h.pid for h in pylock.holders(path)] == [holder.pid]
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()


# Ctrl-C during a blocking acquire: the waiter reports what is left behind.
INTERRUPTED_WAITER = r"""
import asyncio, json, os, sys, threading, pylock
path, mode = sys.argv[1], sys.argv[2]
lock = pylock.Lock(path)
base_threads = threading.active_count()
print("waiting", flush=True)
try:
    if mode == "sync":
        lock.acquire()
    elif mode == "sync_timed":
        lock.acquire(timeout=300)
    elif mode == "async":
        asyncio.run(lock.acquire_async())
    elif mode == "async_timed":
        asyncio.run(lock.acquire_async(timeout=300))
    outcome = "acquired"
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
def state():
    st = os.stat(path)
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            s = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            fds.append(int(fd))
    return {"outcome": outcome, "locked": lock.locked,
            "threads": [t.name for t in threading.enumerate()],
            "base_threads": base_threads, "lock_fds": fds}
print("state", json.dumps(state()), flush=True)
sys.stdin.readline()
print("state", json.dumps(state()), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("mode", ["sync", "sync_timed", "async", "async_timed"])
def test_keyboard_interrupt_during_blocking_acquire_leaves_nothing(
    tmp_path: Path, mode: str
) -> None:
    path = str(tmp_path / "ctrlc.lock")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        waiter = Script(INTERRUPTED_WAITER, path, mode)
        waiter.expect("waiting")
        wait_blocked(path, waiter.pid)
        t0 = time.monotonic()
        waiter.signal(signal.SIGINT)
        first = json.loads(waiter.expect("state", within=60))
        assert time.monotonic() - t0 < 5
        assert first["outcome"] == "KeyboardInterrupt"
        assert first["locked"] is False
        assert len(first["threads"]) == first["base_threads"] == 1, first["threads"]
        assert waiter.pid not in blocked_waiters(path), "still queued in the kernel"
        # The holder goes; the interrupted waiter must not pick the lock up.
        holder.send()
        holder.expect("released")
        holder.close()
        assert pylock.holders(path) == []
        probe = pylock.Lock(path)
        probe.acquire(blocking=False)
        probe.release()
        probe.close()
        waiter.send()
        second = json.loads(waiter.expect("state", within=60))
        assert second["locked"] is False
        assert len(second["threads"]) == 1
        # The descriptor kept open between acquisitions is allowed; a lock on it is not.
        assert len(second["lock_fds"]) <= 1
        assert [h.pid for h in pylock.holders(path)] == []
        assert fds_on(waiter.pid, path) == second["lock_fds"]
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()
