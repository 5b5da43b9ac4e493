"""One process of a benchmark, driven by bench/run.py over stdin/stdout.

    python bench/_worker.py ROLE ARGS...

Every worker first prints ``hello <pid>`` (the pid matters under the seccomp
launcher, which execs) and then answers one line per command.  Timestamps
are CLOCK_MONOTONIC nanoseconds, comparable across processes.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import mmap
import os
import resource
import signal
import struct
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _libs


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def out(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def commands():
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            return
        yield words


def read_record(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def die_with_parent() -> None:
    # A forked lock holder must not outlive the benchmark if it crashes.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def status_field(name: str) -> int:
    """A number of /proc/self/status ("VmRSS" in KiB, "Threads")."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def rss_kib() -> int:
    return status_field("VmRSS")


# -- uncontended ------------------------------------------------------------


def role_uncontended(lib: str, path: str, record_path: str) -> None:
    """``run N``: N acquire+release pairs, each timed; answers a JSON list."""
    acquire, release = _libs.sync_lock(lib, path, read_record(record_path))
    clock, ns = time.clock_gettime_ns, time.CLOCK_MONOTONIC
    out("hello", os.getpid())
    for words in commands():
        n = int(words[1])
        samples = [0] * n
        for i in range(n):
            t0 = clock(ns)
            acquire()
            release()
            samples[i] = clock(ns) - t0
        out(json.dumps(samples))


# -- handoff and takeover ---------------------------------------------------


def role_holder(lib: str, path: str, record_path: str) -> None:
    """The side that releases (handoff) or is killed (takeover).

    ``acquire``: take the lock, answer ``ok``.  ``release``: answer the time
    taken just before calling release.  ``fork``: a forked child takes the
    lock with a fresh lock object and answers ``held <pid>``; the benchmark
    then SIGKILLs it and sends ``reap <pid>``.
    """
    record = read_record(record_path)
    acquire, release = _libs.sync_lock(lib, path, record)
    out("hello", os.getpid())
    for words in commands():
        if words[0] == "acquire":
            acquire()
            out("ok")
        elif words[0] == "release":
            t0 = now()
            release()
            out(t0)
        elif words[0] == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    die_with_parent()
                    child_acquire, _ = _libs.sync_lock(lib, path, record)
                    child_acquire()
                    out("held", os.getpid())
                    while True:
                        signal.pause()
                finally:
                    os._exit(1)
        elif words[0] == "reap":
            os.waitpid(int(words[1]), 0)
            out("ok")
        else:
            raise ValueError(f"holder: unknown command {words!r}")


def role_waiter(lib: str, path: str, record_path: str) -> None:
    """``wait``: answer ``ready``, block in acquire, then answer the time it
    returned (taken before releasing again)."""
    record = read_record(record_path)
    if lib in _libs.ASYNC_LIBS:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        acquire_a, release_a = _libs.async_lock(lib, path, record)

        async def trial() -> int:
            out("ready")
            await acquire_a()
            t1 = now()
            await release_a()
            return t1

        out("hello", os.getpid())
        for _ in commands():
            out(loop.run_until_complete(trial()))
        loop.close()
        return
    acquire, release = _libs.sync_lock(lib, path, record)
    out("hello", os.getpid())
    for _ in commands():
        out("ready")
        acquire()
        t1 = now()
        release()
        out(t1)


# -- death notification -----------------------------------------------------


def raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, hard), max(need, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def role_watcher(lib: str) -> None:
    """``watch PID...``: watch every pid, answer ``watching <rss before KiB>
    <rss after KiB> <n>``; each exit is reported as it happens as ``exit
    <pid> <time>``.  ``add PID...`` is the same without starting to wait
    (it matters only for psutil, whose wait blocks).

    pylock: ``holder_exit`` per pid, awaited.  pylock-many: one
    ``ExitWatcher`` for all, with a callback per exit.  The bare baselines
    match them: pidfd-await awaits a future that a
    ``loop.add_reader(os.pidfd_open(pid))`` callback completes; pidfd calls
    back straight from the reader.
    psutil: ``Process(pid).wait()`` for one pid, ``wait_procs`` for many
    (its own API for watching many), both blocking.
    """
    raise_nofile(40000)
    if lib == "psutil":
        _watch_psutil()
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stdin = sys.stdin.buffer.raw  # type: ignore[attr-defined]
    os.set_blocking(stdin.fileno(), False)
    pending = bytearray()
    stop = loop.create_future()
    keep: list[object] = []

    def on_exit(pid: int) -> None:
        out("exit", pid, now())

    def watch(pids: list[int]) -> None:
        gc.collect()
        before = rss_kib()
        if lib == "pylock":
            import pylock

            async def wait_one(pid: int) -> None:
                await pylock.holder_exit(pid)
                on_exit(pid)

            keep.extend(loop.create_task(wait_one(pid)) for pid in pids)
        elif lib == "pylock-many":
            _watch_pylock_many(loop, pids, on_exit, keep)
        elif lib == "pidfd":
            for pid in pids:
                fd = os.pidfd_open(pid)

                def ready(fd: int = fd, pid: int = pid) -> None:
                    loop.remove_reader(fd)
                    os.close(fd)
                    on_exit(pid)

                loop.add_reader(fd, ready)
        elif lib == "pidfd-await":

            async def await_one(pid: int) -> None:
                fd = os.pidfd_open(pid)
                exited = loop.create_future()
                loop.add_reader(fd, exited.set_result, None)
                try:
                    await exited
                finally:
                    loop.remove_reader(fd)
                    os.close(fd)
                on_exit(pid)

            keep.extend(loop.create_task(await_one(pid)) for pid in pids)
        else:
            raise ValueError(f"watcher: unknown library {lib!r}")
        after_ready.append((before, len(pids)))
        # Let the watches register (tasks run their first step) before
        # answering, so the memory figure and the latency see them in place.
        loop.call_soon(answer_watching)

    after_ready: list[tuple[int, int]] = []

    def watch_lock(path: str, pid: int) -> None:
        # holder_exit(Lock): pylock finds the process holding the lock now.
        import pylock

        lock = pylock.Lock(path)

        async def wait_holder() -> None:
            await pylock.holder_exit(lock)
            on_exit(pid)

        keep.append(loop.create_task(wait_holder()))
        after_ready.append((rss_kib(), 1))
        loop.call_soon(answer_watching)

    def answer_watching() -> None:
        before, n = after_ready.pop()
        gc.collect()
        out("watching", before, rss_kib(), n)

    def on_stdin() -> None:
        try:
            chunk = os.read(stdin.fileno(), 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            stop.set_result(None)
            return
        pending.extend(chunk)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            words = line.decode().split()
            if not words or words[0] == "quit":
                if not stop.done():
                    stop.set_result(None)
                return
            if words[0] in ("watch", "add"):
                watch([int(w) for w in words[1:]])
            elif words[0] == "watchlock":
                watch_lock(words[1], int(words[2]))
            else:
                raise ValueError(f"watcher: unknown command {words!r}")

    loop.add_reader(stdin.fileno(), on_stdin)
    out("hello", os.getpid())
    loop.run_until_complete(stop)
    # Exiting closes every descriptor; the watches need no tidy teardown.
    os._exit(0)


def _watch_pylock_many(
    loop: asyncio.AbstractEventLoop,
    pids: list[int],
    on_exit: Callable[[int], None],
    keep: list[object],
) -> None:
    import pylock

    watcher = pylock.ExitWatcher(on_exit=lambda ended: on_exit(ended.pid))
    for pid in pids:
        watcher.watch(pid)
    keep.append(watcher)


def _watch_psutil() -> None:
    """``add PID...`` only registers (answers like ``watch``); ``watch PID...``
    registers and then blocks waiting for every registered process."""
    import psutil

    out("hello", os.getpid())
    procs: list[psutil.Process] = []
    for words in commands():
        if words[0] not in ("watch", "add"):
            raise ValueError(f"watcher: unknown command {words!r}")
        pids = [int(w) for w in words[1:]]
        gc.collect()
        before = rss_kib()
        procs.extend(psutil.Process(pid) for pid in pids)
        gc.collect()
        out("watching", before, rss_kib(), len(pids))
        if words[0] == "add":
            continue
        if len(procs) == 1:
            procs[0].wait()
            out("exit", procs[0].pid, now())
        else:
            psutil.wait_procs(procs, callback=lambda p: out("exit", p.pid, now()))
        procs = []


# -- contention -------------------------------------------------------------


def role_contend(lib: str, path: str, record_path: str, shm_path: str, tasks: str) -> None:
    """Hammer one lock until a deadline; count critical sections.

    The critical section increments a counter in shared memory without any
    atomic instruction and checks an "inside" flag, so a lock that fails to
    exclude shows up as lost increments and overlaps.  ``tasks`` > 0 runs
    that many asyncio tasks in this one process, each with its own lock
    object; their critical section yields to the loop once while holding,
    so other tasks really try to get in.
    """
    record = read_record(record_path)
    fd = os.open(shm_path, os.O_RDWR)
    shm = mmap.mmap(fd, 16)
    os.close(fd)
    cell = struct.Struct("=QQ")
    n_tasks = int(tasks)
    me = os.getpid()
    # Everything is imported and built before the start line, so the timed
    # window holds only locking.
    if n_tasks == 0:
        acquire, release = _libs.sync_lock(lib, path, record)
    else:
        _libs.async_lock(lib, path + ".probe", record)
    out("hello", me)
    words = next(commands())
    start, end = int(words[1]), int(words[2])
    count = violations = 0

    if n_tasks == 0:
        while now() < start:
            time.sleep(0.001)
        while now() < end:
            acquire()
            counter, inside = cell.unpack_from(shm, 0)
            if inside:
                violations += 1
            cell.pack_into(shm, 0, counter + 1, me)
            cell.pack_into(shm, 0, counter + 1, 0)
            release()
            count += 1
        out("done", count, violations)
        return

    async def task(acquire, release) -> tuple[int, int]:  # type: ignore[no-untyped-def]
        n = bad = 0
        while now() < end:
            await acquire()
            counter, inside = cell.unpack_from(shm, 0)
            if inside:
                bad += 1
            cell.pack_into(shm, 0, counter + 1, me)
            await asyncio.sleep(0)
            counter, _ = cell.unpack_from(shm, 0)
            cell.pack_into(shm, 0, counter, 0)
            await release()
            n += 1
        return n, bad

    async def main() -> tuple[int, int]:
        locks = [_libs.async_lock(lib, path, record) for _ in range(n_tasks)]
        while now() < start:
            await asyncio.sleep(0.001)
        results = await asyncio.gather(*(task(a, r) for a, r in locks))
        return sum(n for n, _ in results), sum(b for _, b in results)

    count, violations = asyncio.run(main())
    out("done", count, violations)


# -- many waiters -------------------------------------------------------------


def role_many_holder(directory: str, n: str) -> None:
    """Hold n pylock locks, one per file, until killed."""
    import pylock

    raise_nofile(int(n) + 100)
    die_with_parent()
    locks = [pylock.Lock(os.path.join(directory, f"{i}.lock")) for i in range(int(n))]
    for lock in locks:
        lock.acquire()
    out("hello", os.getpid())
    for _ in commands():
        pass


def role_many_waiters(lib: str, directory: str, n: str, record_path: str, idle_s: str) -> None:
    """n tasks, each waiting for its own lock (held by a many_holder).
    ``wait``: start them, let them settle, answer ``waiting THREADS
    RSS_BYTES_PER_WAITER IDLE_CPU_PERCENT``, then, once every task holds
    its lock, ``done LAST_ACQUIRED_NS``."""
    record = read_record(record_path)
    count = int(n)
    raise_nofile(2 * count + 100)
    out("hello", os.getpid())
    next(commands())

    async def main() -> None:
        locks = [
            _libs.async_lock(lib, os.path.join(directory, f"{i}.lock"), record)
            for i in range(count)
        ]
        gc.collect()
        threads0, rss0 = status_field("Threads"), rss_kib()
        acquired = []

        async def one(acquire) -> None:  # type: ignore[no-untyped-def]
            await acquire()
            acquired.append(now())

        tasks = [asyncio.ensure_future(one(a)) for a, _ in locks]
        # Settled: every task has found its lock held and waits (half a
        # second with under 1% of a core used), then the idle window.
        for _ in range(60):
            before = resource.getrusage(resource.RUSAGE_SELF)
            await asyncio.sleep(0.5)
            after = resource.getrusage(resource.RUSAGE_SELF)
            spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            if spent < 0.005:
                break
        threads, rss = status_field("Threads"), rss_kib()
        cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        await asyncio.sleep(float(idle_s))
        cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        used = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        assert not acquired, "a task took its lock while the holder held it"
        out(
            "waiting",
            threads - threads0,
            (rss - rss0) * 1024 // count,
            100 * used / (wall1 - wall0),
        )
        await asyncio.gather(*tasks)
        out("done", max(acquired))
        for _, release in locks:
            await release()

    asyncio.run(main())


ROLES = {
    "uncontended": role_uncontended,
    "holder": role_holder,
    "waiter": role_waiter,
    "watcher": role_watcher,
    "contend": role_contend,
    "many_holder": role_many_holder,
    "many_waiters": role_many_waiters,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
