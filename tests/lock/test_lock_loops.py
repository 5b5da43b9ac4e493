"""Lock waits on each event loop a service may run: asyncio's own and uvloop.

The hand-over from pylock's waiting thread, cancellation of a kernel wait,
timeouts and turns between tasks on one Lock object must behave the same.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from typing import Any, Callable

import pytest

import pylock
from tests.support.kernel_locks import free_from_elsewhere

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
LOOPS = [
    "asyncio",
    pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop")),
]


def run_on(kind: str, main: Callable[[], Any]) -> Any:
    if kind == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def held_by_another_thread(path: str) -> pylock.Lock:
    holder = pylock.Lock(path)
    t = threading.Thread(target=holder.acquire)
    t.start()
    t.join()
    return holder


async def until_waiting_in_kernel() -> None:
    while not any(t.name.startswith("pylock wait") for t in threading.enumerate()):
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("loop", LOOPS)
def test_release_hands_over_to_a_waiting_task(lock_path: str, loop: str) -> None:
    holder = held_by_another_thread(lock_path)
    lock = pylock.Lock(lock_path)

    async def main() -> list[str]:
        order = []
        task = asyncio.ensure_future(lock.acquire_async())
        await until_waiting_in_kernel()
        order.append("waiting")
        holder.release()
        await task
        order.append("acquired")
        assert lock.locked
        lock.release()
        return order

    assert run_on(loop, main) == ["waiting", "acquired"]


@pytest.mark.parametrize("loop", LOOPS)
def test_cancelling_a_kernel_wait_leaves_nothing_held(lock_path: str, loop: str) -> None:
    holder = held_by_another_thread(lock_path)
    lock = pylock.Lock(lock_path)

    async def main() -> bool:
        task = asyncio.ensure_future(lock.acquire_async())
        await until_waiting_in_kernel()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return not lock.locked
        return False

    assert run_on(loop, main)
    holder.release()
    assert free_from_elsewhere(lock_path)


@pytest.mark.parametrize("loop", LOOPS)
def test_timeout_and_wait_for_raise_and_never_acquire_later(lock_path: str, loop: str) -> None:
    holder = held_by_another_thread(lock_path)
    lock = pylock.Lock(lock_path)

    async def main() -> list[str]:
        seen = []
        try:
            await lock.acquire_async(timeout=0.05)
        except pylock.LockTimeout:
            seen.append("LockTimeout")
        try:
            await asyncio.wait_for(lock.acquire_async(), 0.05)
        except asyncio.TimeoutError:
            seen.append("TimeoutError")
        return seen

    assert run_on(loop, main) == ["LockTimeout", "TimeoutError"]
    holder.release()
    assert not lock.locked and free_from_elsewhere(lock_path)


@pytest.mark.parametrize("loop", LOOPS)
def test_tasks_sharing_one_lock_object_take_turns(lock_path: str, loop: str) -> None:
    lock = pylock.Lock(lock_path)
    inside = 0
    overlaps = 0

    async def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(50):
            async with lock:
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(0)
                inside -= 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(8)))

    run_on(loop, main)
    assert overlaps == 0
    assert free_from_elsewhere(lock_path)
