"""pylock.filelock's FileLock: filelock's semantics (reentrancy counters,
thread_local, timeouts, blocking, mode, is_singleton) on pylock's lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pylock
from pylock.filelock import FileLock, Timeout
from tests.support import env_with_repo
from tests.support.kernel_locks import wait_until_waiting

# A bound that only a hang reaches: the outcomes below never wait for it.
HANG = 60.0


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "front.lock")


def free_elsewhere(path: str) -> bool:
    """Whether another Lock object of this process (so another descriptor)
    could take the lock now: the kernel's answer, not the front's count."""
    probe = pylock.Lock(path)
    try:
        probe.acquire(blocking=False)
    except pylock.LockHeld:
        return False
    probe.release()
    return True


def in_thread(fn: object) -> list[object]:
    """Run fn in a thread to its end; its result or exception."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())  # type: ignore[operator]
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the call hung"
    return outcome


def test_the_lock_is_held_until_the_last_of_nested_acquisitions_is_released(path: str) -> None:
    lock = FileLock(path)
    lock.acquire()
    lock.acquire()
    with lock:
        assert lock.lock_counter == 3
    lock.release()
    assert (lock.lock_counter, lock.is_locked, free_elsewhere(path)) == (1, True, False)
    lock.release()
    assert (lock.lock_counter, lock.is_locked, free_elsewhere(path)) == (0, False, True)


def test_force_release_gives_the_lock_back_whatever_the_count(path: str) -> None:
    lock = FileLock(path)
    for _ in range(3):
        lock.acquire()
    lock.release(force=True)
    assert (lock.lock_counter, free_elsewhere(path)) == (0, True)


def test_the_count_is_per_thread_by_default(path: str) -> None:
    lock = FileLock(path)
    lock.acquire()
    seen = in_thread(lambda: (lock.is_locked, lock.lock_counter))
    assert seen == [(False, 0)]
    # Another thread of the same object is excluded like another process.
    (raised,) = in_thread(lambda: lock.acquire(timeout=0))
    assert isinstance(raised, Timeout)
    assert lock.lock_counter == 1
    lock.release()


def test_thread_local_false_shares_the_count_between_threads(path: str) -> None:
    lock = FileLock(path, thread_local=False)
    for _ in range(2):
        (outcome,) = in_thread(lambda: lock.acquire(timeout=0))
        assert not isinstance(outcome, BaseException), outcome
    assert (lock.lock_counter, lock.is_locked, free_elsewhere(path)) == (2, True, False)
    lock.release(force=True)  # from a thread that never acquired it
    assert (lock.lock_counter, free_elsewhere(path)) == (0, True)


def test_timeout_names_the_holder(path: str, spawn_holder: type) -> None:
    holder = spawn_holder(path)
    lock = FileLock(path, timeout=0.05)
    with pytest.raises(Timeout) as raised:
        lock.acquire()
    error = raised.value
    assert isinstance(error, pylock.LockHeld) and isinstance(error, TimeoutError)
    assert error.lock_file == path
    assert error.holder is not None and error.holder.pid == holder.pid
    assert str(error).startswith(f"The file lock '{path}' could not be acquired.")
    assert f"held by pid {holder.pid} (" in str(error)


@pytest.mark.parametrize("where", ["argument", "constructor"])
def test_blocking_false_wins_over_a_timeout(path: str, spawn_holder: type, where: str) -> None:
    spawn_holder(path)
    if where == "argument":
        lock = FileLock(path)
        attempt = lambda: lock.acquire(blocking=False, timeout=3600)  # noqa: E731
    else:
        lock = FileLock(path, blocking=False, timeout=3600)
        attempt = lock.acquire
    (raised,) = in_thread(attempt)
    assert isinstance(raised, Timeout), raised


@pytest.mark.parametrize("forever", [-1, -5, float("inf")])
def test_a_negative_or_infinite_timeout_waits_for_the_release(
    path: str, spawn_holder: type, forever: float
) -> None:
    holder = spawn_holder(path)
    lock = FileLock(path, timeout=forever, thread_local=False)
    outcome: list[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(lock.acquire()))
    waiter.start()
    wait_until_waiting(path, waiter.is_alive)
    holder.release()
    waiter.join(HANG)
    assert not waiter.is_alive() and len(outcome) == 1
    assert (lock.is_locked, free_elsewhere(path)) == (True, False)
    lock.release(force=True)


