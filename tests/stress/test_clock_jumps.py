"""Clock jumps: with the wall clock years off, or jumping during a wait, for the
holder or the waiter (Debian's faketime / libfaketime), no decision changes.
Identity uses boot-relative start times, timeouts the monotonic clock; only
the displayed "since" moves."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import threading
import time
from pathlib import Path

import pytest

import pylock
from pylock._core.process import identity_of
from tests.support.kernel_locks import wait_blocked
from tests.support.procs import Script
from tests.support.sizes import Figures


def _libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")) + sorted(
        glob.glob("/usr/lib*/faketime/libfaketimeMT.so.1")
    )
    return found[0] if found else None


LIBFAKETIME = _libfaketime()
pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None, reason="Debian's faketime (libfaketimeMT.so.1) is not installed"
)

SHIFTS = {"10y_back": "-10y", "10y_ahead": "+10y"}


def faketime_env(spec: str, monotonic: bool = False, **extra: str) -> dict[str, str]:
    """libfaketime preloaded directly (the faketime(1) wrapper would fork, and
    the process would not be the pid we watch). monotonic=False moves only the
    wall clock, as when an admin sets the date; True is plain faketime(1),
    which shifts CLOCK_MONOTONIC as the process sees it too."""
    env = dict(os.environ)
    assert LIBFAKETIME is not None
    env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME=spec, **extra)
    if not monotonic:
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return env


HOLDER = r"""
import sys, time, pylock
lock = pylock.Lock(sys.argv[1], info={"clock": "shifted"})
lock.acquire()
print("held", time.time(), flush=True)
sys.stdin.readline()
"""


def _years_apart(a: dt.datetime, b: dt.datetime) -> float:
    return abs((a - b).total_seconds()) / (365.25 * 86400)


@pytest.mark.parametrize("shift", sorted(SHIFTS))
def test_holder_with_shifted_wall_clock(tmp_path: Path, shift: str, figures: Figures) -> None:
    path = str(tmp_path / "clock.lock")
    holder = Script(HOLDER, path, env=faketime_env(SHIFTS[shift]))
    waiter = None
    try:
        faked_now = float(holder.expect("held"))
        now = dt.datetime.now(dt.timezone.utc)
        assert _years_apart(dt.datetime.fromtimestamp(faked_now, dt.timezone.utc), now) > 9.5

        h = pylock.Lock(path).holder()
        assert h is not None and h.pid == holder.pid and h.verified and h.alive()
        real = identity_of(holder.pid)
        assert real is not None and h.start_time == real.start_time
        assert h.info == {"clock": "shifted"}
        assert h.acquired_at is not None and _years_apart(h.acquired_at, now) > 9.5
        with pytest.raises(pylock.LockHeld) as info:
            pylock.Lock(path).acquire(blocking=False)
        assert f"since {h.acquired_at.year}" in str(info.value)
        t0 = time.monotonic()
        with pytest.raises(pylock.LockTimeout):
            pylock.Lock(path).acquire(timeout=0.3)
        assert 0.3 <= time.monotonic() - t0 < 3.0  # a wall-clock wait would take years

        # Its death frees the lock for a blocked waiter, and wait_exit sees it.
        waiter = Script(
            "import sys, time, pylock\n"
            "l = pylock.Lock(sys.argv[1])\n"
            "print('waiting', flush=True)\n"
            "l.acquire()\n"
            "print('got', time.monotonic_ns(), flush=True)\n"
            "sys.stdin.readline()\n",
            path,
        )
        waiter.expect("waiting")
        wait_blocked(path, waiter.pid)
        t_kill = time.monotonic_ns()
        holder.kill()
        got = int(waiter.expect("got"))
        assert pylock.wait_exit(h, timeout=5) is True
        assert not h.alive()
        handover_ms = (got - t_kill) / 1e6
        figures(
            holder_clock=SHIFTS[shift],
            displayed_since=h.acquired_at.isoformat(),
            verified=h.verified,
            kill_to_waiter_ms=round(handover_ms, 3),
        )
        assert handover_ms < 1000
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()


WAITER = r"""
import asyncio, json, sys, time, pylock
path = sys.argv[1]
lock = pylock.Lock(path)
try:
    lock.acquire(blocking=False)
    print("refused none", flush=True)
except pylock.LockHeld as e:
    h = e.holder
    print("refused", json.dumps({"pid": h.pid, "verified": h.verified,
          "start_time": h.start_time, "since": h.acquired_at.year, "msg": str(e)}), flush=True)
t = time.monotonic()
try:
    lock.acquire(timeout=0.5)
except pylock.LockTimeout:
    pass
print("timed", time.monotonic() - t, flush=True)
t = time.monotonic()
try:
    asyncio.run(lock.acquire_async(timeout=0.5))
