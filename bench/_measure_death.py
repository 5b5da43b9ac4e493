"""The death-notification measurements: one process watched, and 10,000 at once."""

from __future__ import annotations

import os
import signal
import sys
import time

from _common import (
    BenchError,
    Context,
    Row,
    Spawner,
    Worker,
    guarded,
    now,
    progress,
    sleep_uniform,
)

DEATH_ONE = ("pylock", "pylock-lock", "pidfd-await", "psutil", "fallback", "fallback-lock")
DEATH_MANY = ("pylock", "pylock-many", "pidfd", "psutil", "fallback", "fallback-many")


def watcher_argv(variant: str) -> tuple[list[str], list[str]]:
    """(launcher prefix, worker argv) for a death-notification variant."""
    lib = {"pylock-lock": "pylock", "fallback": "pylock", "fallback-lock": "pylock"}.get(
        variant, variant
    )
    if variant == "fallback-many":
        lib = "pylock-many"
    prefix: list[str] = []
    if variant.startswith("fallback"):
        prefix = [sys.executable, "-m", "tests.support.seccomp", "--"]
    return prefix, ["watcher", lib]


def measure_death_one(ctx: Context) -> dict[str, Row]:
    """SIGKILL of a watched process that is not the watcher's child ->
    the watcher's await returns.  The ``-lock`` variants watch the holder of
    a pylock lock through ``holder_exit(Lock)``; ``fallback`` runs pylock
    under a seccomp filter that makes pidfd_open fail with ENOSYS."""
    rows = {v: Row(v) for v in DEATH_ONE}
    if ctx.pylock_error:
        for v in DEATH_ONE:
            if v not in ("pidfd-await", "psutil"):
                rows[v].error = ctx.pylock_error
    watchers: dict[str, Worker] = {}
    holders: dict[str, Worker] = {}
    for v in DEATH_ONE:
        if rows[v].error:
            continue

        def start(v: str = v) -> None:
            prefix, argv = watcher_argv(v)
            watchers[v] = Worker(f"death watcher {v}", argv, prefix)
            if v.endswith("-lock"):
                path = os.path.join(ctx.tmp, f"death-{v}.lock")
                holders[v] = Worker(
                    f"death holder {v}", ["holder", "pylock", path, ctx.record_path]
                )

        guarded(rows[v], start)
    spawner = Spawner(ctx.floor)

    def trial(v: str) -> None:
        w = watchers[v]
        if v.endswith("-lock"):
            words = holders[v].ask("fork")
            victim = int(words[1])
            words = w.ask(f"watchlock {os.path.join(ctx.tmp, f'death-{v}.lock')} {victim}")
        else:
            victim = spawner.spawn(1)[0]
            words = w.ask(f"watch {victim}")
        if words[0] != "watching":
            raise BenchError(f"{w.name}: {words!r}")
        sleep_uniform(ctx.rng, ctx.sizes.death_block_ms)
        t0 = now()
        os.kill(victim, signal.SIGKILL)
        words = w.recv(60)
        if words[:2] != ["exit", str(victim)]:
            raise BenchError(f"{w.name}: expected the exit of {victim}, got {words!r}")
        if v.endswith("-lock"):
            holders[v].ask(f"reap {victim}")
        rows[v].samples.append(float(int(words[2]) - t0))

    try:
        for i in range(ctx.sizes.death):
            order = [v for v in DEATH_ONE if v in watchers and rows[v].error is None]
            ctx.rng.shuffle(order)
            for v in order:
                guarded(rows[v], lambda v=v: trial(v))
            progress("death notification, 1 watched", i + 1, ctx.sizes.death)
    finally:
        for w in watchers.values():
            w.kill()
        for h in holders.values():
            h.close()
        spawner.close()
    return rows


def task_cpu(pid: int) -> tuple[int, int]:
    """(CPU ns, context switches) of every thread of pid, from /proc."""
    cpu = switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return cpu, switches


def measure_death_many(ctx: Context) -> dict[str, Row]:
    """``many`` processes watched at once by one process: memory per watch,
    CPU and wakeups while nothing exits, and the latency of single exits.
    One pool of sleepers serves every watcher; the killed ones are replaced."""
    rows = {v: Row(v) for v in DEATH_MANY}
    n = ctx.sizes.many
    spawner = Spawner(ctx.floor)
    try:
        pool = spawner.spawn(n)
        for v in DEATH_MANY:
            row = rows[v]
            row.extra["n"] = n
            if ctx.pylock_error and v not in ("pidfd", "psutil"):
                row.error = ctx.pylock_error
                continue
            watcher: list[Worker] = []
            try:
                guarded(
                    row,
                    lambda v=v, row=row, pool=pool, watcher=watcher: watch_many(
                        ctx, v, row, pool, watcher
                    ),
                )
            finally:
                for w in watcher:
                    w.kill()
            pool = [pid for pid in pool if pid not in row.extra.get("killed", ())]
            pool += spawner.spawn(n - len(pool))
            progress(f"death notification, {n} watched", DEATH_MANY.index(v) + 1, len(DEATH_MANY))
    finally:
        spawner.close()
    return rows


def watch_many(ctx: Context, v: str, row: Row, pids: list[int], holder: list[Worker]) -> None:
    n = len(pids)
    prefix, argv = watcher_argv(v)
    watcher = Worker(f"death watcher {v} x{n}", argv, prefix)
    holder.append(watcher)
    # A first tenth warms up everything a first watch builds once (code
    # paths, caches, the selector's tables); memory is measured on the rest.
    first, rest = pids[: n // 10], pids[n // 10 :]
    t_reg = now()
    words = watcher.ask("add " + " ".join(map(str, first)), 300)
    if words[0] != "watching":
        raise BenchError(f"{watcher.name}: {words!r}")
    words = watcher.ask("watch " + " ".join(map(str, rest)), 300)
    if words[0] != "watching":
        raise BenchError(f"{watcher.name}: {words!r}")
    row.extra["register_s"] = (now() - t_reg) / 1e9
    row.extra["bytes_per_watch"] = (int(words[2]) - int(words[1])) * 1024 / len(rest)
    # Let the watcher finish answering and block again, so the window holds
    # only what it does while idle.
    time.sleep(0.2)
    cpu0, sw0 = task_cpu(watcher.pid)
    time.sleep(ctx.sizes.idle_s)
    cpu1, sw1 = task_cpu(watcher.pid)
    row.extra["idle_cpu_pct"] = (cpu1 - cpu0) / 1e9 / ctx.sizes.idle_s * 100
    row.extra["idle_wakeups_s"] = (sw1 - sw0) / ctx.sizes.idle_s
    killed = row.extra["killed"] = []
    for victim in ctx.rng.sample(pids, ctx.sizes.many_kills):
        sleep_uniform(ctx.rng, ctx.sizes.death_block_ms)
        t0 = now()
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)
        words = watcher.recv(120)
        if words[:2] != ["exit", str(victim)]:
            raise BenchError(f"{watcher.name}: expected the exit of {victim}, got {words!r}")
        row.samples.append(float(int(words[2]) - t0))
