"""Lock from asyncio: waits happen in the kernel off the loop; timeouts and
cancellation leave no thread, descriptor, kernel wait or lock behind."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from typing import Any

import pytest

import pylock
from tests.support.children import Forked
from tests.support.kernel_locks import (
    blocked_waiters,
    free_from_elsewhere,
    open_fds,
    until_blocked,
    wait_blocked,
)
from tests.support.procs import wait_threads_end, wakeups

# -- helpers ---------------------------------------------------------------


def free_here(path: str) -> bool:
    probe = pylock.Lock(path)
    try:
        probe.acquire(blocking=False)
    except pylock.LockHeld:
        return False
    finally:
        if probe.locked:
            probe.release()
        probe.close()
    return True


def pylock_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pylock")]


# -- basics ------------------------------------------------------------------


def test_acquire_async_and_async_with(lock_path: str) -> None:
    async def main() -> None:
        lock = pylock.Lock(lock_path, info={"port": 1})
        assert await lock.acquire_async() is True
        assert lock.locked and not free_from_elsewhere(lock_path)
        lock.release()
        assert free_from_elsewhere(lock_path)
        async with lock as same:
            assert same is lock and lock.locked
            found = lock.holder()
            assert found is not None and found.pid == os.getpid() and found.verified
            assert found.info == {"port": 1}
        assert not lock.locked and free_from_elsewhere(lock_path)

    asyncio.run(main())


def test_async_with_releases_on_exception(lock_path: str) -> None:
    async def main() -> None:
        lock = pylock.Lock(lock_path)
        with pytest.raises(KeyError):
            async with lock:
                raise KeyError("boom")
        assert not lock.locked

    asyncio.run(main())
    assert free_from_elsewhere(lock_path)


def test_waiting_does_not_block_the_loop_and_release_hands_over(lock_path: str) -> None:
    """Two tasks, two Lock objects on one path: the second waits while the loop runs."""

    async def main() -> None:
        first, second = pylock.Lock(lock_path), pylock.Lock(lock_path)
        await first.acquire_async()
        waiting = asyncio.ensure_future(second.acquire_async())
        await until_blocked(lock_path, os.getpid())
        ticks = 0
        for _ in range(20):  # the loop keeps running other work meanwhile
            await asyncio.sleep(0)
            ticks += 1
        assert ticks == 20 and not waiting.done()
        first.release()
        assert await asyncio.wait_for(waiting, 10) is True
        assert second.locked and not first.locked
        second.release()

    asyncio.run(main())


def test_a_waiting_task_whose_file_is_unlinked_locks_the_file_now_at_the_path(
    lock_path: str,
) -> None:
    """The wait's thread claims the grant (path check, record) before handing
    over: a grant on a file that left its path is given back, and the task
    starts again on the path."""

    async def main() -> None:
        holder, waiter = pylock.Lock(lock_path), pylock.Lock(lock_path)
        holder.acquire()
        waiting = asyncio.ensure_future(waiter.acquire_async())
        await until_blocked(lock_path, os.getpid())
        holder.release(unlink=True)
        assert await asyncio.wait_for(waiting, 10) is True
        at_path, held = os.stat(lock_path), os.fstat(waiter._handle)
        assert (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)
        assert not free_from_elsewhere(lock_path)
        found = waiter.holder()
        assert found is not None and found.pid == os.getpid()
        waiter.release()

    asyncio.run(main())


def test_wait_threads_block_every_signal_of_the_program(lock_path: str) -> None:
    """A pylock wait thread takes none of the program's signals: all are
    blocked in it but pylock's own wake signal, which ends the wait."""
    from pylock._native import lib

    async def main() -> int:
        holder, waiter = pylock.Lock(lock_path), pylock.Lock(lock_path)
        holder.acquire()
        waiting = asyncio.ensure_future(waiter.acquire_async())
        await until_blocked(lock_path, os.getpid())
        (thread,) = [t for t in threading.enumerate() if t.name.startswith("pylock wait")]
        with open(f"/proc/self/task/{thread.native_id}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        holder.release()
        await asyncio.wait_for(waiting, 10)
        waiter.release()
        return int(fields["SigBlk"], 16)

    blocked = asyncio.run(main())
    wake = lib.pl_wake_signal()
    unblockable = {signal.SIGKILL, signal.SIGSTOP}
    expected = {int(s) for s in signal.valid_signals()} - unblockable - {wake}
    assert wake > 0
    assert {n for n in range(1, 65) if blocked >> (n - 1) & 1} == expected


def test_two_tasks_on_one_lock_object_take_turns(lock_path: str) -> None:
    async def main() -> None:
        lock = pylock.Lock(lock_path)
        order: list[str] = []

        async def worker(name: str, hold: asyncio.Event | None) -> None:
            async with lock:
                order.append(f"{name} in")
                if hold is not None:
                    await hold.wait()
                order.append(f"{name} out")

        hold = asyncio.Event()
        a = asyncio.ensure_future(worker("a", hold))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(worker("b", None))
        for _ in range(10):
            await asyncio.sleep(0)
        assert order == ["a in"]
        hold.set()
        await asyncio.wait_for(asyncio.gather(a, b), 10)
        assert order == ["a in", "a out", "b in", "b out"]

    asyncio.run(main())


def test_reacquire_from_the_holding_task_raises(lock_path: str) -> None:
    async def main() -> None:
        lock = pylock.Lock(lock_path)
        await lock.acquire_async()
        with pytest.raises(pylock.ReentrantAcquire):
            await lock.acquire_async()
        other = pylock.Lock(lock_path)
        t0 = time.monotonic()
        with pytest.raises(pylock.ReentrantAcquire):  # another object, same task: deadlock
            await other.acquire_async(timeout=30)
        assert time.monotonic() - t0 < 5
        with pytest.raises(pylock.ReentrantAcquire):
            await other.acquire_async()
        lock.release()
        assert await other.acquire_async(timeout=5)
        other.release()

    asyncio.run(main())


# -- kernel wakeups ------------------------------------------------------------


def test_sigkill_of_holder_wakes_an_async_waiter_at_once(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> float:
        lock = pylock.Lock(lock_path)
        acquired_at = 0.0

        async def take() -> None:
            nonlocal acquired_at
            await lock.acquire_async()
            acquired_at = time.monotonic()

        task = asyncio.ensure_future(take())
        await until_blocked(lock_path, os.getpid())
        killed_at = time.monotonic()
        holder.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(task, 10)
        assert lock.locked
        found = lock.holder()
        assert found is not None and found.pid == os.getpid()
        lock.release()
        return acquired_at - killed_at

    latency = asyncio.run(main())
    # Measured ~1 ms here; timing goals live in bench/.
    assert latency < 1.0, f"async waiter took {latency:.3f} s after the holder's SIGKILL"


def test_async_waiter_sleeps_in_the_kernel(lock_path: str, spawn_holder, forked) -> None:
    """While waiting, no thread of the waiting process wakes up: no polling anywhere."""
    holder = spawn_holder(lock_path)

    def child(chan: Forked.Chan) -> None:
        async def main() -> None:
            lock = pylock.Lock(lock_path)
            chan.say("waiting")
            await lock.acquire_async(timeout=60)
            chan.say("acquired")
            lock.release()

        asyncio.run(main())

    waiter = forked(child)
    assert waiter.line() == "waiting"
    wait_blocked(lock_path, waiter.pid)
    before = wakeups(waiter.pid)
    time.sleep(0.3)  # an interval to watch, not a synchronisation
    after = wakeups(waiter.pid)
    assert after == before, f"{after - before} wakeups while the lock stayed held"
    holder.proc.send_signal(signal.SIGKILL)
    assert waiter.line() == "acquired"
    assert waiter.wait() == 0


# -- giving up -------------------------------------------------------------------


def test_async_timeout_raises_and_never_acquires_afterwards(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> None:
        lock = pylock.Lock(lock_path)
        t0 = time.monotonic()
        with pytest.raises(pylock.LockTimeout) as info:
            await lock.acquire_async(timeout=0.2)
        assert 0.2 <= time.monotonic() - t0 < 5
        assert isinstance(info.value, TimeoutError)
        assert info.value.holder is not None and info.value.holder.pid == holder.pid
        assert f"pid {holder.pid}" in str(info.value)
        assert not lock.locked
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lock.acquire_async(), 0.05)
        assert not lock.locked

    asyncio.run(main())
    assert blocked_waiters(lock_path) == []
    holder.release()
    assert free_from_elsewhere(lock_path)


def test_cancelled_wait_never_acquires_afterwards(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> pylock.Lock:
        lock = pylock.Lock(lock_path)
        task = asyncio.ensure_future(lock.acquire_async())
        await until_blocked(lock_path, os.getpid())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lock.locked
        return lock

    lock = asyncio.run(main())
    assert blocked_waiters(lock_path) == []
    holder.release()
    assert free_from_elsewhere(lock_path)
    assert not lock.locked


def test_200_timed_out_and_200_cancelled_waits_leak_nothing(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> dict[str, Any]:
        gc.collect()
        fds, threads = open_fds(), threading.active_count()
        lock = pylock.Lock(lock_path)
        timed_out = cancelled = 0
        for _ in range(200):
            try:
                await lock.acquire_async(timeout=0.002)
            except pylock.LockTimeout:
                timed_out += 1
        for _ in range(200):
            task = asyncio.ensure_future(lock.acquire_async())
            await until_blocked(lock_path, os.getpid())  # cancel a real kernel wait
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
        locked = lock.locked
        lock.close()
        gc.collect()
        wait_threads_end()  # they end by themselves, a moment after the cancel
        return {
            "timed_out": timed_out,
            "cancelled": cancelled,
            "locked": locked,
            "new_fds": open_fds() - fds,
            "threads": threading.active_count() - threads,
            "pylock_threads": pylock_threads(),
            "blocked": blocked_waiters(lock_path),
        }

    outcome = asyncio.run(main())
    assert outcome == {
        "timed_out": 200,
        "cancelled": 200,
        "locked": False,
        "new_fds": set(),
        "threads": 0,
        "pylock_threads": [],
        "blocked": [],
    }
    holder.release()
    assert free_from_elsewhere(lock_path)


def test_cancel_racing_the_grant_never_leaves_the_lock_held(lock_path: str) -> None:
    """The holder releases as the waiter is cancelled: either the waiter got the
    lock (and says so) or the cancel won and nobody holds it."""

    async def main() -> tuple[int, int]:
        holder, waiter = pylock.Lock(lock_path), pylock.Lock(lock_path)
        won = lost = 0
        for i in range(100):
            holder.acquire()
            task = asyncio.ensure_future(waiter.acquire_async())
            await until_blocked(lock_path, os.getpid())
            if i % 2:
                holder.release()
                task.cancel()
            else:
                task.cancel()
                holder.release()
            try:
                await task
            except asyncio.CancelledError:
                lost += 1
                assert not waiter.locked
                assert free_here(lock_path), f"round {i}: cancelled, yet the lock is held"
            else:
                won += 1
                assert waiter.locked
                waiter.release()
        return won, lost

    won, lost = asyncio.run(main())
    assert won + lost == 100
    assert free_from_elsewhere(lock_path)


def test_timeout_racing_the_release_never_leaves_the_lock_held(lock_path: str) -> None:
    """Sync waits whose deadline falls as the holder releases: LockTimeout means free."""
    holder = pylock.Lock(lock_path)
    waiter = pylock.Lock(lock_path)
    for i in range(100):
        holder.acquire()
        outcome: list[object] = []

        def wait(outcome: list[object] = outcome) -> None:
            try:
                outcome.append(waiter.acquire(timeout=0.002))
            except pylock.LockTimeout as exc:
                outcome.append(exc)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(i * 0.00004)  # sweeps the release across the 2 ms deadline
        holder.release()
        t.join()
        if outcome == [True]:
            waiter.release()
        else:
            assert isinstance(outcome[0], pylock.LockTimeout)
            assert not waiter.locked
            assert free_here(lock_path), f"round {i}: timed out, yet the lock is held"
    assert free_from_elsewhere(lock_path)


def test_cancelled_task_does_not_swallow_the_next_tasks_turn(lock_path: str) -> None:
    """Three tasks share one Lock object: the holder releases, the task whose turn
    it is gets cancelled before it runs; the third must still get the lock."""

    async def main() -> tuple[bool, float]:
        lock = pylock.Lock(lock_path)
        await lock.acquire_async()
        first = asyncio.ensure_future(lock.acquire_async())
        second = asyncio.ensure_future(lock.acquire_async(timeout=2))
        for _ in range(5):
            await asyncio.sleep(0)  # both wait for the object now
        lock.release()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        t0 = time.monotonic()
        try:
            await second
        except pylock.LockTimeout:
            return False, time.monotonic() - t0
        lock.release()
        return True, time.monotonic() - t0

    got, waited = asyncio.run(main())
    assert got, f"the lock was free, yet the waiting task timed out after {waited:.1f} s"


@pytest.mark.parametrize("timeout", [1e12, float("inf")])
def test_huge_timeout_never_hangs(lock_path: str, spawn_holder, timeout: float) -> None:
    """A timeout too large for the kernel's clock waits like no timeout: never a
    crash, never a task waiting on a thread that died."""
    holder = spawn_holder(lock_path)

    async def main() -> object:
        lock = pylock.Lock(lock_path)
        task = asyncio.ensure_future(lock.acquire_async(timeout=timeout))
        for _ in range(20):
            await asyncio.sleep(0.001)  # let it start (or fail) before the release
        holder.release()
        try:
            outcome: object = await asyncio.wait_for(task, 3)
        except asyncio.TimeoutError:
            return "hung"
        if lock.locked:
            lock.release()
        return outcome

    assert asyncio.run(main()) is True
