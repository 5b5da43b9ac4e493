"""pylock.filelock's SoftFileLock: filelock's existence lock.  A marker that
exists counts as held whoever made it, pylock never breaks one on a pid's
word, and a release removes only the marker it created."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest

import pylock
from pylock.filelock import AsyncSoftFileLock, SoftFileLock, Timeout

HANG = 60.0


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "soft.lock")


def test_the_marker_names_this_process_as_filelock_writes_it(path: str) -> None:
    with SoftFileLock(path):
        assert Path(path).read_text() == f"{os.getpid()}\n{socket.gethostname()}\n"
    assert not os.path.exists(path)


def test_a_marker_that_exists_counts_as_held_and_is_never_broken(path: str) -> None:
    # A marker whose pid is dead: filelock would break it, pylock does not.
    foreign = "4194305\nsome-other-host\n"
    Path(path).write_text(foreign)
    lock = SoftFileLock(path)
    with pytest.raises(Timeout) as raised:
        lock.acquire(blocking=False)
    with pytest.raises(Timeout):
        lock.acquire(timeout=0.01, poll_interval=0.001)
    error = raised.value
    assert error.holder is not None and error.holder.pid == 4194305
    assert "pid 4194305 on some-other-host" in str(error) and "not verified" in str(error)
    assert Path(path).read_text() == foreign and not lock.is_locked


def test_holder_is_what_the_marker_says(path: str) -> None:
    lock = SoftFileLock(path)
    assert lock.holder() is None
    with lock:
        seen = lock.holder()
    assert seen is not None and (seen.pid, seen.verified) == (os.getpid(), False)


def test_release_leaves_a_marker_that_replaced_ours_alone(path: str) -> None:
    lock = SoftFileLock(path)
    lock.acquire()
    os.unlink(path)
    Path(path).write_text("777\nanother\n")  # another process's marker now
    lock.release()
    assert Path(path).read_text() == "777\nanother\n" and not lock.is_locked


def test_the_marker_is_removed_from_the_directory_it_was_made_in(tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    lock = SoftFileLock(tmp_path / "first" / "soft.lock")
    lock.acquire()
    (tmp_path / "first").rename(tmp_path / "moved")
    lock.release()
    assert not (tmp_path / "moved" / "soft.lock").exists()


def test_reentrant_and_per_thread_like_filelock(path: str) -> None:
    lock = SoftFileLock(path)
    with lock, lock:
        assert lock.lock_counter == 2
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(_try(lock)))
        thread.start()
        thread.join(HANG)
        assert isinstance(outcome[0], Timeout)
    assert not os.path.exists(path)


def _try(lock: SoftFileLock) -> object:
    try:
        return lock.acquire(blocking=False)
    except Timeout as exc:
        return exc


def test_a_directory_at_the_path_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        SoftFileLock(tmp_path).acquire(timeout=HANG)


def test_lifetime_is_refused_naming_why(path: str) -> None:
    with pytest.raises(NotImplementedError, match="takes the marker from a holder"):
        SoftFileLock(path, lifetime=5)


def test_holder_exit_is_refused_for_a_soft_lock(path: str) -> None:
    with SoftFileLock(path) as lock, pytest.raises(ValueError, match="named only by its marker"):
        pylock.wait_exit(lock, timeout=0)


def test_async_soft_lock_waits_for_a_release_in_another_task(path: str) -> None:
    async def run() -> list[str]:
        events: list[str] = []
        first, second = AsyncSoftFileLock(path), AsyncSoftFileLock(path)
        await first.acquire()

        async def later() -> None:
            async with second:
                events.append("second")

        task = asyncio.ensure_future(later())
        await asyncio.sleep(0)
        events.append("first releases")
        await first.release()
        await asyncio.wait_for(task, HANG)
        return events

    assert asyncio.run(run()) == ["first releases", "second"]
