"""`pylock who --system` beside lslocks and lsof, on one host state, in one run.

    python bench/system.py            # ~3,000 locks, ~2,500 processes; ~1 minute
    python bench/system.py --quick    # ~600 locks, ~500 processes
    python bench/system.py --locks 6000 --idle 4000 --rounds 15

The state, built once and left standing while every tool looks at it:
- holder processes (Python), each taking flock (exclusive and shared), POSIX
  (byte ranges) and OFD locks on files of their own, and forking copies that
  share every descriptor (inherited holders: every copy's fdinfo shows them);
- waiters blocked in the kernel: flock(1) processes, POSIX and OFD requests;
- two-process deadlocks (flock against POSIX), which pylock must report;
- idle `sleep` processes, so every tool walks a few thousand processes.

Each round runs every row once, in a shuffled order; the table gives the
median and p90 of whole commands (from posix_spawn to waitpid, output to a
pipe that is drained) and each row's ratio to lslocks and lsof.  pylock's
in-process cost (read the table, build the view, render it) is reported
beside it without the interpreter's start-up, and `python -c pass` gives that
start-up alone.  Before timing, pylock's view of the bench's files is checked
against lslocks' (the same locks) and its deadlocks against the ones built.

Needs Linux, util-linux flock(1) and lslocks, and lsof.  Run it as root to
compare like with like: each tool then sees every process's descriptors.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PYLOCK = os.path.join(os.path.dirname(sys.executable), "pylock")
TIMEOUT = 120
# lslocks and lsof stat the files they list: one on a filesystem that stopped
# answering (a FUSE server paused by another test, seen here) holds them up.
HANG = "a file they look at is on a filesystem that does not answer; run again later"

# A holder: takes its share of locks, forks copies sharing them, says "ready"
# and holds until its stdin closes (the copies die with it: PR_SET_PDEATHSIG).
HOLDER = textwrap.dedent(
    """
    import ctypes, fcntl, os, signal, struct, sys
    directory, first, count, copies = sys.argv[1], *map(int, sys.argv[2:5])
    for n in range(first, first + count):
        fd = os.open(os.path.join(directory, f"f{n}"), os.O_RDWR | os.O_CREAT, 0o644)
        kind = n % 10
        if kind < 6:
            fcntl.flock(fd, fcntl.LOCK_EX if kind < 4 else fcntl.LOCK_SH)
        elif kind < 9:
            for start in (0, 100, 200):
                fcntl.lockf(fd, fcntl.LOCK_EX, 50, start)
        else:
            fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    parent = os.getpid()
    for _ in range(copies):
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(0)
            while True:
                signal.pause()
    print("ready", flush=True)
    sys.stdin.read()
    """
)

# A POSIX or OFD waiter on one held file, or one side of a deadlock.
WAITER = textwrap.dedent(
    """
    import fcntl, os, struct, sys
    steps = sys.argv[1:]
    for n, step in enumerate(steps):
        kind, path = step.split("=", 1)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if n == len(steps) - 1:
            print("asking", flush=True)
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX)
        elif kind == "posix":
            fcntl.lockf(fd, fcntl.LOCK_EX)
        else:
            fcntl.fcntl(fd, 38, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        if n < len(steps) - 1:
            print("took", flush=True)
            sys.stdin.readline()
    sys.stdin.read()
    """
)


class State:
    """The host state every tool looks at; close() ends every process of it."""

    def __init__(self, locks: int, idle: int, holders: int, copies: int, waiters: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="pylock-bench-system-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.deadlocked: list[tuple[int, int]] = []
        per = locks // holders
        started = [
            self._start(
                [sys.executable, "-c", HOLDER, self.dir, str(n * per), str(per), str(copies)]
            )
            for n in range(holders)
        ]
        for proc in started:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        self.locks = per * holders
        # Lines /proc/locks shows for them: POSIX files hold three ranges each.
        self.lines = sum(3 if 6 <= n % 10 < 9 else 1 for n in range(self.locks))
        held = [n for n in range(self.locks) if n % 10 < 4]
        flock_waiters = held[:waiters]
        for n in flock_waiters:
            self._start([shutil.which("flock") or "flock", self._file(n), "true"], pipe=False)
        posix = [n for n in range(self.locks) if 6 <= n % 10 < 9][: max(waiters // 20, 1)]
        ofd = [n for n in range(self.locks) if n % 10 == 9][: max(waiters // 40, 1)]
        for kind, files in (("posix", posix), ("ofd", ofd)):
            for n in files:
                self._ask([f"{kind}={self._file(n)}"])
        self._deadlocks(max(waiters // 40, 1))
        self.waiting = len(flock_waiters) + len(posix) + len(ofd) + 2 * len(self.deadlocked)
        self._until_waiting()
        for _ in range(idle):
            self.procs.append(subprocess.Popen(["sleep", "3600"]))

    def _file(self, n: int) -> str:
        return os.path.join(self.dir, f"f{n}")

    def _start(self, argv: list[str], pipe: bool = True) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def _ask(self, steps: list[str]) -> subprocess.Popen[bytes]:
        proc = self._start([sys.executable, "-c", WAITER, *steps])
        assert proc.stdout is not None
        for _ in steps[:-1]:
            assert proc.stdout.readline() == b"took\n"
        return proc

    def _deadlocks(self, count: int) -> None:
        for n in range(count):
            a, b = os.path.join(self.dir, f"dl{n}a"), os.path.join(self.dir, f"dl{n}b")
            p = self._ask([f"flock={a}", f"posix={b}"])
            q = self._ask([f"posix={b}", f"flock={a}"])
            for proc in (p, q):  # both hold their first lock: now both ask for the other's
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
            self.deadlocked.append((p.pid, q.pid))

    def _until_waiting(self) -> None:
        inodes = {
            str(os.stat(os.path.join(self.dir, name)).st_ino) for name in os.listdir(self.dir)
        }
        deadline = time.monotonic() + 120
        while True:
            with open("/proc/locks") as f:
                lines = [line.split() for line in f if " -> " in line]
            blocked = sum(1 for words in lines if words[-3].rpartition(":")[2] in inodes)
            if blocked >= self.waiting:
                return
            assert time.monotonic() < deadline, f"{blocked} of {self.waiting} waiters blocked"
            time.sleep(0.01)  # re-reading kernel state while the waiters start

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def check(state: State) -> dict[str, Any]:
    """pylock's view of the bench's files against the state built, and lslocks' beside it."""
    out = subprocess.run(
        [PYLOCK, "who", "--system", "--json", "--path", state.dir], capture_output=True
    )
    doc = json.loads(out.stdout)
    ours = sum(lock["count"] for f in doc["files"] for lock in f["locks"])
    ours_waiting = sum(len(f["waiters"]) for f in doc["files"])
    built = (state.lines + 2 * len(state.deadlocked), state.waiting)
    assert (ours, ours_waiting) == built, ((ours, ours_waiting), built)
    found = {tuple(d["processes"]) for d in doc["deadlocks"]}
    cycles = {tuple(sorted(pair)) for pair in state.deadlocked}
    assert out.returncode == 1 and found == cycles, (out.returncode, found, cycles)
    # lslocks reads /proc/locks once: while other processes lock and unlock,
    # a run can repeat or skip records.  The bench's locks stand still, so
    # how far each run is off is a figure of its own.
    inodes = {os.stat(os.path.join(state.dir, name)).st_ino for name in os.listdir(state.dir)}
    off = []
    for _ in range(5):
        argv = ["lslocks", "--json", "-o", "INODE,MODE"]
        try:
            listed = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"lslocks did not finish in {TIMEOUT} s: {HANG}") from None
        theirs = [lk for lk in json.loads(listed.stdout)["locks"] if lk["inode"] in inodes]
        held = sum(1 for lk in theirs if not lk["mode"].endswith("*"))
        off.append((held - built[0], len(theirs) - held - built[1]))
    return {"locks": ours, "waiting": ours_waiting, "deadlocks": len(found), "lslocks_off": off}


