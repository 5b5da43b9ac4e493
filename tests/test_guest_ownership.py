"""Who owns a Lock object, and hand-overs between threads, tasks and loops that
the host program creates, ends and closes as it likes."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import resource
import sys
import threading

import pytest

import pylock
from tests.support.kernel_locks import free_from_elsewhere

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def wait_sleeping(thread: threading.Thread) -> None:
    """Until the thread sleeps in the kernel (or has ended)."""
    while thread.is_alive():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    return
        except FileNotFoundError:
            return
        os.sched_yield()


def pylock_wait_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pylock wait")]


def test_a_new_thread_with_a_reused_id_is_not_the_old_owner(lock_path: str) -> None:
    """Thread ids are reused as soon as a thread ends: a thread whose id equals
    that of an ended holder must be told the lock is held, not that it
    holds it already."""
    lock = pylock.Lock(lock_path)
    first = threading.Thread(target=lock.acquire)
    first.start()
    first.join()
    outcomes = []
    for _ in range(50):
        result: list[object] = []

        def again(result: list[object] = result) -> None:
            try:
                lock.acquire(blocking=False)
                result.append("acquired")
            except pylock.LockError as exc:
                result.append(type(exc).__name__)

        t = threading.Thread(target=again)
        t.start()
        t.join()
        outcomes.append((t.ident == first.ident, result[0]))
    assert any(same for same, _ in outcomes), "no thread id was reused: the test proves nothing"
    assert {what for _, what in outcomes} == {"LockHeld"}
    lock.release()


def test_a_new_task_with_a_reused_id_is_not_the_old_owner(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)

    async def main() -> list[str]:
        first = asyncio.ensure_future(lock.acquire_async())
        await first
        first_id = id(first)
        del first
        gc.collect()
        outcomes = []
        for _ in range(200):

            async def again() -> str:
                try:
                    await lock.acquire_async(timeout=0)
                    return "acquired"
                except pylock.LockError as exc:
                    return type(exc).__name__

            task = asyncio.ensure_future(again())
            outcomes.append(await task)
            if id(task) == first_id:
                outcomes.append("same id")
        return outcomes

    outcomes = asyncio.run(main())
    assert "ReentrantAcquire" not in outcomes
    assert set(outcomes) <= {"LockTimeout", "same id"}
    lock.release()


def test_wait_for_then_acquire_again_from_the_same_task_is_reentrant(lock_path: str) -> None:
    """asyncio.wait_for on Python 3.11 runs the acquire in an inner task: the
    lock is still the outer task's, so acquiring again must raise at once,
    not wait until the timeout."""
    lock = pylock.Lock(lock_path)

    async def main() -> str:
        await asyncio.wait_for(lock.acquire_async(), 5)
        try:
            await asyncio.wait_for(lock.acquire_async(), 5)
        except pylock.ReentrantAcquire:
            return "reentrant"
        except pylock.LockTimeout:
            return "timed out"
        finally:
            lock.release()
        return "acquired twice"

    assert asyncio.run(main()) == "reentrant"


def _spin_until(loop: asyncio.AbstractEventLoop, done: object) -> None:
    while not done():  # type: ignore[operator]
        loop.run_until_complete(asyncio.sleep(0))


def test_a_closed_loops_waiter_does_not_swallow_the_next_hand_over(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    dead = asyncio.new_event_loop()
    dead.create_task(lock.acquire_async())  # noqa: RUF006 - left pending on purpose
    _spin_until(dead, lambda: len(lock._object_waiters) == 1)
    dead.close()  # closed with the task pending, never cancelled

    got: list[object] = []
    queued = threading.Event()

    def live() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(lock.acquire_async(timeout=10))
            while len(lock._object_waiters) < 2:
                await asyncio.sleep(0.001)
            queued.set()
            try:
                got.append(await task)
            except pylock.LockError as exc:
                got.append(exc)
            lock.release()

        asyncio.run(main())

    t = threading.Thread(target=live)
    t.start()
    assert queued.wait(10)
    lock.release()
    t.join()
    assert got == [True]


def test_a_kernel_wait_whose_loop_closed_gives_the_lock_back(lock_path: str) -> None:
    holder = pylock.Lock(lock_path)
    held = threading.Thread(target=holder.acquire)
    held.start()
    held.join()
    waiter = pylock.Lock(lock_path)
    loop = asyncio.new_event_loop()
    loop.create_task(waiter.acquire_async())  # noqa: RUF006 - left pending on purpose
    _spin_until(loop, lambda: bool(pylock_wait_threads()))
    loop.close()
    gc.disable()  # the lock must come back without the garbage collector's help
    try:
        threads = pylock_wait_threads()
        holder.release()
        for t in threads:
            t.join()
        assert not waiter.locked
        assert free_from_elsewhere(lock_path)
    finally:
        gc.enable()


@pytest.mark.parametrize("timeout", [math.inf, 1e12, 1e300, -1, None])
def test_huge_and_endless_timeouts_wait_for_another_threads_hold_of_the_object(
    lock_path: str, timeout: float | None
) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(lock.acquire(timeout=timeout))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    wait_sleeping(t)  # blocked on this object, with that timeout
    lock.release()
    t.join()
    assert outcome == [True]
    lock.release()


@pytest.mark.parametrize("timeout", [math.nan, -0.5, -2, -math.inf])
def test_nan_and_negative_timeouts_are_refused_everywhere(lock_path: str, timeout: float) -> None:
    lock = pylock.Lock(lock_path)
    with pytest.raises(ValueError):
        lock.acquire(timeout=timeout)
    with pytest.raises(ValueError):
        asyncio.run(lock.acquire_async(timeout=timeout))
    assert not lock.locked


def test_out_of_descriptors_a_held_lock_is_still_reported_held(
    lock_path: str, spawn_holder
) -> None:
    """Naming the holder needs descriptors; the answer (LockHeld) must not."""
    holder = spawn_holder(lock_path)
    lock = pylock.Lock(lock_path)
    with pytest.raises(pylock.LockHeld):
        lock.acquire(blocking=False)  # opens the lock file while descriptors remain
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        with pytest.raises(pylock.LockHeld) as info:
            lock.acquire(blocking=False)
        assert info.value.holder is None or info.value.holder.pid == holder.pid
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    lock.close()
