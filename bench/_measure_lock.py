"""The lock measurements: uncontended, handoff and takeover, contention."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Callable

from _common import (
    BenchError,
    Context,
    Row,
    Worker,
    guarded,
    now,
    progress,
    sleep_uniform,
)

UNCONTENDED_LIBS = ("pylock", "pylock-core", "filelock", "fasteners", "portalocker", "floor")
HANDOFF_LIBS = (
    "pylock",
    "pylock-async",
    "filelock",
    "filelock-async",
    "fasteners",
    "portalocker",
    "floor",
    "floor-async",
)


# The C floors: (row, floor.c mode).  The rename-safe one does what pylock
# must (flock, statx of the path, record pwrite, unlock); the bare one is
# the least any lock that writes a record can do.
C_FLOORS = (("floor-c-safe", "uncontended-safe"), ("floor-c", "uncontended"))


def measure_uncontended(
    ctx: Context,
    libs: tuple[str, ...] = UNCONTENDED_LIBS,
    floors: tuple[tuple[str, str], ...] = C_FLOORS,
) -> dict[str, Row]:
    """Acquire+release pairs, each timed alone.  Every round runs every
    library and both C floors once, in a shuffled order, so a burst of load
    from the rest of the machine falls on all of them alike."""
    rows = {lib: Row(lib) for lib in (*libs, *(row for row, _ in floors))}
    workers: dict[str, Worker] = {}
    for lib in libs:
        path = os.path.join(ctx.tmp, f"uncontended-{lib}.lock")
        guarded(
            rows[lib],
            lambda lib=lib, path=path: workers.__setitem__(
                lib, Worker(f"uncontended {lib}", ["uncontended", lib, path, ctx.record_path])
            ),
        )
    per_round = ctx.sizes.uncontended // ctx.sizes.rounds
    per_round_c = ctx.sizes.uncontended_c // ctx.sizes.rounds
    for w in workers.values():
        guarded(rows[w.name.split()[1]], lambda w=w: w.ask("run 500"))  # warm-up

    def python_round(lib: str) -> None:
        rows[lib].samples.extend(json.loads(" ".join(workers[lib].ask(f"run {per_round}", 300))))

    def c_round(row: str, mode: str) -> None:
        path = os.path.join(ctx.tmp, f"uncontended-{row}.lock")
        argv = [ctx.floor, mode, path, ctx.record_path, str(per_round_c)]
        res = subprocess.run(argv, capture_output=True, text=True, check=True)
        rows[row].samples.extend(float(x) for x in res.stdout.split())

    jobs: dict[str, Callable[[], None]] = {
        lib: (lambda lib=lib: python_round(lib)) for lib in workers
    }
    for row, mode in floors:
        jobs[row] = lambda row=row, mode=mode: c_round(row, mode)
    for i in range(ctx.sizes.rounds):
        order = [k for k in jobs if rows[k].error is None]
        ctx.rng.shuffle(order)
        for k in order:
            guarded(rows[k], jobs[k])
        progress("uncontended", i + 1, ctx.sizes.rounds)
    for w in workers.values():
        w.close()
    return rows


def measure_handoff(
    ctx: Context, kill: bool, libs: tuple[str, ...] = HANDOFF_LIBS
) -> dict[str, Row]:
    """Release (or SIGKILL of the holder) -> a blocked waiter in another
    process returns from acquire.  Trials go round-robin over the libraries,
    so noise from the rest of the machine falls on all of them alike."""
    what = "takeover" if kill else "handoff"
    trials = ctx.sizes.takeover if kill else ctx.sizes.handoff
    rows = {lib: Row(lib) for lib in libs}
    pairs: dict[str, tuple[Worker, Worker]] = {}
    import _libs

    for lib in libs:
        path = os.path.join(ctx.tmp, f"{what}-{lib}.lock")

        def start(lib: str = lib, path: str = path) -> None:
            holder = Worker(
                f"{what} holder {lib}", ["holder", _libs.holder_lib(lib), path, ctx.record_path]
            )
            try:
                waiter = Worker(f"{what} waiter {lib}", ["waiter", lib, path, ctx.record_path])
            except BaseException:
                holder.kill()
                raise
            pairs[lib] = (holder, waiter)

        guarded(rows[lib], start)

    def trial(lib: str) -> None:
        holder, waiter = pairs[lib]
        if kill:
            words = holder.ask("fork")
            if words[0] != "held":
                raise BenchError(f"{holder.name}: {words!r}")
            victim = int(words[1])
        else:
            holder.ask("acquire")
        if waiter.ask("wait") != ["ready"]:
            raise BenchError(f"{waiter.name}: not ready")
        sleep_uniform(ctx.rng, ctx.sizes.block_ms)
        if kill:
            t0 = now()
            os.kill(victim, signal.SIGKILL)
        else:
            holder.send("release")
        t1 = int(waiter.recv(60)[0])
        if kill:
            holder.ask(f"reap {victim}")
        else:
            t0 = int(holder.recv()[0])
        if t1 < t0:
            raise BenchError(f"{lib}: the waiter got the lock before the holder let go")
        rows[lib].samples.append(float(t1 - t0))

    for i in range(trials):
        order = [lib for lib in libs if lib in pairs and rows[lib].error is None]
        ctx.rng.shuffle(order)
        for lib in order:
            guarded(rows[lib], lambda lib=lib: trial(lib))
        progress(what, i + 1, trials)
    for holder, waiter in pairs.values():
        waiter.kill()
        holder.close()
    return rows


# pylock.filelock's FileLock beside the lock it stands on and the one it replaces.
FRONT_LIBS = ("pylock-filelock", "pylock", "filelock")


def measure_front(ctx: Context) -> dict[str, Row]:
    """The filelock front's uncontended pair and hand-over, measured as the
    sections above measure them, in rows of its own."""
    rows = {f"uncontended:{k}": r for k, r in measure_uncontended(ctx, FRONT_LIBS, ()).items()}
    rows.update((f"handoff:{k}", r) for k, r in measure_handoff(ctx, False, FRONT_LIBS).items())
    return rows


CONTENTION = {
    "procs": ("pylock", "filelock", "fasteners", "floor"),
    "tasks": ("pylock-async", "filelock-async", "fasteners-thread", "floor-async"),
}


def measure_contention(ctx: Context) -> dict[str, Row]:
    """N processes (or 64 tasks in one process) hammering one lock for a
    fixed time: critical sections per second, and proof of exclusion."""
    rows: dict[str, Row] = {}
    configs = [("procs", 2), ("procs", 8), ("procs", 32), ("tasks", 64)]
    for kind, n in configs:
        for lib in CONTENTION[kind]:
            key = f"{lib} {n} {'processes' if kind == 'procs' else 'asyncio tasks'}"
            row = rows[key] = Row(lib, extra={"kind": kind, "n": n})
            if ctx.pylock_error and lib.startswith("pylock"):
                row.error = ctx.pylock_error
                continue
            guarded(row, lambda kind=kind, n=n, lib=lib, row=row: contend(ctx, kind, n, lib, row))
        progress("contention", configs.index((kind, n)) + 1, len(configs))
    return rows


def contend(ctx: Context, kind: str, n: int, lib: str, row: Row) -> None:
    path = os.path.join(ctx.tmp, f"contend-{lib}-{kind}-{n}.lock")
    shm = f"/dev/shm/pylock-bench-{os.getpid()}"
    with open(shm, "wb") as f:
        f.write(bytes(16))
    workers: list[Worker] = []
    try:
        procs, tasks = (n, 0) if kind == "procs" else (1, n)
        for i in range(procs):
            workers.append(
                Worker(
                    f"contend {lib} {i}",
                    ["contend", lib, path, ctx.record_path, shm, str(tasks)],
                    greet=False,
                )
            )
        for w in workers:
            w.greeting()
        start = now() + 200_000_000
        end = start + int(ctx.sizes.contention_s * 1e9)
        for w in workers:
            w.send(f"go {start} {end}")
        total = violations = 0
        for w in workers:
            words = w.recv(ctx.sizes.contention_s + 120)
            total += int(words[1])
            violations += int(words[2])
        with open(shm, "rb") as f:
            counter = int.from_bytes(f.read(8), sys.byteorder)
        row.samples = [total / ctx.sizes.contention_s]
        row.extra.update(total=total, violations=violations, lost=total - counter)
    finally:
        for w in workers:
            w.close()
        os.unlink(shm)