def run(argv: list[str]) -> float:
    """Seconds from spawn to exit, the output drained through a pipe."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SystemExit(f"{argv[0]} did not finish in {TIMEOUT} s: {HANG}") from None
    return time.perf_counter() - start


def in_process() -> float:
    """pylock's own cost, without the interpreter's start: look, build, render."""
    from pylock._cli import system_render
    from pylock._cli.system_view import Filter, snapshot

    start = time.perf_counter()
    snap = snapshot(Filter())
    json.dumps(system_render.json_doc(snap))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--locks", type=int)
    parser.add_argument("--idle", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    locks = opts.locks or (600 if opts.quick else 3000)
    idle = opts.idle if opts.idle is not None else (400 if opts.quick else 2000)
    rounds = opts.rounds or (5 if opts.quick else 11)
    rows = {
        "pylock who --system": [PYLOCK, "who", "--system"],
        "pylock who --system --json": [PYLOCK, "who", "--system", "--json"],
        "lslocks": ["lslocks"],
        "lslocks --json --output-all": ["lslocks", "--json", "--output-all"],
        "lsof -n": ["lsof", "-n"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    missing = [argv[0] for argv in rows.values() if shutil.which(argv[0]) is None]
    if missing:
        print(f"cannot run: {', '.join(missing)} not installed", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    state = State(locks, idle, holders=max(locks // 150, 2), copies=3, waiters=max(locks // 15, 4))
    try:
        built = time.monotonic() - t0
        seen = check(state)
        processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
        with open("/proc/locks") as f:
            table = sum(1 for _ in f)
        print(
            f"host state: {seen['locks']} locks and {seen['waiting']} waiters on the bench's files "
            f"({table} lines in /proc/locks), {processes} processes; built in {built:.1f} s"
        )
        wrong = [f"{held:+d} held {waiting:+d} waiting" for held, waiting in seen["lslocks_off"]]
        print(
            f"pylock shows them all and the {seen['deadlocks']} deadlocks built; 5 lslocks runs "
            f"on the same state: {', '.join(wrong)}"
        )
        times: dict[str, list[float]] = {name: [] for name in rows}
        times["pylock in-process"] = []
        order = list(rows)
        rng = random.Random(opts.seed)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                times[name].append(run(rows[name]))
            times["pylock in-process"].append(in_process())
        report(times, os.getloadavg())
    finally:
        state.close()
    return 0


def report(times: dict[str, list[float]], load: tuple[float, float, float]) -> None:
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"{len(next(iter(times.values())))} rounds, load average {load[0]:.2f} at the end")
    print()
    print("| command | median | p90 | / lslocks | / lsof -n |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        p90 = sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]
        print(
            f"| {name} | {med[name] * 1000:.0f} ms | {p90 * 1000:.0f} ms | "
            f"{med[name] / med['lslocks']:.2f}x | {med[name] / med['lsof -n']:.3f}x |"
        )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
