"""Many waiting tasks: N asyncio tasks of one process, each waiting for its
own lock, all held by one other process that is then killed.

For each library and N: the waiting process's thread count (beyond what it
had before the tasks), its RSS growth per waiting task, the CPU it uses
while everything waits (percent of one core), and the time from the
holder's SIGKILL until the last task holds its lock.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile

from _common import Context, Row, Worker, guarded, now

LIBS = ("pylock-async", "filelock-async", "floor-async")


def measure_waiters(ctx: Context) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for n in ctx.sizes.waiters:
        for _ in range(ctx.sizes.waiter_rounds):
            for lib in LIBS:
                row = rows.setdefault(f"{lib} {n}", Row(lib))
                guarded(row, lambda lib=lib, row=row, n=n: _trial(ctx, lib, n, row))
    return rows


def _trial(ctx: Context, lib: str, n: int, row: Row) -> None:
    directory = tempfile.mkdtemp(prefix=f"waiters-{lib}-", dir=ctx.tmp)
    holder = Worker(f"holder {n}", ["many_holder", directory, str(n)])
    waiter = None
    try:
        waiter = Worker(
            f"{lib} {n} waiters",
            ["many_waiters", lib, directory, str(n), ctx.record_path, str(ctx.sizes.idle_s)],
        )
        waiter.send("wait")
        words = waiter.recv(timeout=120.0)
        if words[0] != "waiting":
            raise RuntimeError(f"unexpected {words!r}")
        threads, rss, cpu = int(words[1]), int(words[2]), float(words[3])
        t0 = now()
        os.kill(holder.pid, signal.SIGKILL)
        words = waiter.recv(timeout=120.0)
        if words[0] != "done":
            raise RuntimeError(f"unexpected {words!r}")
        row.samples.append(int(words[1]) - t0)
        for name, value in (("threads", threads), ("rss", rss), ("cpu", cpu)):
            row.extra.setdefault(name, []).append(value)
        print(
            f"  {lib} N={n}: {threads} threads, {rss} B/waiter, {cpu:.2f}% idle CPU, "
            f"all hold after {(int(words[1]) - t0) / 1e6:.1f} ms",
            file=sys.stderr,
        )
    finally:
        if waiter is not None:
            waiter.close()
        holder.kill()
