"""The thread stress: many threads of one process hammer Lock objects on one
path, with an overlap detector that does not trust pylock.

    python -m tests.support.threadstress PATH THREADS SECTIONS SEED [none]

Half the threads share one Lock object, the others have one Lock object each
(all on PATH): the shared object is guarded by its per-object ownership, the
separate ones exclude each other through the kernel's flock.  Each section
picks one way in: blocking, `with`, timed (0.2-5 ms, retried), non-blocking,
acquire_async in the thread's own event loop, async timed, and async
cancelled (asyncio.wait_for).  Inside, the detector checks that no other
section is inside (an owner slot guarded by its own threading.Lock) and
that the token file still holds the token of the last section to leave.

Prints one JSON line with the counts.  A hang must not stall the test that
runs this: faulthandler dumps every thread's stack and exits after the
deadline.  With the last argument "none" the threads take no lock at all: the
control run, which must report overlaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import random
import sys
import sysconfig
import threading
import time
from typing import Any

import pylock


class Detector:
    """Who is inside, kept apart from pylock: entering while someone else is
    inside, or leaving after someone else entered, is an overlap."""

    def __init__(self, token_path: str) -> None:
        self._guard = threading.Lock()
        self._inside: int | None = None
        self.overlaps = 0
        self.token_mismatches = 0
        self._fd = os.open(token_path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._fd, b"FREE".ljust(16), 0)

    def enter(self, me: int) -> None:
        with self._guard:
            if self._inside is not None:
                self.overlaps += 1
            self._inside = me
        if os.pread(self._fd, 16, 0).strip() != b"FREE":
            with self._guard:
                self.token_mismatches += 1
        os.pwrite(self._fd, f"T{me}".encode().ljust(16), 0)

    def leave(self, me: int) -> None:
        if os.pread(self._fd, 16, 0).strip() != f"T{me}".encode():
            with self._guard:
                self.token_mismatches += 1
        os.pwrite(self._fd, b"FREE".ljust(16), 0)
        with self._guard:
            if self._inside != me:
                self.overlaps += 1
            self._inside = None


class NoLock:
    """The control: a "lock" that excludes nothing."""

    locked = False

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        return True

    def release(self) -> None:
        pass

    async def acquire_async(self, timeout: float | None = None) -> bool:
        await asyncio.sleep(0)
        return True

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


WAYS = ["blocking", "with", "timed", "nonblocking", "async", "async_timed", "async_cancelled"]


def worker(
    me: int,
    lock: Any,
    detector: Detector,
    sections: int,
    seed: int,
    counts: dict[str, int],
    errors: list[str],
) -> None:
    rng = random.Random(seed * 1000 + me)
    loop = asyncio.new_event_loop()
    mine = dict.fromkeys([*WAYS, "refused"], 0)

    def section() -> None:
        detector.enter(me)
        for _ in range(rng.randrange(200)):  # linger a little
            pass
        if rng.random() < 0.25:
            time.sleep(0)  # and sometimes hand the CPU to the others inside
        detector.leave(me)

    async def via_async(way: str) -> bool:
        # Taken and released inside one task, as `async with` does.
        try:
            if way == "async":
                await lock.acquire_async()
            elif way == "async_timed":
                await lock.acquire_async(timeout=rng.uniform(0.0002, 0.005))
            elif hasattr(asyncio, "timeout"):  # cancels this task itself
                async with asyncio.timeout(rng.uniform(0.0002, 0.005)):
                    await lock.acquire_async()
            else:  # Python < 3.11: wait_for runs the acquisition in a task of its own
                await asyncio.wait_for(lock.acquire_async(), rng.uniform(0.0002, 0.005))
        except (pylock.LockTimeout, asyncio.TimeoutError):
            return False
        try:
            section()
        finally:
            lock.release()
        return True

    try:
        done = 0
        while done < sections:
            way = rng.choice(WAYS)
            if way == "with":
                with lock:
                    section()
            elif way.startswith("async"):
                if not loop.run_until_complete(via_async(way)):
                    mine["refused"] += 1
                    continue
            else:
                try:
                    if way == "blocking":
                        lock.acquire()
                    elif way == "timed":
                        lock.acquire(timeout=rng.uniform(0.0002, 0.005))
                    else:
                        lock.acquire(blocking=False)
                except (pylock.LockHeld, pylock.LockTimeout):
                    mine["refused"] += 1
                    continue
                try:
                    section()
                finally:
                    lock.release()
            mine[way] += 1
            done += 1
    except BaseException as exc:  # reported, never swallowed
        errors.append(f"thread {me}: {type(exc).__name__}: {exc}")
    finally:
        loop.close()
        with detector._guard:
            for key, value in mine.items():
                counts[key] = counts.get(key, 0) + value


def run(path: str, threads: int, sections: int, seed: int, control: bool) -> dict[str, Any]:
    detector = Detector(path + ".token")
    shared = NoLock() if control else pylock.Lock(path)
    locks = [
        shared if i < threads // 2 else (NoLock() if control else pylock.Lock(path))
        for i in range(threads)
    ]
    counts: dict[str, int] = {}
    errors: list[str] = []
    start = threading.Barrier(threads)

    def body(i: int) -> None:
        start.wait()
        worker(i, locks[i], detector, sections, seed, counts, errors)

    pool = [threading.Thread(target=body, args=(i,), name=f"stress-{i}") for i in range(threads)]
    t0 = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - t0
    still_held = [i for i, lock in enumerate(locks) if lock.locked]
    free = True
    if not control:
        probe = pylock.Lock(path)
        try:
            probe.acquire(blocking=False)
            probe.release()
        except pylock.LockHeld:
            free = False
        probe.close()
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    return {
        "python": sys.version.split()[0],
        "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": gil,
        "threads": threads,
        "sections": sum(counts.get(w, 0) for w in WAYS),
        "by_way": {w: counts.get(w, 0) for w in WAYS},
        "refused_timed_out_cancelled": counts.get("refused", 0),
        "overlaps": detector.overlaps,
        "token_mismatches": detector.token_mismatches,
        "errors": errors,
        "still_held_after": still_held,
        "free_after": free,
        "elapsed_s": round(elapsed, 3),
    }


def main(argv: list[str]) -> None:
    path, threads, sections, seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    control = len(argv) > 4 and argv[4] == "none"
    deadline = float(os.environ.get("PYLOCK_THREADS_DEADLINE", "240"))
    # A hang: every thread's stack on stderr, then exit, so the test fails.
    faulthandler.dump_traceback_later(deadline, exit=True)
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(run(path, threads, sections, seed, control)), flush=True)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main(sys.argv[1:])
