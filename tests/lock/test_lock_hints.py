"""Thousands of waiting tasks without a thread each (pylock._core.hints):
every holder's release still reaches its waiters, and when inotify drops
events or runs out of watches, nobody is left waiting."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import pylock
from tests.support import env_with_repo
from tests.support.kernel_locks import blocked_waiters, free_now, hint_watches, lock_key
from tests.support.procs import thread_count

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="release hints are inotify's (Linux)"
)

# Holds every path given, writes "held", then on each line of stdin: "release"
# releases them all (pylock's release: the descriptors stay open), anything
# else is ignored; it is killed by the test.
PYLOCK_HOLDER = textwrap.dedent(
    """
    import sys, pylock
    locks = [pylock.Lock(p) for p in sys.argv[1:]]
    for lock in locks:
        lock.acquire()
    print("held", flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            for lock in locks:
                lock.release()
            print("released", flush=True)
    """
)

# A foreign holder: plain flock(2), unlocked with LOCK_UN on "unlock" while
# its descriptor stays open (the one release that makes no inotify event).
FOREIGN_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    os.write(fd, b"not a pylock record")
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    for line in sys.stdin:
        if line.strip() == "unlock":
            fcntl.flock(fd, fcntl.LOCK_UN)
            print("unlocked", flush=True)
    """
)


