"""Where a sync hand-over's time goes, step by step, from kernel tracepoints.

    sudo python bench/profile_handoff.py [--trials 40] [--block-ms 20 50]

A holder process takes the lock, a waiter in another process blocks in
acquire, the holder sleeps a random while (caches go cold, as in run.py's
handoff figure) and releases.  This runs that for pylock and for the floor
(`fcntl.flock` + `os.pwrite` of a record of the same size) under
`perf record -a -k CLOCK_MONOTONIC` with the scheduler and syscall
tracepoints, and prints the median time of each step:

    release() called -> flock(LOCK_UN) -> wake-up of the waiter -> the
    waiter on a CPU -> its flock returns -> statx -> pwrite -> acquire()
    returned

plus how often the waiter was woken on the holder's CPU (it then runs only
once the holder blocks).  Markers are cheap syscalls the kernel traces:
getpgid in the holder just before release(), getppid in the waiter just
after acquire() returns.  Needs Linux, root and perf; the tracepoints add
a few microseconds to each step, so compare the two columns, not absolute
values, with run.py's figures.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

Steps = dict[str, list[float]]
Events = list[tuple[float, int, str, str]]

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
RECORD = b"x" * 480  # about as long as pylock's record
LIBS = ("pylock", "floor")
EVENTS = ",".join(
    [
        "sched:sched_waking",
        "sched:sched_switch",
        "syscalls:sys_enter_getpgid",
        "syscalls:sys_enter_flock",
        "syscalls:sys_exit_flock",
        "syscalls:sys_enter_statx",
        "syscalls:sys_enter_pwrite64",
        "syscalls:sys_exit_pwrite64",
        "syscalls:sys_enter_getppid",
    ]
)
STEPS = [
    ("release", "unlock", "holder: release() called -> flock(LOCK_UN)"),
    ("unlock", "waking", "-> the kernel wakes the waiter"),
    ("waking", "on_cpu", "-> the waiter runs"),
    ("on_cpu", "flock_ret", "-> its flock returns"),
    ("flock_ret", "statx", "waiter: flock returned -> statx called (pylock)"),
    ("flock_ret", "pwrite", "waiter: flock returned -> record pwrite called"),
    ("pwrite", "pwrite_ret", "the pwrite itself"),
    ("pwrite_ret", "done", "pwrite returned -> acquire() returned"),
    ("flock_ret", "done", "waiter: flock returned -> acquire() returned"),
    ("release", "done", "total: release() called -> acquire() returned"),
]


def pair(lib: str, path: str, trials: int, block: tuple[float, float]) -> None:
    """The traced program: holder (this process) and waiter (a fork)."""
    sys.path.insert(0, REPO)
    import _libs

    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        acquire, release = _libs.sync_lock(lib, path, RECORD)
        while os.read(go_r, 1) == b"g":
            os.write(back_w, b"r")
            acquire()
            os.getppid()  # marker: acquire() returned
            release()
            os.write(back_w, b"d")
        os._exit(0)
    print("pids", os.getpid(), pid, flush=True)
    acquire, release = _libs.sync_lock(lib, path, RECORD)
    for _ in range(trials):
        acquire()
        os.write(go_w, b"g")
        os.read(back_r, 1)
        time.sleep(random.uniform(*block) / 1000)
        os.getpgid(0)  # marker: release() called
        release()
        os.read(back_r, 1)
    os.write(go_w, b"q")
    os.waitpid(pid, 0)


def parse(text: str) -> list[tuple[float, int, str, str]]:
    out = []
    pattern = re.compile(r"\s*\S+\s+(\d+)/\d+\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)")
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            pid, t, ev, rest = m.groups()
            out.append((float(t) * 1e6, int(pid), ev, rest))
    return out


def analyse(
    events: list[tuple[float, int, str, str]], holder: int, waiter: int
) -> tuple[dict[str, list[float]], str]:
    trials: list[dict[str, float]] = []
    cur: dict[str, float] | None = None
    from_holder = switched = 0
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
        elif pid == holder and ev == "sched:sched_waking" and f"pid={waiter} " in rest + " ":
            name = "waking"
        elif ev == "sched:sched_switch" and f"next_pid={waiter} " in rest + " " and "waking" in cur:
            name = "on_cpu"
            if "on_cpu" not in cur:
                switched += 1
                from_holder += f"prev_pid={holder} " in rest
        elif pid == waiter and "waking" in cur:
            name = {
                "syscalls:sys_exit_flock": "flock_ret",
                "syscalls:sys_enter_statx": "statx",
                "syscalls:sys_enter_pwrite64": "pwrite",
                "syscalls:sys_exit_pwrite64": "pwrite_ret",
                "syscalls:sys_enter_getppid": "done",
            }.get(ev)
        if name is not None and name not in cur:
            cur[name] = t
    steps: dict[str, list[float]] = {}
    for a, b, label in STEPS:
        xs = [c[b] - c[a] for c in trials if a in c and b in c and c[b] >= c[a]]
        if xs:
            steps[label] = xs
    note = (
        f"{len(trials)} trials; the waiter was switched in straight after the holder "
        f"{from_holder} times of {switched}"
    )
    return steps, note


def profile(
    doc: str,
    script: str,
    events: str,
    steps: Sequence[tuple[str, str, str]],
    pair: Callable[[str, str, int, tuple[float, float]], None],
    analyse: Callable[[Events, int, int], tuple[Steps, str]],
) -> int:
    """Run script's traced program for each of LIBS under perf, print the
    median of each step side by side (this tool and profile_handoff_async.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
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
    results: dict[str, tuple[Steps, str]] = {}
    with tempfile.TemporaryDirectory(prefix="pylock-handoff-") as tmp:
        for lib in LIBS:
            data = os.path.join(tmp, f"{lib}.data")
            cmd = [sys.executable, os.path.abspath(script), "--trials", str(args.trials)]
            cmd += ["--block-ms", *map(str, args.block_ms), "--pair", lib, f"{tmp}/{lib}.lock"]
            record = [perf, "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", events]
            traced = subprocess.run(
                [*record, "-o", data, "--", *cmd], check=True, capture_output=True, text=True
            )
            pids = next(line.split() for line in traced.stdout.splitlines() if line[:4] == "pids")
            trace = subprocess.run(
                [perf, "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[lib] = analyse(parse(trace), int(pids[1]), int(pids[2]))
    width = max(len(label) for _, _, label in steps)
    print(f"{'step (median µs, tracepoints included)':{width}s} {'pylock':>9s} {'floor':>9s}")
    for _, _, label in steps:
        cells = []
        for lib in LIBS:
            xs = results[lib][0].get(label)
            cells.append(f"{statistics.median(xs):9.1f}" if xs else f"{'-':>9s}")
        print(f"{label:{width}s} {cells[0]} {cells[1]}")
    for lib in LIBS:
        print(f"{lib}: {results[lib][1]}")
    return 0


def main() -> int:
    return profile(__doc__ or "", __file__, EVENTS, STEPS, pair, analyse)


if __name__ == "__main__":
    sys.exit(main())
