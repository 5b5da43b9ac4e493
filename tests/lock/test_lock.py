"""Lock: exclusion across threads and processes, waits in the kernel, reentrancy,
file identity and creation mode.  Real processes, real flock; pipes synchronise."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import pylock
from tests.support import env_with_repo
from tests.support.children import Forked
from tests.support.kernel_locks import (
    blocked_waiters,
    free_from_elsewhere,
    open_fds,
    wait_blocked,
)
from tests.support.procs import wakeups

# -- helpers ---------------------------------------------------------------


def task_states(pid: int) -> dict[int, str]:
    states = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            states[int(tid)] = f.read().rsplit(")", 1)[1].split()[0]
    return states


# -- mutual exclusion --------------------------------------------------------


def test_two_lock_objects_in_one_thread_exclude_each_other(lock_path: str) -> None:
    a, b = pylock.Lock(lock_path), pylock.Lock(lock_path)
    a.acquire()
    with pytest.raises(pylock.LockHeld) as info:
        b.acquire(blocking=False)
    assert info.value.holder is not None and info.value.holder.pid == os.getpid()
    a.release()
    assert b.acquire(blocking=False) is True
    assert b.locked and not a.locked
    b.release()


def test_threads_with_their_own_lock_objects_never_overlap(lock_path: str) -> None:
    threads, rounds = 6, 300
    inside = 0
    overlaps = 0
    counter = 0
    start = threading.Barrier(threads)

    def work() -> None:
        nonlocal inside, overlaps, counter
        lock = pylock.Lock(lock_path)
        start.wait()
        for _ in range(rounds):
            with lock:
                inside += 1
                if inside != 1:
                    overlaps += 1
                seen = counter
                os.sched_yield()
                time.sleep(0)  # let other threads run inside the window
                counter = seen + 1
                inside -= 1
        lock.close()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert overlaps == 0
    assert counter == threads * rounds


def test_threads_sharing_one_lock_object_never_overlap(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    counter = 0
    inside = 0
    overlaps = 0

    def work() -> None:
        nonlocal counter, inside, overlaps
        for _ in range(300):
            with lock:
                inside += 1
                overlaps += inside != 1
                seen = counter
                time.sleep(0)
                counter = seen + 1
                inside -= 1

    pool = [threading.Thread(target=work) for _ in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert overlaps == 0 and counter == 1200


COUNTER_SCRIPT = textwrap.dedent(
    """
    import os, sys, pylock
    lock_path, counter, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    busy = counter + ".inside"
    lock = pylock.Lock(lock_path)
    print("ready", flush=True)
    sys.stdin.readline()
    overlaps = 0
    for _ in range(rounds):
        with lock:
            try:  # exists only while someone is inside: O_EXCL fails on overlap
                os.close(os.open(busy, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                overlaps += 1
            with open(counter, "r+") as f:
                value = int(f.read() or 0)
                os.sched_yield()
                f.seek(0)
                f.write(str(value + 1))
                f.truncate()
            os.unlink(busy)
    print("overlaps", overlaps, flush=True)
    """
)


def test_processes_incrementing_a_counter_lose_no_update(tmp_path: Path, lock_path: str) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs, rounds = 6, 150
    children = [
        subprocess.Popen(
            [sys.executable, "-c", COUNTER_SCRIPT, lock_path, str(counter), str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env_with_repo(),
        )
        for _ in range(procs)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    for child in children:  # all start together
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    reports = [child.stdout.read() for child in children]  # type: ignore[union-attr]
    assert [child.wait(timeout=60) for child in children] == [0] * procs
    assert reports == ["overlaps 0\n"] * procs
    assert int(counter.read_text()) == procs * rounds


def test_shared_locks_coexist_and_exclude_an_exclusive_one(lock_path: str) -> None:
    r1, r2 = pylock.Lock(lock_path, shared=True), pylock.Lock(lock_path, shared=True)
    r1.acquire(blocking=False)
    r2.acquire(blocking=False)
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(lock_path).acquire(blocking=False)
    r1.release()
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(lock_path).acquire(blocking=False)
    r2.release()
    w = pylock.Lock(lock_path)
    w.acquire(blocking=False)
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(lock_path, shared=True).acquire(blocking=False)
    w.release()


# -- waiting in the kernel -------------------------------------------------


def test_sigkill_of_holder_wakes_a_blocked_thread_at_once(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    lock = pylock.Lock(lock_path)
    got: dict[str, object] = {}

    def wait() -> None:
        got["tid"] = threading.get_native_id()
        try:
            lock.acquire()
            got["at"] = time.monotonic()
        except BaseException as exc:  # surfaced by the assertions below
            got["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_blocked(lock_path, os.getpid())
    # The waiting thread sleeps in the kernel's flock wait, not in a retry loop.
    # /proc/locks lists it as soon as it queues, a moment before it is off
    # the CPU (wchan "0" then): read again until it has gone to sleep.
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/self/task/{got['tid']}/wchan") as f:
            wchan = f.read()
        if wchan != "0" or time.monotonic() > deadline:
            break
        os.sched_yield()
    assert "lock" in wchan, wchan
    assert task_states(os.getpid())[got["tid"]] == "S"  # type: ignore[index]

    killed_at = time.monotonic()
    holder.proc.send_signal(signal.SIGKILL)
    waiter.join(10)
    assert not waiter.is_alive() and "error" not in got, got
    assert lock.locked
    latency = got["at"] - killed_at  # type: ignore[operator]
    # Measured ~1 ms here; a retry loop would show its period.  Timing goals live in bench/.
    assert latency < 1.0, f"waiter took {latency:.3f} s after the holder's SIGKILL"
    assert lock.holder() is not None and lock.holder().pid == os.getpid()  # type: ignore[union-attr]
    lock.release()


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_sigkill_of_holder_wakes_a_blocked_process(
    lock_path: str, spawn_holder, forked, timeout: float | None
) -> None:
    holder = spawn_holder(lock_path)

    def wait(chan: Forked.Chan) -> None:
        lock = pylock.Lock(lock_path)
        chan.say("waiting")
        lock.acquire(timeout=timeout)
        chan.say(f"acquired {time.monotonic()!r}")
        chan.hear()

    child = forked(wait)
    assert child.line() == "waiting"
    wait_blocked(lock_path, child.pid)
    assert set(task_states(child.pid).values()) == {"S"}
    before = wakeups(child.pid)
    time.sleep(0.3)  # an interval to watch, not a synchronisation
    assert wakeups(child.pid) == before, "a blocked waiter woke up while the lock stayed held"
    killed_at = time.monotonic()
    holder.proc.send_signal(signal.SIGKILL)
    word, at = child.line().split()
    assert word == "acquired"
    assert float(at) - killed_at < 1.0
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == child.pid and found.verified
    child.tell("done")
    assert child.wait() == 0


def test_release_wakes_a_blocked_waiter(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    lock = pylock.Lock(lock_path)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (lock.acquire(), done.set()))
    waiter.start()
    wait_blocked(lock_path, os.getpid())
    assert not done.is_set()
    holder.release()
    assert done.wait(10)
    waiter.join()
    assert lock.locked
    lock.release()


def test_timed_out_wait_raises_and_never_acquires_afterwards(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    lock = pylock.Lock(lock_path)
    threads_before = threading.active_count()
    t0 = time.monotonic()
    with pytest.raises(pylock.LockTimeout) as info:
        lock.acquire(timeout=0.2)
    waited = time.monotonic() - t0
    assert 0.2 <= waited < 5
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, pylock.LockHeld)
    assert info.value.holder is not None and info.value.holder.pid == holder.pid
    assert not lock.locked
    assert blocked_waiters(lock_path) == []  # no wait left in the kernel
    holder.release()
    assert free_from_elsewhere(lock_path)
    assert not lock.locked
    assert threading.active_count() == threads_before


def test_many_timed_out_waits_leave_no_descriptor_or_thread(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    gc.collect()  # earlier tests' garbage must not close descriptors mid-count
    fds, threads = open_fds(), threading.active_count()
    lock = pylock.Lock(lock_path)
    for _ in range(200):
        with pytest.raises(pylock.LockTimeout):
            lock.acquire(timeout=0.001)
    lock.close()
    assert open_fds() - fds == set()
    assert threading.active_count() == threads
    holder.release()
    assert free_from_elsewhere(lock_path)


def test_nonblocking_fails_at_once(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert not isinstance(info.value, pylock.LockTimeout)
    assert info.value.path == lock_path
    assert info.value.holder is not None and info.value.holder.pid == holder.pid
    with pytest.raises(ValueError):
        pylock.Lock(lock_path).acquire(blocking=False, timeout=1)


def test_another_thread_of_this_process_waits_rather_than_refusing(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    outcome: list[BaseException] = []

    def other() -> None:
        try:
            pylock.Lock(lock_path).acquire(timeout=0.1)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(outcome) == 1 and type(outcome[0]) is pylock.LockTimeout
    lock.release()


# -- reentrancy --------------------------------------------------------------


def test_reacquiring_the_same_object_from_the_holding_thread_raises(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    for kwargs in ({}, {"blocking": False}, {"timeout": 30}):
        t0 = time.monotonic()
        with pytest.raises(pylock.ReentrantAcquire) as info:
            lock.acquire(**kwargs)  # type: ignore[arg-type]
        assert time.monotonic() - t0 < 5
        assert isinstance(info.value, pylock.LockError)
        assert lock_path in str(info.value) and "reentrant" in str(info.value)
    assert lock.locked
    lock.release()
    assert free_from_elsewhere(lock_path)


REENTRANT_SCRIPT = textwrap.dedent(
    """
    import sys, pylock
    first = pylock.Lock(sys.argv[1])
    second = pylock.Lock(sys.argv[2])
    first.acquire()
    try:
        second.acquire()  # no timeout: a deadlock would hang here
    except pylock.ReentrantAcquire as exc:
        print("ReentrantAcquire", exc)
    """
)


@pytest.mark.parametrize("spelling", ["same", "symlinked-dir", "hardlink"])
def test_reacquiring_through_another_object_raises_instead_of_deadlocking(
    tmp_path: Path, spelling: str
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    first = real / "x.lock"
    first.touch()
    if spelling == "same":
        second = first
    elif spelling == "symlinked-dir":
        (tmp_path / "link").symlink_to(real)
        second = tmp_path / "link" / "x.lock"
    else:
        second = real / "y.lock"
        os.link(first, second)
    out = subprocess.run(
        [sys.executable, "-c", REENTRANT_SCRIPT, str(first), str(second)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env_with_repo(),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ReentrantAcquire "), out.stdout
    assert "deadlock" in out.stdout


# -- identity, paths, modes ----------------------------------------------------


def test_identity_is_the_inode_not_the_spelling(tmp_path: Path, forked) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    via_link = str(tmp_path / "link" / "x.lock")
    via_real = str(real / "x.lock")
    a = pylock.Lock(via_link)
    a.acquire()
    assert os.path.exists(via_real)
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(via_real).acquire(blocking=False)

    def other(chan: Forked.Chan) -> None:
        try:
            pylock.Lock(via_real).acquire(blocking=False)
            chan.say("acquired")
        except pylock.LockHeld as exc:
            chan.say(f"held {exc.holder.pid if exc.holder else 0}")

    child = forked(other)
    assert child.line() == f"held {os.getpid()}"
    assert child.wait() == 0
    a.release()
    b = pylock.Lock(via_real)
    b.acquire(blocking=False)
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(via_link).acquire(blocking=False)
    b.release()


def test_relative_path_is_resolved_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    elsewhere = tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(here)
    lock = pylock.Lock("rel.lock")
    assert lock.path == str(here / "rel.lock")
    assert os.path.isabs(lock.path)
    monkeypatch.chdir(elsewhere)
    with lock:
        assert (here / "rel.lock").exists()
        assert not (elsewhere / "rel.lock").exists()
        with pytest.raises(pylock.LockHeld):
            pylock.Lock(here / "rel.lock").acquire(blocking=False)


def _umask_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_default_mode_is_0644_minus_umask_and_umask_untouched(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        path = tmp_path / f"u{umask:o}.lock"
        lock = pylock.Lock(path)
        lock.acquire()
        assert _umask_now() == umask
        lock.release()
        lock.close()
        assert _umask_now() == umask
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o7777 == 0o644 & ~umask


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o666])
def test_explicit_mode_is_exact_whatever_the_umask(tmp_path: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        path = tmp_path / f"m{mode:o}.lock"
        with pylock.Lock(path, mode=mode):
            assert _umask_now() == 0o077
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o7777 == mode


def test_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "existing.lock"
    path.touch()
    os.chmod(path, 0o600)
    with pylock.Lock(path, mode=0o666):
        pass
    assert os.stat(path).st_mode & 0o7777 == 0o600


def test_bad_mode_and_unserialisable_info_are_refused_at_construction(lock_path: str) -> None:
    ignored: list[object] = []
    previous = sys.unraisablehook
    sys.unraisablehook = ignored.append
    try:
        with pytest.raises(ValueError):
            pylock.Lock(lock_path, mode=0o10000)
        with pytest.raises(TypeError):
            pylock.Lock(lock_path, info={"x": object()})
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert not os.path.exists(lock_path)
    # A refused construction must not leave an object whose __del__ then fails.
    assert [repr(u.exc_value) for u in ignored] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "info", [{1: 2}, {"a": {None: 1}}, {"a": [{"b": {2.5: 1}}]}, {"a": ({True: 1},)}]
)
def test_info_with_a_key_json_would_rewrite_is_refused_naming_it(lock_path: str, info) -> None:
    # json.dumps writes {1: 2} as {"1": 2}: the holder's info would differ from the one given.
    with pytest.raises(TypeError, match="info keys must be strings"):
        pylock.Lock(lock_path, info=info)
    assert not os.path.exists(lock_path)


def test_info_that_is_not_json_is_refused_naming_info(lock_path: str) -> None:
    with pytest.raises(TypeError, match=r"info must be JSON-able.*set"):
        pylock.Lock(lock_path, info={"x": {1, 2}})
    with pytest.raises(ValueError, match=r"info must be JSON.*float"):
        pylock.Lock(lock_path, info={"x": math.nan})
    # Tuples are JSON arrays, as for json.dumps: kept.
    with pylock.Lock(lock_path, info={"x": (1, 2)}) as lock:
        holder = lock.holder()
    assert holder is not None and holder.info == {"x": [1, 2]}


@pytest.mark.parametrize("timeout", [True, False])
def test_a_bool_timeout_is_refused_and_nothing_is_held(lock_path: str, timeout: bool) -> None:
    lock = pylock.Lock(lock_path)
    with pytest.raises(TypeError, match="timeout must be None or a number of seconds, not bool"):
        lock.acquire(timeout=timeout)
    assert not lock.locked and not os.path.exists(lock_path)  # refused before any open
    with pytest.raises(TypeError, match="not bool"):
        asyncio.run(lock.acquire_async(timeout=timeout))
    assert not lock.locked
    with pytest.raises(TypeError, match="not bool"):
        pylock.wait_exit(os.getppid(), timeout=timeout)
    lock.close()


def test_descriptor_is_close_on_exec(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    ours = [
        int(fd)
        for fd in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{fd}") == lock_path
    ]
    assert ours
    for fd in ours:
        assert not os.get_inheritable(fd)
        assert int(_fdinfo_flags(fd), 8) & os.O_CLOEXEC
    lock.release()


def _fdinfo_flags(fd: int) -> str:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("flags:"):
                return line.split()[1]
    raise AssertionError("no flags line")


# -- the object's own state ------------------------------------------------


def test_locked_context_manager_release_and_close(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    assert not lock.locked
    with lock as same:
        assert same is lock and lock.locked
        assert not free_from_elsewhere(lock_path)
    assert not lock.locked
    assert free_from_elsewhere(lock_path)
    with pytest.raises(pylock.NotHeld):
        lock.release()
    lock.acquire()
    lock.close()
    assert not lock.locked
    assert free_from_elsewhere(lock_path)
    assert os.path.exists(lock_path)  # release never unlinks by default
    assert "unlocked" in repr(lock) and lock_path in repr(lock)


def test_fileno_names_the_lock_files_descriptor_while_it_is_open(lock_path: str, forked) -> None:
    """fileno() is the descriptor the Lock keeps open on its file between
    acquisitions, -1 before the first, after close() and in a forked child;
    file_key(lock) is that file's (device, inode)."""
    from pylock._lock.lockfile import file_key

    lock = pylock.Lock(lock_path)
    assert lock.fileno() == -1 and file_key(lock) == (0, 0)
    lock.acquire()
    fd = lock.fileno()
    st = os.stat(lock_path)
    assert os.readlink(f"/proc/self/fd/{fd}") == lock_path
    assert file_key(lock) == (st.st_dev, st.st_ino)
    lock.release()
    assert lock.fileno() == fd  # kept open for the next acquisition
    lock.acquire()

    def in_child(chan) -> None:
        chan.say(f"fileno {lock.fileno()}")

    child = forked(in_child)
    assert child.line() == "fileno -1"
    assert child.wait() == 0
    assert lock.fileno() == fd
    lock.close()
    assert lock.fileno() == -1
    assert file_key(lock) == (st.st_dev, st.st_ino)  # the file it last had open


def test_context_manager_releases_on_exception(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    with pytest.raises(KeyError), lock:
        raise KeyError("boom")
    assert not lock.locked and free_from_elsewhere(lock_path)


def test_dropping_a_held_lock_object_releases_the_kernel_lock(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    assert not free_from_elsewhere(lock_path)
    del lock
    if sys.implementation.name != "cpython":
        gc.collect()  # no reference counting: released once collected (README, Known limits)
    assert free_from_elsewhere(lock_path)


def test_info_travels_in_the_record(lock_path: str) -> None:
    with pylock.Lock(lock_path, info={"port": 8080, "proto": [1, 2]}) as lock:
        found = lock.holder()
        assert found is not None and found.info == {"port": 8080, "proto": [1, 2]}


# -- signals during a wait ----------------------------------------------------------


def _signalled_waiter(lock_path: str, timeout: float | None) -> Callable[[Forked.Chan], None]:
    def child(chan: Forked.Chan) -> None:
        handled: list[int] = []
        signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        lock = pylock.Lock(lock_path)
        chan.say("waiting")
        t0 = time.monotonic()
        try:
            lock.acquire(timeout=timeout)
            chan.say(f"acquired {len(handled)}")
        except KeyboardInterrupt:
            chan.say(f"interrupted {lock.locked}")
        except pylock.LockTimeout:
            chan.say(f"timeout {len(handled)} {time.monotonic() - t0:.3f}")
        chan.hear()

    return child


def test_ctrl_c_interrupts_a_blocked_acquire(lock_path: str, spawn_holder, forked) -> None:
    holder = spawn_holder(lock_path)
    child = forked(_signalled_waiter(lock_path, None))
    assert child.line() == "waiting"
    wait_blocked(lock_path, child.pid)
    os.kill(child.pid, signal.SIGINT)
    assert child.line() == "interrupted False"
    assert blocked_waiters(lock_path) == []
    holder.release()
    assert free_from_elsewhere(lock_path)  # the interrupted wait took nothing later
    child.tell("done")
    assert child.wait() == 0


def test_other_signals_do_not_end_the_wait(lock_path: str, spawn_holder, forked) -> None:
    holder = spawn_holder(lock_path)
    child = forked(_signalled_waiter(lock_path, None))
    assert child.line() == "waiting"
    wait_blocked(lock_path, child.pid)
    os.kill(child.pid, signal.SIGUSR1)
    os.kill(child.pid, signal.SIGUSR1)
    wait_blocked(lock_path, child.pid)
    holder.release()
    assert child.line() in ("acquired 1", "acquired 2")  # signals may coalesce
    child.tell("done")
    assert child.wait() == 0


def test_signals_do_not_extend_a_timed_wait(lock_path: str, spawn_holder, forked) -> None:
    spawn_holder(lock_path)
    child = forked(_signalled_waiter(lock_path, 0.5))
    assert child.line() == "waiting"
    wait_blocked(lock_path, child.pid)
    os.kill(child.pid, signal.SIGUSR1)
    word, handled, waited = child.line().split()
    assert word == "timeout" and handled == "1"
    assert 0.5 <= float(waited) < 1.5, waited
    child.tell("done")
    assert child.wait() == 0


def test_oversized_info_is_refused_without_leaking(lock_path: str) -> None:
    """info the record cannot carry: refused, with no descriptor left behind."""
    gc.collect()
    before = open_fds()
    with pytest.raises(ValueError):
        lock = pylock.Lock(lock_path, info={"big": "x" * 20000})
        for _ in range(3):
            with pytest.raises(ValueError):
                lock.acquire()
        raise ValueError("refused only when acquiring")
    assert open_fds() - before == set()


def test_upgrading_shared_to_exclusive_in_one_thread_raises(lock_path: str) -> None:
    reader = pylock.Lock(lock_path, shared=True)
    reader.acquire()
    t0 = time.monotonic()
    with pytest.raises(pylock.ReentrantAcquire):
        pylock.Lock(lock_path).acquire(timeout=30)
    assert time.monotonic() - t0 < 5
    second_reader = pylock.Lock(lock_path, shared=True)
    second_reader.acquire(blocking=False)  # shared with itself is no deadlock
    second_reader.release()
    reader.release()
