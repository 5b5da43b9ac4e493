"""Chaos exclusion: many processes, one lock, a killer.

``run_chaos`` (called from a test) starts a conductor process
(``python -m tests.support.chaos conductor ...``) that forks ``workers``
worker processes and plays the killer. Each worker performs
critical sections on one lock, mixing blocking, timed, non-blocking, async,
async-timed and async-cancelled acquisitions. In every section it

  1. reads the shared token file (what the previous holder left there),
  2. writes its own token (worker:incarnation:seq; an incarnation number is
     unique per started process, unlike a pid, which the kernel recycles),
  3. sometimes asks to be killed while holding (probability ``kill_p``),
  4. lingers a random few microseconds, then re-reads the token: any change
     means another process was inside at the same time (an overlap),
  5. writes FREE and releases (with ``unlink=True`` at probability ``unlink_p``).

Entry and exit are logged with CLOCK_MONOTONIC (system-wide, so comparable
with the conductor's clock) through O_APPEND writes, which SIGKILL cannot tear.
The conductor SIGKILLs a worker that asks for it, plus random workers at random
moments (usually waiters), restarts every killed worker, and afterwards checks
from the logs that

  * no section saw its token changed (no overlap),
  * every section found FREE on entry or the token of a process that was
    killed (nobody else can leave a token behind),
  * every worker finished its sections (no stuck waiter) and the lock is free.

The kill -> next holder latency is the next entry's time minus the moment the
conductor sent SIGKILL to a holder, counted only when somebody was waiting.

``impl`` selects what the workers lock with: "pylock" (the subject),
"flock" (raw fcntl.flock, to validate the harness) and "none" (no lock at all:
the control run that must show overlaps, proving the detector works).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

TOKEN_LEN = 48
FREE = b"FREE".ljust(TOKEN_LEN)

SYNC_MODES = ("sync", "with", "timed", "nonblock")
ASYNC_MODES = ("async", "async_with", "async_timed", "async_cancel")
ALL_MODES = SYNC_MODES + ASYNC_MODES


def now_ns() -> int:
    return time.monotonic_ns()


# ---------------------------------------------------------------- worker side


class _RawFlock:
    """The same surface as the parts of pylock.Lock the worker uses, on raw flock."""

    def __init__(self, path: str, exclude: bool = True) -> None:
        self.path = path
        self.exclude = exclude
        self.fd = -1
        self.locked = False

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if self.exclude:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.locked = True
        return True

    async def acquire_async(self, timeout: float | None = None) -> bool:
        return self.acquire()

    def release(self, unlink: bool = False) -> None:
        self.locked = False
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        pass

    def __enter__(self) -> _RawFlock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> _RawFlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Worker:
    def __init__(self, ns: Any) -> None:
        self.ns = ns
        self.rng = random.Random(f"{ns.seed}:{ns.id}:{ns.incarnation}")
        self.pid = os.getpid()
        self.inc = ns.incarnation
        self.token_fd = os.open(ns.token, os.O_RDWR | os.O_CLOEXEC)
        self.log_fd = os.open(ns.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.modes = ns.modes.split(",")
        if ns.impl == "pylock":
            import pylock

            self.pylock: Any = pylock
            self.held_exc: tuple[type[BaseException], ...] = (pylock.LockHeld,)
            self.timeout_exc: tuple[type[BaseException], ...] = (pylock.LockTimeout,)
            self.lock: Any = pylock.Lock(ns.lock)
        else:
            self.pylock = None
            self.held_exc = ()
            self.timeout_exc = ()
            self.lock = _RawFlock(ns.lock, exclude=ns.impl == "flock")

    def log(self, line: str) -> None:
        os.write(self.log_fd, (line + "\n").encode())

    def new_lock(self) -> Any:
        if self.pylock is not None:
            return self.pylock.Lock(self.ns.lock)
        return _RawFlock(self.ns.lock, exclude=self.ns.impl == "flock")

    # -- acquisition, one way per mode; each returns once the lock is held

    def acquire_sync(self, lock: Any, mode: str) -> int:
        """Take lock the way mode says; returns how many attempts gave up first."""
        retries = 0
        if mode in ("sync", "with"):
            lock.acquire()
        elif mode == "timed":
            while True:
                try:
                    lock.acquire(timeout=self.rng.uniform(0.0002, 0.005))
                    break
                except self.timeout_exc:
                    retries += 1
                    if lock.locked:
                        raise AssertionError("timed out acquire left the lock held") from None
        elif mode == "nonblock":
            try:
                lock.acquire(blocking=False)
            except self.held_exc:
                retries += 1
                if lock.locked:
                    raise AssertionError("refused acquire left the lock held") from None
                lock.acquire()
        else:
            raise ValueError(mode)
        return retries

    async def acquire_async(self, lock: Any, mode: str) -> int:
        retries = 0
        if mode in ("async", "async_with"):
            await lock.acquire_async()
        elif mode == "async_timed":
            while True:
                try:
                    await lock.acquire_async(timeout=self.rng.uniform(0.0002, 0.005))
                    break
                except self.timeout_exc:
                    retries += 1
                    if lock.locked:
                        raise AssertionError("timed out acquire_async left the lock held") from None
        elif mode == "async_cancel":
            while True:
                try:
                    await asyncio.wait_for(lock.acquire_async(), self.rng.uniform(0.0002, 0.005))
                    break
                except asyncio.TimeoutError:
                    retries += 1
                    if lock.locked:
                        raise AssertionError("cancelled acquire_async left the lock held") from None
        else:
            raise ValueError(mode)
        return retries

    # -- the critical section itself

    def section(self, seq: int, mode: str, retries: int = 0) -> None:
        token = f"{self.ns.id}:{self.inc}:{seq}".encode().ljust(TOKEN_LEN)
        t_enter = now_ns()
        prev = os.pread(self.token_fd, TOKEN_LEN, 0)
        os.pwrite(self.token_fd, token, 0)
        self.log(f"E {seq} {self.inc} {t_enter} {prev.decode().strip()} {mode} {retries}")
        if self.rng.random() < self.ns.kill_p:
            self.log(f"K {seq} {self.inc}")
            os.write(self.ns.kill_fd, f"{self.ns.id} {self.inc} {seq}\n".encode())
            # Hold the lock until the conductor kills us; EOF means it is gone.
            os.read(self.ns.alive_fd, 1)
            os._exit(3)
        r = self.rng.random()
        if r < 0.3:
            os.sched_yield()
        elif r < 0.5:
            time.sleep(self.rng.uniform(0, 0.0003))
        elif r < 0.51 and self.pylock is not None:
            # Diagnostics from inside: the kernel names this process.
            h = self.lock_in_use.holder()
            if h is None or h.pid != self.pid or not h.verified:
                self.log(f"D {seq} {self.inc} pid {self.pid}: holder() says {h!r}")
        cur = os.pread(self.token_fd, TOKEN_LEN, 0)
        status = "ok" if cur == token else "OVERLAP:" + cur.decode().strip()
        os.pwrite(self.token_fd, FREE, 0)
        self.log(f"X {seq} {self.inc} {status} {mode}")

    def release(self, lock: Any) -> None:
        unlink = self.rng.random() < self.ns.unlink_p
        lock.release(unlink=unlink) if unlink else lock.release()

    async def run(self) -> None:
        for seq in range(self.ns.start, self.ns.start + self.ns.sections):
            mode = self.rng.choice(self.modes)
            fresh = self.rng.random() < 0.05
            lock = self.new_lock() if fresh else self.lock
            self.lock_in_use = lock
            if mode == "with":
                with lock:
                    self.section(seq, mode)
            elif mode == "async_with" and self.ns.unlink_p == 0:
                async with lock:
                    self.section(seq, mode)
            elif mode in SYNC_MODES:
                retries = self.acquire_sync(lock, mode)
                self.section(seq, mode, retries)
                self.release(lock)
            else:
                retries = await self.acquire_async(lock, "async" if mode == "async_with" else mode)
                self.section(seq, mode, retries)
                self.release(lock)
            if lock.locked:
                raise AssertionError(f"{mode}: still locked after release")
            if fresh:
                lock.close()
            # Outside the lock: without a pause the releasing process, still
            # on the CPU, would usually take the lock straight back and the
            # timed and non-blocking attempts would rarely meet a holder.
            r = self.rng.random()
            if r < 0.3:
                os.sched_yield()
            elif r < 0.8:
                time.sleep(self.rng.uniform(0, 0.002))


@dataclasses.dataclass
class WorkerConfig:
    lock: str
    token: str
    log: str
    id: int
    start: int
    sections: int
    seed: str
    kill_fd: int
    alive_fd: int
    kill_p: float
    unlink_p: float
    impl: str
    modes: str
    incarnation: int = 0


# ---------------------------------------------------------------- the conductor
#
# One process forks every worker, kills, reaps and restarts them. Workers are
# forked from it (it has already imported pylock and asyncio) rather than
# started as fresh interpreters: on 2 cores a stream of interpreter start-ups
# (about 60 ms of CPU each, one every few dozen ms at a 5% kill rate) starves
# the waiter being handed the lock, and the kill -> next holder figure would
# measure the scheduler instead of the lock. It is single-threaded, so forking
# is safe, and it reaps only the pids it forked.


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when the conductor dies (a killed test run must not
    leave workers fighting over the lock forever)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _child(cfg: WorkerConfig, err_path: str, close: Sequence[int], parent: int) -> None:
    code = 1
    try:
        _die_with_parent(parent)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        err = os.open(err_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(err, 2)
        os.close(err)
        asyncio.run(Worker(cfg).run())
        code = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def conductor_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="chaos conductor")
    p.add_argument("--dir", required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sections", type=int, default=2000)
    p.add_argument("--kill-p", type=float, default=0.05)
    p.add_argument("--random-kill-interval", type=float, default=0.25)
    p.add_argument("--unlink-p", type=float, default=0.0)
    p.add_argument("--impl", choices=("pylock", "flock", "none"), default="pylock")
    p.add_argument("--modes", default=",".join(ALL_MODES))
    p.add_argument("--seed", default="1")
    p.add_argument("--deadline", type=float, default=600.0)
    ns = p.parse_args(argv)
    if ns.impl == "pylock":
        import pylock  # noqa: F401  (warm: every forked worker has it already)

    d = ns.dir
    lock_path = os.path.join(d, "chaos.lock")
    token_path = os.path.join(d, "token")
    with open(token_path, "wb") as f:
        f.write(FREE)
    logs = [os.path.join(d, f"worker{i}.log") for i in range(ns.workers)]
    for lp in logs:
        open(lp, "wb").close()

    kill_r, kill_w = os.pipe()
    alive_r, alive_w = os.pipe()
    wake_r, wake_w = os.pipe()
    for fd in (kill_r, wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    child_closes = (kill_r, alive_w, wake_r, wake_w)

    rng = random.Random(ns.seed)
    pids: dict[int, int] = {}  # worker id -> its live process's pid
    incarnation: dict[int, int] = {}  # worker id -> that process's incarnation
    next_inc = 0
    # Keyed by incarnation: pids wrap around (pid_max is often 32768) long
    # before a large run has started its last worker.
    spawned_at: dict[int, int] = {}
    killed_at: dict[int, int] = {}
    requested: list[int] = []
    failures: list[str] = []
    stuck: list[str] = []
    finished: set[int] = set()

    def completed_of(i: int) -> int:
        with open(logs[i]) as f:
            return sum(1 for line in f if line.startswith("X "))

    def spawn(i: int) -> None:
        done = completed_of(i)
        cfg = WorkerConfig(
            lock=lock_path, token=token_path, log=logs[i], id=i, start=done,
            sections=ns.sections - done, seed=ns.seed, kill_fd=kill_w, alive_fd=alive_r,
            kill_p=ns.kill_p, unlink_p=ns.unlink_p, impl=ns.impl, modes=ns.modes,
        )  # fmt: skip
        nonlocal next_inc
        next_inc += 1
        cfg.incarnation = next_inc
        pid = os.fork()
        if pid == 0:
            _child(cfg, logs[i] + ".err", child_closes, me)
        pids[i] = pid
        incarnation[i] = next_inc
        spawned_at[next_inc] = now_ns()

    def kill(i: int, was_requested: bool) -> None:
        pid, inc = pids[i], incarnation[i]
        if inc in killed_at:
            return
        t = now_ns()
        os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid cannot be reused
        killed_at[inc] = t
        if was_requested:
            requested.append(inc)

    me, parent = os.getpid(), os.getppid()
    t0 = time.monotonic()
    for i in range(ns.workers):
        spawn(i)
    interval = ns.random_kill_interval
    next_random = t0 + rng.expovariate(1 / interval) if interval > 0 else float("inf")
    pending = b""
    while len(finished) < ns.workers:
        now = time.monotonic()
        if os.getppid() != parent:
            # The test run is gone: stop (the workers die with us).
            return 1
        if now - t0 > ns.deadline:
            for i in sorted(set(range(ns.workers)) - finished):
                with open(logs[i]) as log_file:
                    last = log_file.readlines()[-3:]
                stuck.append(f"worker {i} pid {pids[i]} still running; last log lines {last!r}")
                os.kill(pids[i], signal.SIGKILL)
                os.waitpid(pids[i], 0)
            break
        timeout = min(1.0, max(0.0, next_random - now), max(0.0, t0 + ns.deadline - now))
        ready, _, _ = select.select([kill_r, wake_r], [], [], timeout)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        if kill_r in ready:
            with contextlib.suppress(BlockingIOError):
                while True:
                    chunk = os.read(kill_r, 65536)
                    if not chunk:
                        break
                    pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                wid, inc, _seq = (int(x) for x in line.split())
                if wid not in finished and incarnation.get(wid) == inc:
                    kill(wid, True)
        if time.monotonic() >= next_random:
            live = [i for i in range(ns.workers) if i not in finished]
            if live:
                kill(rng.choice(live), False)
            next_random = time.monotonic() + rng.expovariate(1 / interval)
        for i in range(ns.workers):
            if i in finished:
                continue
            pid = pids[i]
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == 0:
                continue
            if (
                os.WIFSIGNALED(status)
                and os.WTERMSIG(status) == signal.SIGKILL
                and incarnation[i] in killed_at
            ):
                spawn(i)
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                finished.add(i)
            else:
                with open(logs[i] + ".err", errors="replace") as err_file:
                    err = err_file.read()[-3000:]
                failures.append(f"worker {i} pid {pid} wait status {status}: {err}")
                finished.add(i)
    elapsed = time.monotonic() - t0
    with open(os.path.join(d, "conductor.json"), "w") as out:
        json.dump(
            {
                "elapsed": elapsed,
                "killed_at": {str(k): v for k, v in killed_at.items()},
                "requested": requested,
                "spawned_at": {str(k): v for k, v in spawned_at.items()},
                "failures": failures,
                "stuck": stuck,
            },
            out,
        )
    return 0


# ---------------------------------------------------------------- the test side


@dataclasses.dataclass
class ChaosResult:
    workers: int
    sections_per_worker: int
    completed: int = 0
    entries: int = 0
    overlaps: list[str] = dataclasses.field(default_factory=list)
    bad_entries: list[str] = dataclasses.field(default_factory=list)
    diagnostics: list[str] = dataclasses.field(default_factory=list)
    requested_kills: int = 0
    random_kills: int = 0
    holder_kills: int = 0
    latencies_ns: list[int] = dataclasses.field(default_factory=list)
    kills_without_successor: int = 0
    kills_without_waiter: int = 0
    retries: int = 0
    modes: dict[str, int] = dataclasses.field(default_factory=dict)
    elapsed_s: float = 0.0
    stuck: list[str] = dataclasses.field(default_factory=list)
    worker_failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.overlaps + self.bad_entries + self.stuck + self.worker_failures

    def latency_summary(self) -> dict[str, float]:
        lat = sorted(self.latencies_ns)
        if not lat:
            return {}

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6, 3)

        return {
            "n": len(lat),
            "min_ms": round(lat[0] / 1e6, 3),
            "p50_ms": q(0.50),
            "p90_ms": q(0.90),
            "p99_ms": q(0.99),
            "max_ms": round(lat[-1] / 1e6, 3),
        }

    def histogram(self) -> list[tuple[str, int]]:
        bounds = [0.5, 1, 2, 5, 10, 20, 50, 100]
        counts = [0] * (len(bounds) + 1)
        for v in self.latencies_ns:
            ms = v / 1e6
            for i, b in enumerate(bounds):
                if ms <= b:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
        labels = [f"<={b}ms" for b in bounds] + [f">{bounds[-1]}ms"]
        return list(zip(labels, counts))

    def report(self) -> str:
        lines = [
            f"chaos: {self.workers} workers x {self.sections_per_worker} sections "
            f"in {self.elapsed_s:.1f}s: {self.completed} completed, {self.entries} entries",
            f"  kills: {self.requested_kills} holders on request + {self.random_kills} random; "
            f"{self.holder_kills} killed while holding; overlaps: {len(self.overlaps)}; "
            f"bad entries: {len(self.bad_entries)}; stuck: {len(self.stuck)}; "
            f"failed workers: {len(self.worker_failures)}",
            f"  retries after timeout/refusal/cancel: {self.retries}; modes: {self.modes}",
            f"  kill -> next holder: {self.latency_summary()}",
            "  histogram: " + ", ".join(f"{k}: {v}" for k, v in self.histogram() if v),
        ]
        if self.kills_without_successor or self.kills_without_waiter:
            lines.append(
                f"  holder kills with no later entry: {self.kills_without_successor}; "
                f"with nobody waiting (next holder started after the kill): "
                f"{self.kills_without_waiter}"
            )
        return "\n".join(lines)


def run_chaos(
    directory: str,
    *,
    workers: int = 8,
    sections: int = 2000,
    kill_p: float = 0.05,
    random_kill_interval: float = 0.25,
    unlink_p: float = 0.0,
    impl: str = "pylock",
    modes: Sequence[str] = ALL_MODES,
    seed: str = "1",
    deadline_s: float = 600.0,
    python: str | None = None,
) -> ChaosResult:
    """Run the chaos scenario in directory (a conductor process) and analyse its logs."""
    from tests.support import env_with_repo

    argv = [
        python or sys.executable, "-m", "tests.support.chaos", "conductor",
        "--dir", directory, "--workers", str(workers), "--sections", str(sections),
        "--kill-p", str(kill_p), "--random-kill-interval", str(random_kill_interval),
        "--unlink-p", str(unlink_p), "--impl", impl, "--modes", ",".join(modes),
        "--seed", seed, "--deadline", str(deadline_s),
    ]  # fmt: skip
    proc = subprocess.run(
        argv,
        env=env_with_repo(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=deadline_s + 120,
    )
    if proc.returncode != 0:
        raise AssertionError(f"chaos conductor failed ({proc.returncode}):\n{proc.stderr}")
    with open(os.path.join(directory, "conductor.json")) as f:
        info = json.load(f)
    result = ChaosResult(workers=workers, sections_per_worker=sections)
    result.elapsed_s = info["elapsed"]
    result.stuck = info["stuck"]
    result.worker_failures = info["failures"]
    killed_at = {int(k): v for k, v in info["killed_at"].items()}
    spawned_at = {int(k): v for k, v in info["spawned_at"].items()}
    requested = set(info["requested"])
    result.requested_kills = len(requested)
    result.random_kills = len(killed_at) - len(requested)
    logs = [os.path.join(directory, f"worker{i}.log") for i in range(workers)]
    _analyse(result, logs, killed_at, requested, spawned_at)
    return result


def _analyse(
    result: ChaosResult,
    logs: Sequence[str],
    killed_at: dict[int, int],
    requested: set[int],
    spawned_at: dict[int, int],
) -> None:
    entries: list[tuple[int, int, str, str]] = []  # (t_enter, incarnation, token, prev)
    for i, lp in enumerate(logs):
        with open(lp) as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == "E":
                    seq, inc, t, prev, mode = parts[1], int(parts[2]), int(parts[3]), *parts[4:6]
                    entries.append((t, inc, f"{i}:{inc}:{seq}", prev))
                    result.retries += int(parts[6])
                    result.modes[mode] = result.modes.get(mode, 0) + 1
                elif parts[0] == "X":
                    result.completed += 1
                    if parts[3] != "ok":
                        result.overlaps.append(f"worker {i}: {line.strip()}")
                elif parts[0] == "D":
                    result.diagnostics.append(f"worker {i}: {line.strip()}")
    entries.sort()
    result.entries = len(entries)
    first_seen: dict[str, int] = {}  # a killed holder's token -> the entry that found it
    for n, (_t, _inc, token, prev) in enumerate(entries):
        if prev == "FREE":
            continue
        prev_inc = int(prev.split(":")[1])
        if prev_inc not in killed_at:
            # Only a holder that was killed can leave its token behind.
            result.bad_entries.append(f"{token} entered while {prev} was inside")
        else:
            first_seen.setdefault(prev, n)
    for prev, n in first_seen.items():
        prev_inc = int(prev.split(":")[1])
        t_next, next_inc, next_token = entries[n][0], entries[n][1], entries[n][2]
        t_kill = killed_at[prev_inc]
        result.holder_kills += 1
        if t_next < t_kill:
            result.bad_entries.append(f"{next_token} entered before {prev} was killed")
        elif spawned_at.get(next_inc, 0) > t_kill:
            # Nobody was waiting: the next holder is a process started after
            # the kill, so the gap measures a restart, not a hand-over.
            result.kills_without_waiter += 1
        else:
            result.latencies_ns.append(t_next - t_kill)
    killed_holders = {int(tok.split(":")[1]) for tok in first_seen}
    result.kills_without_successor = len(requested - killed_holders)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "conductor":
        return conductor_main(args[1:])
    p = argparse.ArgumentParser(prog="python -m tests.support.chaos")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sections", type=int, default=2000)
    p.add_argument("--unlink-p", type=float, default=0.0)
    p.add_argument("--impl", default="pylock")
    p.add_argument("--dir", default=None)
    ns = p.parse_args(args)
    import tempfile

    with tempfile.TemporaryDirectory(dir=ns.dir) as d:
        r = run_chaos(
            d, workers=ns.workers, sections=ns.sections, unlink_p=ns.unlink_p, impl=ns.impl
        )
    print(r.report())
    for line in r.problems[:20]:
        print("  ", line[-600:])
    return 1 if r.problems else 0


if __name__ == "__main__":
    sys.exit(main())