except pylock.LockTimeout:
    pass
print("async_timed", time.monotonic() - t, flush=True)
async def watch():
    print("watching", flush=True)
    return await pylock.holder_exit(h)
t = time.monotonic()
asyncio.run(watch())
print("exited", time.monotonic() - t, flush=True)
lock.acquire(blocking=False)
print("acquired", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("shift", sorted(SHIFTS))
def test_waiter_with_shifted_wall_clock(tmp_path: Path, shift: str, figures: Figures) -> None:
    path = str(tmp_path / "clock.lock")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        waiter = Script(WAITER, path, env=faketime_env(SHIFTS[shift]))
        seen = json.loads(waiter.expect("refused"))
        real = identity_of(holder.pid)
        assert real is not None
        assert seen["pid"] == holder.pid and seen["verified"]
        assert seen["start_time"] == real.start_time
        # The holder's own (true) time is displayed, whatever the waiter's clock says.
        assert seen["since"] == dt.datetime.now(dt.timezone.utc).year
        timed = float(waiter.expect("timed"))
        async_timed = float(waiter.expect("async_timed"))
        assert 0.5 <= timed < 1.0 and 0.5 <= async_timed < 1.0
        waiter.expect("watching")
        holder.kill()
        exited = float(waiter.expect("exited"))
        waiter.expect("acquired")
        figures(
            waiter_clock=SHIFTS[shift],
            timed_out_after_s=round(timed, 3),
            async_timed_out_after_s=round(async_timed, 3),
            holder_exit_s=round(exited, 3),
        )
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()


JUMPING_WAITER = r"""
import asyncio, sys, time, pylock
path, mode = sys.argv[1], sys.argv[2]
lock = pylock.Lock(path)
print("waiting", time.time(), flush=True)
t = time.monotonic()
outcome = "acquired"
try:
    if mode == "timed":
        lock.acquire(timeout=2.0)
    elif mode == "async_timed":
        asyncio.run(lock.acquire_async(timeout=2.0))
    else:
        lock.acquire()
except pylock.LockTimeout:
    outcome = "timeout"
print("done", outcome, time.monotonic() - t, time.time(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("mode", ["timed", "async_timed", "blocking"])
def test_wall_clock_jumps_during_the_wait(tmp_path: Path, mode: str, figures: Figures) -> None:
    path = str(tmp_path / "jump.lock")
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    env = faketime_env("+0", FAKETIME_TIMESTAMP_FILE=str(stamp), FAKETIME_NO_CACHE="1")
    env.pop("FAKETIME")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        waiter = Script(JUMPING_WAITER, path, mode, env=env)
        start_wall = float(waiter.expect("waiting"))
        wait_blocked(path, waiter.pid)
        t0 = time.monotonic()
        stamp.write_text("+10y\n")  # the date jumps ten years ahead...
        stamp.write_text("-10y\n")  # ...and then ten years back, mid-wait
        if mode == "blocking":
            holder.kill()
        outcome, elapsed, end_wall = waiter.expect("done").split()
        figures(
            mode=mode,
            outcome=outcome,
            elapsed_monotonic_s=round(float(elapsed), 3),
            wall_clock_moved_years=round((float(end_wall) - start_wall) / (365.25 * 86400), 1),
        )
        assert float(end_wall) - start_wall < -9 * 365 * 86400, "the wall clock did not jump"
        if mode == "blocking":
            assert outcome == "acquired"
            assert time.monotonic() - t0 < 2
        else:
            assert outcome == "timeout"
            assert 2.0 <= float(elapsed) < 4.0  # ten years back would never end
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()


@pytest.mark.parametrize("mode", ["timed", "async_timed"])
def test_timeouts_under_default_faketime_do_not_hang(tmp_path: Path, mode: str) -> None:
    """Plain `faketime` also moves CLOCK_MONOTONIC as the process sees it: a
    timed wait must still end (the kernel's timers run on the real clock)."""
    path = str(tmp_path / "ft.lock")
    holder = Script(HOLDER, path)
    waiter = None
    try:
        holder.expect("held")
        waiter = Script(JUMPING_WAITER, path, mode, env=faketime_env("-10y", monotonic=True))
        waiter.expect("waiting")
        t0 = time.monotonic()
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(waiter.expect("done")), daemon=True)
        reader.start()
        reader.join(8)
        assert box, f"{mode}: still waiting {time.monotonic() - t0:.1f}s after a 2 s timeout"
        outcome, elapsed, _ = box[0].split()
        assert outcome == "timeout"
        assert 2.0 <= float(elapsed) < 5.0  # bounded, on a loaded machine too
    finally:
        holder.close()
        if waiter is not None:
            waiter.close()
