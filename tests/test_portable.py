"""The behaviour every platform must share, through the public API only.

Marked portable: the macOS and Windows jobs run this module (and any other
test marked portable); the rest of the suite uses Linux facilities (/proc,
flock(1), mounts, pid namespaces, seccomp) and is skipped there.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import threading

import pytest

import pylock
from tests.support.children import HolderProcess
from tests.support.kernel_locks import WAITING_WINDOW, until_waiting, wait_until_waiting

pytestmark = pytest.mark.portable


def test_a_second_process_is_refused_with_the_holder_named(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path, info={"port": 8080})
    with pytest.raises(pylock.LockHeld) as refused:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert refused.value.path == os.path.abspath(lock_path)
    assert refused.value.holder is not None and refused.value.holder.pid == holder.pid
    assert f"held by pid {holder.pid}" in str(refused.value)
    assert refused.value.holder.info == {"port": 8080}


def test_timeout_raises_lock_timeout_naming_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    with pytest.raises(pylock.LockTimeout) as timed_out:
        pylock.Lock(lock_path).acquire(timeout=0.2)
    assert isinstance(timed_out.value, TimeoutError)
    assert f"pid {holder.pid}" in str(timed_out.value)


def test_holder_and_free(lock_path: str, spawn_holder) -> None:
    lock = pylock.Lock(lock_path)
    assert lock.holder() is None
    holder = spawn_holder(lock_path)
    seen = lock.holder()
    assert seen is not None and seen.pid == holder.pid and seen.alive()
    holder.release()
    assert lock.holder() is None


def test_release_wakes_a_blocked_waiter(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    release_asked = threading.Event()
    entered_after_release: list[bool] = []

    def wait() -> None:
        with pylock.Lock(lock_path):
            entered_after_release.append(release_asked.is_set())

    waiter = threading.Thread(target=wait)
    waiter.start()
    # Waiting in the kernel while the holder holds, not merely not done yet.
    wait_until_waiting(lock_path, waiter.is_alive)
    release_asked.set()
    holder.release()
    waiter.join(timeout=60)
    assert entered_after_release == [True]


def test_a_killed_holder_frees_the_lock(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    holder.kill()
    lock = pylock.Lock(lock_path)
    # Windows may release a dead process's locks a moment after its exit.
    assert lock.acquire(timeout=30)
    lock.release()


def test_threads_exclude_each_other_through_two_objects(lock_path: str) -> None:
    first, second = pylock.Lock(lock_path), pylock.Lock(lock_path)
    first.acquire()
    outcome: list[BaseException] = []

    def try_second() -> None:
        try:
            second.acquire(blocking=False)
        except pylock.LockHeld as exc:
            outcome.append(exc)

    thread = threading.Thread(target=try_second)
    thread.start()
    thread.join()
    assert len(outcome) == 1 and not second.locked
    first.release()


def test_reacquire_from_the_holding_thread_is_refused(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    with lock, pytest.raises(pylock.ReentrantAcquire):
        lock.acquire()


def test_cancelled_async_wait_leaves_the_lock_free(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> None:
        task = asyncio.ensure_future(pylock.Lock(lock_path).acquire_async())
        await until_waiting(lock_path, lambda: not task.done())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    holder.release()
    lock = pylock.Lock(lock_path)
    lock.acquire(blocking=False)  # nobody kept it
    lock.release()


def test_async_acquire_waits_for_the_release_and_really_holds(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)

    async def main() -> None:
        lock = pylock.Lock(lock_path)
        waiting = asyncio.ensure_future(lock.acquire_async(timeout=60))
        await until_waiting(lock_path, lambda: not waiting.done())
        await asyncio.get_running_loop().run_in_executor(None, holder.release)
        assert await waiting is True
        assert lock.locked
        # The kernel's lock, not just the object's flag: a second Lock is refused.
        with pytest.raises(pylock.LockHeld):
            pylock.Lock(lock_path).acquire(blocking=False)
        lock.release()
        other = pylock.Lock(lock_path)
        other.acquire(blocking=False)
        other.release()

    asyncio.run(main())


def test_exit_of_a_child_with_its_status(tmp_path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
        stdin=subprocess.PIPE,
    )

    async def main() -> int | None:
        waiting = asyncio.ensure_future(pylock.holder_exit(child.pid, timeout=60))
        await asyncio.sleep(0)
        assert not waiting.done()
        assert child.stdin is not None
        child.stdin.close()
        return await waiting

    assert asyncio.run(main()) == 3
    assert child.wait(timeout=60) == 3  # still reapable by its Popen


def test_wait_exit_times_out_then_sees_the_exit(lock_path: str) -> None:
    holder = HolderProcess(lock_path)
    try:
        assert pylock.wait_exit(holder.pid, timeout=0.1) is False
        holder.kill()
        assert pylock.wait_exit(holder.pid, timeout=60) is True
    finally:
        holder.close()


@pytest.mark.parametrize("timeout", [1e12, float("inf")])
def test_wait_exit_with_a_huge_timeout_waits_for_the_exit(timeout: float) -> None:
    """A timeout too large for any clock waits like no timeout: never a crash."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(pylock.wait_exit(child.pid, timeout=timeout))
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        # Still waiting a while later, for a child that is still running.
        waiter.join(WAITING_WINDOW)
        assert outcome == []
    finally:
        assert child.stdin is not None
        child.stdin.close()
        waiter.join(60)
        child.wait(60)
    assert outcome == [True]


@pytest.mark.parametrize("timeout", [1e12, float("inf")])
def test_holder_exit_with_a_huge_timeout_waits_for_the_exit(timeout: float) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )

    async def main() -> int | None:
        waiting = asyncio.ensure_future(pylock.holder_exit(child.pid, timeout=timeout))
        done, _ = await asyncio.wait([waiting], timeout=WAITING_WINDOW)
        assert not done, waiting.result()
        assert child.stdin is not None
        child.stdin.close()
        return await waiting

    try:
        assert asyncio.run(main()) == 0
    finally:
        child.kill()
        child.wait(60)


def test_permanent_errors_are_lock_file_errors(tmp_path) -> None:
    with pytest.raises(pylock.LockFileError) as missing:
        pylock.Lock(tmp_path / "no" / "such" / "dir.lock").acquire(timeout=30)
    assert missing.value.errno == errno.ENOENT
    (tmp_path / "adir").mkdir()
    with pytest.raises(pylock.LockFileError):
        pylock.Lock(tmp_path / "adir").acquire(timeout=30)


def test_release_with_unlink_removes_the_file(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    lock.release(unlink=True)
    assert not os.path.exists(lock_path)
    with lock:  # and the same object locks the new file
        assert os.path.exists(lock_path)