def test_cancel_check_ends_a_wait_with_timeout(path: str, spawn_holder: type) -> None:
    spawn_holder(path)
    asked: list[int] = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) >= 3

    (raised,) = in_thread(lambda: FileLock(path).acquire(poll_interval=0.001, cancel_check=cancel))
    assert isinstance(raised, Timeout) and len(asked) == 3


def _created_mode(tmp_path: Path, umask: int, mode: str) -> int:
    """The mode of a lock file a fresh process creates under umask."""
    target = tmp_path / f"mode-{umask:o}-{mode}.lock"
    code = (
        "import os, sys\n"
        f"os.umask({umask:#o})\n"
        "from pylock.filelock import FileLock\n"
        f"lock = FileLock(sys.argv[1]{'' if mode == 'default' else ', mode=' + mode})\n"
        "lock.acquire(); lock.release()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(target)], env=env_with_repo(), check=True)
    return target.stat().st_mode & 0o777


def test_mode_is_filelocks_0o666_less_the_umask_or_exactly_the_mode_given(tmp_path: Path) -> None:
    assert _created_mode(tmp_path, 0o002, "default") == 0o664
    assert _created_mode(tmp_path, 0o022, "default") == 0o644
    assert _created_mode(tmp_path, 0o077, "0o660") == 0o660
    assert FileLock(tmp_path / "x").mode == 0o644  # filelock reports 0o644 without a mode
    assert FileLock(tmp_path / "x", mode=0o600).mode == 0o600


def test_missing_directories_are_made(tmp_path: Path) -> None:
    with FileLock(tmp_path / "a" / "b" / "c.lock") as lock:
        assert lock.is_locked and (tmp_path / "a" / "b" / "c.lock").is_file()


def test_is_singleton_gives_one_object_per_path(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    first = FileLock(tmp_path / "a", is_singleton=True, timeout=5)
    assert FileLock(f"{tmp_path}/sub/../a", is_singleton=True, timeout=5) is first
    assert FileLock(tmp_path / "a", is_singleton=False) is not first
    with pytest.raises(ValueError, match=r"differing arguments[\s\S]*timeout"):
        FileLock(tmp_path / "a", is_singleton=True, timeout=6)
    assert first.is_singleton


def test_a_second_object_in_the_same_thread_without_a_timeout_is_a_deadlock(path: str) -> None:
    deadlock = pytest.raises(RuntimeError, match=f"^Deadlock: {path} is already held")
    with FileLock(path), deadlock:
        FileLock(path).acquire()


def test_a_second_object_in_the_same_thread_with_a_timeout_times_out(path: str) -> None:
    with FileLock(path), pytest.raises(Timeout) as raised:
        FileLock(path).acquire(timeout=0.01)
    assert raised.value.holder is not None and raised.value.holder.pid == os.getpid()


def test_a_same_thread_wait_ends_when_another_thread_releases(path: str) -> None:
    from pylock.filelock._bell import BELL

    shared = FileLock(path, thread_local=False)
    shared.acquire()
    handed_over: list[bool] = []

    def release_once_the_wait_listens() -> None:
        deadline = time.monotonic() + HANG
        while not BELL.listeners and time.monotonic() < deadline:
            time.sleep(0.001)  # observing the waiter, not standing in for a signal
        shared.release()
        # The waiter must take it now, not when its timeout ends (HANG s).
        deadline = time.monotonic() + 20
        while free_elsewhere(path) and time.monotonic() < deadline:
            time.sleep(0.001)  # re-reading kernel state
        handed_over.append(not free_elsewhere(path))

    releaser = threading.Thread(target=release_once_the_wait_listens)
    releaser.start()
    with FileLock(path).acquire(timeout=HANG) as second:
        assert second.is_locked
        releaser.join(HANG)
    assert handed_over == [True], "the waiter slept through the release"


def test_an_object_for_a_directory_fails_at_once_with_isadirectoryerror(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as raised:
        FileLock(tmp_path).acquire(timeout=HANG)
    assert str(tmp_path) in str(raised.value)


def test_a_held_lock_dropped_is_given_back_without_a_warning(path: str) -> None:
    """filelock releases a FileLock collected while held, silently; the front
    does the same (the pylock.Lock beneath it must not warn of a lost hold)."""
    import gc
    import warnings

    lock = FileLock(path)
    lock.acquire()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lock
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert free_elsewhere(path), "the dropped lock was not given back"
