"""Where an async hand-over's time goes, step by step, from kernel tracepoints.

    sudo python bench/profile_handoff_async.py [--trials 40] [--block-ms 20 50]

As profile_handoff.py, for `await acquire_async()` against the async floor
(a thread blocked in `fcntl.flock` that writes the record and hands over
with `call_soon_threadsafe`).  A holder process (a blocking lock, as in
run.py's async rows) takes the lock; the waiter, another process, blocks in
its event loop; the holder sleeps a random while (caches go cold) and
releases.  The steps:

    release() called -> flock(LOCK_UN) -> the waiter thread's flock returns
    -> its pwrite -> its wake-up of the loop (the self-pipe's sendto) -> the
    loop's epoll_wait returns -> the loop's next epoll_wait returns (the turn
    that runs the task) -> acquire_async returned

Markers: getpgid in the holder just before release(), getppid in the waiter
just after the await returns.  Needs Linux, root and perf; compare the two
columns, not absolute values, with run.py's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import profile_handoff

EVENTS = ",".join(
    [
        "syscalls:sys_enter_getpgid",
        "syscalls:sys_enter_flock",
        "syscalls:sys_exit_flock",
        "syscalls:sys_enter_statx",
        "syscalls:sys_enter_pwrite64",
        "syscalls:sys_exit_pwrite64",
        "syscalls:sys_enter_sendto",
        "syscalls:sys_exit_epoll_wait",
        "syscalls:sys_enter_getppid",
    ]
)
STEPS = [
    ("release", "unlock", "holder: release() called -> flock(LOCK_UN)"),
    ("unlock", "flock_ret", "-> the waiter thread's flock returns"),
    ("flock_ret", "pwrite", "thread: flock returned -> record pwrite called"),
    ("pwrite_ret", "sendto", "thread: pwrite returned -> the loop woken (sendto)"),
    ("sendto", "epoll", "-> the loop's epoll_wait returns"),
    ("epoll", "epoll2", "-> its next epoll_wait returns (the task's turn)"),
    ("epoll2", "done", "-> acquire_async returned"),
    ("flock_ret", "done", "waiter: flock returned -> acquire_async returned"),
    ("release", "done", "total: release() called -> acquire_async returned"),
]
RECORD = b"x" * 480


def _floor_async(path: str, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    async def acquire() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            os.pwrite(fd, RECORD, 0)
            return
        done = loop.create_future()

        def in_thread() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, RECORD, 0)
            loop.call_soon_threadsafe(done.set_result, None)

        threading.Thread(target=in_thread, daemon=True).start()
        await done

    return acquire, (lambda: fcntl.flock(fd, fcntl.LOCK_UN))


def _floor_sync(path: str) -> tuple[Callable[[], object], Callable[[], object]]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, RECORD, 0)

    return acquire, (lambda: fcntl.flock(fd, fcntl.LOCK_UN))


def pair(lib: str, path: str, trials: int, block: tuple[float, float]) -> None:
    """The traced program: holder (this process) and waiter (a fork)."""
    sys.path.insert(0, profile_handoff.REPO)
    import pylock

    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        loop = asyncio.new_event_loop()
        if lib == "pylock":
            lock = pylock.Lock(path)
            acquire, release = lock.acquire_async, lock.release
        else:
            acquire, release = _floor_async(path, loop)

        async def one() -> None:
            os.write(back_w, b"r")
            await acquire()
            os.getppid()  # marker: acquire_async returned
            release()

        while os.read(go_r, 1) == b"g":
            loop.run_until_complete(one())
            os.write(back_w, b"d")
        os._exit(0)
    print("pids", os.getpid(), pid, flush=True)
    if lib == "pylock":
        holder = pylock.Lock(path)
        hold, let_go = holder.acquire, holder.release
    else:
        hold, let_go = _floor_sync(path)
    for _ in range(trials):
        hold()
        os.write(go_w, b"g")
        os.read(back_r, 1)
        time.sleep(random.uniform(*block) / 1000)
        os.getpgid(0)  # marker: release() called
        let_go()
        os.read(back_r, 1)
    os.write(go_w, b"q")
    os.waitpid(pid, 0)


def analyse(
    events: list[tuple[float, int, str, str]], holder: int, waiter: int
) -> dict[str, list[float]]:
    trials: list[dict[str, float]] = []
    cur: dict[str, float] | None = None
    for t, pid, ev, rest in events:
        if pid == holder and ev == "syscalls:sys_enter_getpgid":
            cur = {"release": t}
            trials.append(cur)
            continue
        if cur is None:
            continue
        name = None
        if pid == holder and ev == "syscalls:sys_enter_flock" and "cmd: 0x00000008" in rest:
            name = "unlock"
        elif pid == waiter and "unlock" in cur:
            name = {
                "syscalls:sys_exit_flock": "flock_ret",
                "syscalls:sys_enter_statx": "statx",
                "syscalls:sys_enter_pwrite64": "pwrite",
                "syscalls:sys_exit_pwrite64": "pwrite_ret",
                "syscalls:sys_enter_getppid": "done",
            }.get(ev)
            if ev == "syscalls:sys_enter_sendto" and "pwrite_ret" in cur:
                name = "sendto"
            elif ev == "syscalls:sys_exit_epoll_wait" and "sendto" in cur:
                name = "epoll2" if "epoll" in cur else "epoll"
        if name is not None and name not in cur:
            cur[name] = t
    steps: dict[str, list[float]] = {}
    for a, b, label in STEPS:
        xs = [c[b] - c[a] for c in trials if a in c and b in c and c[b] >= c[a]]
        if xs:
            steps[label] = xs
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--block-ms", type=float, nargs=2, default=(20.0, 50.0))
    ap.add_argument("--pair", nargs=2, metavar=("LIB", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pair:
        pair(args.pair[0], args.pair[1], args.trials, tuple(args.block_ms))
        return 0
    perf = shutil.which("perf")
    if perf is None or os.geteuid() != 0:
        print("needs root and perf (linux-perf)", file=sys.stderr)
        return 2
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="pylock-handoff-") as tmp:
        for lib in ("pylock", "floor"):
            data = os.path.join(tmp, f"{lib}.data")
            cmd = [sys.executable, os.path.abspath(__file__), "--trials", str(args.trials)]
            cmd += ["--block-ms", *map(str, args.block_ms), "--pair", lib, f"{tmp}/{lib}.lock"]
            record = [perf, "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", EVENTS]
            traced = subprocess.run(
                [*record, "-o", data, "--", *cmd], check=True, capture_output=True, text=True
            )
            pids = next(line.split() for line in traced.stdout.splitlines() if line[:4] == "pids")
            script = subprocess.run(
                [perf, "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[lib] = analyse(profile_handoff.parse(script), int(pids[1]), int(pids[2]))
    print(f"{'step (median µs, tracepoints included)':56s} {'pylock':>9s} {'floor':>9s}")
    for _, _, label in STEPS:
        cells = []
        for lib in ("pylock", "floor"):
            xs = results[lib].get(label)
            cells.append(f"{statistics.median(xs):9.1f}" if xs else f"{'-':>9s}")
        print(f"{label:56s} {cells[0]} {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
