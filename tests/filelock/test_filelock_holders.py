"""What pylock.filelock adds to filelock: holder() and holder_exit() on its
objects, async waits in the kernel, and the names it refuses, with why."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import pylock
import pylock.filelock as front
from tests.support.kernel_locks import until_waiting


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "front.lock")


@pytest.mark.parametrize("kind", [front.FileLock, front.AsyncFileLock])
def test_holder_names_the_process_holding_a_front_lock(
    path: str, spawn_holder: type, kind: type
) -> None:
    lock = kind(path)
    assert lock.holder() is None
    holder = spawn_holder(path)
    seen = lock.holder()
    assert seen is not None and seen.pid == holder.pid and seen.verified


def test_holder_exit_of_a_front_lock_returns_when_its_holder_dies(
    path: str, spawn_holder: type
) -> None:
    holder = spawn_holder(path)
    lock = front.FileLock(path)

    async def watch() -> None:
        watching = asyncio.ensure_future(pylock.holder_exit(lock, timeout=60))
        await asyncio.sleep(0)
        assert not watching.done()
        holder.kill()
        await watching

    asyncio.run(watch())
    assert lock.holder() is None


def test_wait_exit_of_a_front_lock(path: str, spawn_holder: type) -> None:
    holder = spawn_holder(path)
    lock = front.FileLock(path)
    assert pylock.wait_exit(lock, timeout=0) is False
    holder.kill()
    assert pylock.wait_exit(lock, timeout=60) is True


def test_an_async_wait_is_the_kernels_and_ends_at_the_release(
    path: str, spawn_holder: type
) -> None:
    holder = spawn_holder(path)
    lock = front.AsyncFileLock(path)

    async def wait() -> None:
        task = asyncio.ensure_future(lock.acquire())
        await until_waiting(path, lambda: not task.done())
        holder.release()
        await asyncio.wait_for(task, 60)
        assert lock.is_locked
        await lock.release()

    asyncio.run(wait())


def test_an_async_timeout_names_the_holder(path: str, spawn_holder: type) -> None:
    holder = spawn_holder(path)

    async def attempt() -> front.Timeout:
        with pytest.raises(front.Timeout) as raised:
            await front.AsyncFileLock(path).acquire(timeout=0.01)
        return raised.value

    error = asyncio.run(attempt())
    assert error.holder is not None and error.holder.pid == holder.pid


def test_a_front_lock_and_filelocks_own_exclude_each_other(path: str) -> None:
    filelock = pytest.importorskip("filelock")
    if filelock.FileLock.__module__.startswith("pylock"):
        pytest.skip("filelock here is the front itself")
    theirs = filelock.FileLock(path)
    with theirs:
        with pytest.raises(front.Timeout) as raised:
            front.FileLock(path).acquire(blocking=False)
        assert raised.value.holder is not None and raised.value.holder.pid == os.getpid()
    with front.FileLock(path), pytest.raises(filelock.Timeout):
        filelock.FileLock(path).acquire(blocking=False)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("ReadWriteLock", "SQLite"),
        ("AsyncReadWriteLock", "SQLite"),
        ("SoftReadWriteLock", "by age"),
        ("AsyncSoftReadWriteLock", "by age"),
        ("SoftFileLease", "by age"),
        ("AsyncSoftFileLease", "by age"),
        ("MarkerSoftFileLock", "pid and host in a file"),
        ("StrictSoftFileLock", "pid and host in a file"),
        ("AsyncStrictSoftFileLock", "pid and host in a file"),
    ],
)
def test_what_is_not_offered_refuses_to_be_made_saying_why(
    path: str, name: str, reason: str
) -> None:
    with pytest.raises(NotImplementedError, match=f"pylock.filelock.{name} is not supported: "):
        getattr(front, name)(path)
    with pytest.raises(NotImplementedError, match=reason):
        getattr(front, name)(path, timeout=1)
    assert not os.path.exists(path)


def test_on_acquired_is_refused_naming_why(path: str) -> None:
    with pytest.raises(NotImplementedError, match="lends nobody its lock descriptor"):
        front.FileLock(path, on_acquired=lambda fd: None)


def test_import_pylock_does_not_load_the_front() -> None:
    import subprocess
    import sys

    from tests.support import env_with_repo

    code = "import sys, pylock; print('pylock.filelock' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env_with_repo(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "False"