def start(script: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def tell(proc: subprocess.Popen[str], line: str, answer: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == answer + "\n"


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def raise_nofile(need: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard < need:
            pytest.skip(f"needs {need} descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def until(condition, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.001)  # re-reading kernel state, not standing in for a signal


def test_two_thousand_waiters_all_acquire_after_their_holder_is_killed(tmp_path: Path) -> None:
    n = 2000
    raise_nofile(2 * n + 200)
    paths = [str(tmp_path / f"{i}.lock") for i in range(n)]
    holder = start(PYLOCK_HOLDER, *paths)
    try:
        baseline = thread_count()

        async def main() -> None:
            locks = [pylock.Lock(p) for p in paths]
            tasks = [asyncio.ensure_future(lock.acquire_async()) for lock in locks]
            # Every task waits: its file is watched (one watch per file).
            await until(lambda: hint_watches(paths[-1], os.getpid()) == 1, "the last never waited")
            await asyncio.sleep(0)
            assert not any(t.done() for t in tasks)
            assert thread_count() <= baseline + 2, "a thread per waiting task"
            holder.kill()
            done = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            assert done == [True] * n and all(lock.locked for lock in locks)
            assert thread_count() <= baseline + 2
            for lock in locks:
                lock.close()

        asyncio.run(main())
    finally:
        stop(holder)


def test_a_pylock_release_wakes_its_waiter_without_a_thread(lock_path: str) -> None:
    holder = start(PYLOCK_HOLDER, lock_path)
    try:

        async def main() -> None:
            baseline = threading.active_count()
            lock = pylock.Lock(lock_path)
            task = asyncio.ensure_future(lock.acquire_async())
            await until(lambda: hint_watches(lock_path, os.getpid()) == 1, "never waited")
            for _ in range(20):  # it stays waiting on the hint, in no thread
                await asyncio.sleep(0)
            assert not task.done() and threading.active_count() == baseline
            tell(holder, "release", "released")  # the holder keeps its descriptor open
            assert await asyncio.wait_for(task, 30) is True
            assert hint_watches(lock_path, os.getpid()) == 0  # nothing left watching
            lock.close()

        asyncio.run(main())
    finally:
        stop(holder)


def test_a_foreign_lock_un_without_close_still_wakes_its_waiter(lock_path: str) -> None:
    holder = start(FOREIGN_HOLDER, lock_path)
    try:

        async def main() -> None:
            lock = pylock.Lock(lock_path)
            task = asyncio.ensure_future(lock.acquire_async())
            for _ in range(50):
                await asyncio.sleep(0.001)  # let it find the holder foreign
            assert not task.done()
            tell(holder, "unlock", "unlocked")  # no close, no event for inotify
            assert await asyncio.wait_for(task, 30) is True
            assert holder.poll() is None  # still running, its descriptor open
            lock.close()

        asyncio.run(main())
    finally:
        stop(holder)


def test_a_stale_record_of_a_live_pylock_process_does_not_hide_a_foreign_holder(
    lock_path: str,
) -> None:
    # A pylock process held the file and released it, leaving its record;
    # a foreign process holds it now and will unlock without closing.
    pylock_holder = start(PYLOCK_HOLDER, lock_path)
    tell(pylock_holder, "release", "released")
    script = FOREIGN_HOLDER.replace('os.write(fd, b"not a pylock record")\n', "")
    foreign = start(script, lock_path)
    try:

        async def main() -> None:
            lock = pylock.Lock(lock_path)
            task = asyncio.ensure_future(lock.acquire_async())
            for _ in range(50):
                await asyncio.sleep(0.001)
            assert not task.done()
            tell(foreign, "unlock", "unlocked")
            assert await asyncio.wait_for(task, 30) is True
            lock.close()

        asyncio.run(main())
    finally:
        stop(foreign)
        stop(pylock_holder)


def test_an_inotify_queue_overflow_wakes_every_waiter(tmp_path: Path) -> None:
    """The kernel drops hints past fs.inotify.max_queued_events and says so
    (IN_Q_OVERFLOW): every waiter tries again."""
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    waited = [str(tmp_path / f"w{i}.lock") for i in range(20)]
    noisy = [str(tmp_path / f"noise{i}.lock") for i in range(2)]
    holder = start(PYLOCK_HOLDER, *waited)
    noise_holder = start(PYLOCK_HOLDER, *noisy)
    # Reads alternating between the two noisy files: consecutive equal events
    # would be merged into one, these are not.
    flood = textwrap.dedent(
        f"""
        import os, sys
        fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
        for i in range({2 * queued}):
            os.pread(fds[i % 2], 1, 0)
        """
    )
    try:

        async def main() -> None:
            locks = [pylock.Lock(p) for p in waited + noisy]
            tasks = [asyncio.ensure_future(lock.acquire_async()) for lock in locks]
            await until(
                lambda: all(hint_watches(p, os.getpid()) == 1 for p in waited + noisy),
                "not every task waited",
            )
            for _ in range(20):
                await asyncio.sleep(0)
            # The loop does not read its hints until this returns: the queue
            # fills with the noise, then overflows, then loses the releases.
            subprocess.run([sys.executable, "-c", flood, *noisy], check=True)
            tell(holder, "release", "released")
            done = await asyncio.wait_for(asyncio.gather(*tasks[: len(waited)]), 30)
            assert done == [True] * len(waited)
            assert not any(t.done() for t in tasks[len(waited) :])  # still held
            noise_holder.kill()
            await asyncio.wait_for(asyncio.gather(*tasks[len(waited) :]), 30)
            for lock in locks:
                lock.close()

        asyncio.run(main())
    finally:
        stop(noise_holder)
        stop(holder)


LIMITED = textwrap.dedent(
    """
    import asyncio, sys, pylock
    paths = sys.argv[1:]

    async def main():
        locks = [pylock.Lock(p) for p in paths]
        tasks = [asyncio.ensure_future(lock.acquire_async()) for lock in locks]
        for _ in range(100):
            await asyncio.sleep(0.001)
        assert not any(t.done() for t in tasks)
        print("waiting", flush=True)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        print("all", sum(lock.locked for lock in locks), flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
@pytest.mark.parametrize(
    "limit", ["max_inotify_watches=3", "max_inotify_instances=0"], ids=["watches", "instances"]
)
def test_waiters_past_the_inotify_limits_wait_in_threads(tmp_path: Path, limit: str) -> None:
    """Run out of watches (ENOSPC) or instances (EMFILE), as a user namespace
    limits them: the waits that get none take a thread, and all acquire."""
    paths = [str(tmp_path / f"{i}.lock") for i in range(8)]
    holder = start(PYLOCK_HOLDER, *paths)
    name, value = limit.split("=")
    probe = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        stop(holder)
        pytest.skip(f"no user namespaces here: {probe.stderr.strip()}")
    waiter = subprocess.Popen(
        [
            "unshare",
            "-Ur",
            "sh",
            "-c",
            f'echo {value} > /proc/sys/user/{name} && c="$1" && shift && exec "$0" -c "$c" "$@"',
            sys.executable,
            LIMITED,
            *paths,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    try:
        assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
        holder.send_signal(signal.SIGKILL)
        assert waiter.stdout.readline() == f"all {len(paths)}\n"
        assert waiter.wait(30) == 0
    finally:
        waiter.kill()
        waiter.wait()
        if waiter.stdout is not None:
            waiter.stdout.close()
        stop(holder)
    assert all(free_now(p) for p in paths)


def test_many_tasks_of_one_process_on_one_file_all_acquire(lock_path: str) -> None:
    """64 tasks of this process, each with its own Lock on one file held by
    another pylock process (each sees another Lock of this process under way
    on the file, so they wait in threads): every one gets the lock."""
    holder = start(PYLOCK_HOLDER, lock_path)
    try:

        async def main() -> None:
            locks = [pylock.Lock(lock_path) for _ in range(64)]
            order: list[int] = []

            async def take(i: int) -> None:
                await locks[i].acquire_async()
                order.append(i)
                await asyncio.sleep(0)
                locks[i].release()

            tasks = [asyncio.ensure_future(take(i)) for i in range(64)]
            await until(lambda: len(blocked_waiters(lock_path)) == 64, "not all waited")
            tell(holder, "release", "released")
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert sorted(order) == list(range(64))
            for lock in locks:
                lock.close()

        asyncio.run(main())
    finally:
        stop(holder)


def inotify_descriptors() -> int:
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return found


def test_a_loop_closed_with_a_task_waiting_on_hints_leaks_no_descriptor(tmp_path: Path) -> None:
    first, second = str(tmp_path / "first.lock"), str(tmp_path / "second.lock")
    holder = start(PYLOCK_HOLDER, first, second)
    try:
        before = inotify_descriptors()
        loop = asyncio.new_event_loop()
        lock = pylock.Lock(first)
        task = loop.create_task(lock.acquire_async())
        while not hint_watches(first, os.getpid()):
            loop.run_until_complete(asyncio.sleep(0.001))
        loop.close()  # the task never ends: its loop is gone
        assert inotify_descriptors() == before + 1

        async def another_wait() -> None:
            other = pylock.Lock(second)
            waiting = asyncio.ensure_future(other.acquire_async())
            await until(lambda: hint_watches(second, os.getpid()) == 1, "never waited")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            other.close()

        asyncio.run(another_wait())  # the next loop's first wait closes the dead loop's
        assert inotify_descriptors() == before
        assert not task.done() and not lock.locked
    finally:
        stop(holder)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_timed_wait_on_hints_ends_at_its_deadline(lock_path: str, loop: str) -> None:
    """uvloop's timers may fire a little before the deadline by the monotonic
    clock: the wait still ends then, never waits on for the next hint."""
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
    holder = start(PYLOCK_HOLDER, lock_path)
    try:

        async def main() -> None:
            lock = pylock.Lock(lock_path)
            for _ in range(8):
                with pytest.raises(pylock.LockTimeout):
                    await asyncio.wait_for(lock.acquire_async(timeout=0.05), 10)
            assert not lock.locked
            lock.close()

        if loop == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())
    finally:
        stop(holder)


def in_flock(path: str, pid: int) -> bool:
    """Whether /proc/locks shows pid blocked in flock on path (not watching)."""
    key = lock_key(path)
    with open("/proc/locks") as f:
        return any(key in line and " -> " in line and f" {pid} " in line for line in f)


def test_a_reader_that_floods_hints_sends_the_wait_to_a_thread(lock_path: str) -> None:
    """Anyone who may read the lock file makes hints; past a bound of hints
    after which the lock was still held, the wait goes to a thread, which
    only the release wakes."""
    holder = start(PYLOCK_HOLDER, lock_path)
    flood = textwrap.dedent(
        """
        import os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        while True:
            os.pread(fd, 1, 0)
        """
    )
    reader = None
    try:

        async def main() -> None:
            nonlocal reader
            lock = pylock.Lock(lock_path)
            task = asyncio.ensure_future(lock.acquire_async())
            await until(lambda: hint_watches(lock_path, os.getpid()) == 1, "never waited")
            reader = subprocess.Popen([sys.executable, "-c", flood, lock_path])
            await until(lambda: in_flock(lock_path, os.getpid()), "the flood kept it on hints")
            reader.kill()
            assert not task.done()
            tell(holder, "release", "released")
            assert await asyncio.wait_for(task, 30) is True
            lock.close()

        asyncio.run(main())
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
        stop(holder)
