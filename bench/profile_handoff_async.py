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

import asyncio
import os
import random
import sys
import time

from profile_handoff import RECORD, REPO, Events, Steps, profile

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


def pair(lib: str, path: str, trials: int, block: tuple[float, float]) -> None:
    """The traced program: holder (this process, a blocking lock as in
    run.py's async rows) and waiter (a fork, in its event loop)."""
    sys.path.insert(0, REPO)
    import _libs

    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        acquire, release = _libs.async_lock(f"{lib}-async", path, RECORD)

        async def one() -> None:
            os.write(back_w, b"r")
            await acquire()
            os.getppid()  # marker: acquire_async returned
            await release()

        while os.read(go_r, 1) == b"g":
            loop.run_until_complete(one())
            os.write(back_w, b"d")
        os._exit(0)
    print("pids", os.getpid(), pid, flush=True)
    hold, let_go = _libs.sync_lock(lib, path, RECORD)
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


def analyse(events: Events, holder: int, waiter: int) -> tuple[Steps, str]:
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
    steps: Steps = {}
    for a, b, label in STEPS:
        xs = [c[b] - c[a] for c in trials if a in c and b in c and c[b] >= c[a]]
        if xs:
            steps[label] = xs
    return steps, f"{len(trials)} trials"


def main() -> int:
    return profile(__doc__ or "", __file__, EVENTS, STEPS, pair, analyse)


if __name__ == "__main__":
    sys.exit(main())
