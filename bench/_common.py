"""What every part of the benchmark shares: sizes, results, worker processes."""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
WORKER = os.path.join(BENCH, "_worker.py")


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass
class Sizes:
    uncontended: int  # acquire+release pairs per Python library
    uncontended_c: int  # the same for the C loop
    rounds: int  # uncontended runs are interleaved in this many rounds
    handoff: int  # trials per waiter
    takeover: int
    death: int  # trials per watcher, one process watched
    many: int  # processes watched at once
    many_kills: int  # exits timed while `many` are watched
    idle_s: float  # idle window for the CPU figure
    contention_s: float
    startup: int  # processes per start-up row
    block_ms: tuple[float, float]  # a waiter is blocked uniformly this long
    death_block_ms: tuple[float, float]
    waiters: tuple[int, ...] = (1000, 4000)  # tasks waiting at once, one lock each
    waiter_rounds: int = 1


FULL = Sizes(
    uncontended=20000,
    uncontended_c=200000,
    rounds=5,
    handoff=100,
    takeover=50,
    death=100,
    many=10000,
    many_kills=30,
    idle_s=2.0,
    contention_s=3.0,
    startup=40,
    # Spans a whole poll period of the slowest peer (portalocker: 250 ms), so
    # the release falls at a uniformly random phase of every poll schedule.
    block_ms=(20.0, 270.0),
    death_block_ms=(10.0, 110.0),
    waiter_rounds=3,
)
QUICK = Sizes(
    uncontended=5000,
    uncontended_c=50000,
    rounds=3,
    handoff=20,
    takeover=10,
    death=20,
    many=1000,
    many_kills=10,
    idle_s=1.0,
    contention_s=1.0,
    startup=10,
    block_ms=(20.0, 270.0),
    death_block_ms=(10.0, 110.0),
)


class BenchError(RuntimeError):
    pass


# -- processes ----------------------------------------------------------------


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class Worker:
    """A bench/_worker.py process spoken to line by line."""

    def __init__(
        self, name: str, argv: Sequence[str], prefix: Sequence[str] = (), greet: bool = True
    ) -> None:
        self.name = name
        # Kept open for the worker's lifetime, read only to explain a failure.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, WORKER, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=REPO,
            env=worker_env(),
        )
        self._buf = b""
        self.pid = 0
        if greet:
            self.greeting()

    def greeting(self) -> None:
        """Wait until the worker is up (separate, so many can start at once)."""
        words = self.recv(60.0)
        if words[0] != "hello":
            raise BenchError(f"{self.name}: unexpected greeting {words!r}")
        self.pid = int(words[1])

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"{self.name}: exited early{self._stderr_tail()}") from None

    def recv(self, timeout: float = 60.0) -> list[str]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(
                    f"{self.name}: no answer within {timeout:.0f} s{self._stderr_tail()}"
                )
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise BenchError(f"{self.name}: exited{self._stderr_tail()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode().split()

    def ask(self, line: str, timeout: float = 60.0) -> list[str]:
        self.send(line)
        return self.recv(timeout)

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return f"; its stderr ends:\n{text[-2000:]}" if text else ""

    def close(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


class Spawner:
    """bench/floor.c's sleeper spawner: cheap processes to be watched and killed."""

    def __init__(self, floor: str) -> None:
        self.proc = subprocess.Popen(
            [floor, "spawner"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def spawn(self, n: int) -> list[int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"spawn {n}\n")
        self.proc.stdin.flush()
        pids = [int(w) for w in self.proc.stdout.readline().split()]
        if len(pids) != n:
            raise BenchError(f"spawner made {len(pids)} of {n} sleepers (pid_max? memory?)")
        return pids

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(120)


def sleep_uniform(rng: random.Random, bounds_ms: tuple[float, float]) -> None:
    time.sleep(rng.uniform(*bounds_ms) / 1000.0)


# -- results ------------------------------------------------------------------


@dataclass
class Row:
    """One library's figures in one measurement."""

    lib: str
    samples: list[float] = field(default_factory=list)  # ns, or ops/s for throughput
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)


Results = dict[str, dict[str, Row]]


def guarded(row: Row, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {exc}".strip()
        print(f"  ! {row.lib}: {row.error}", file=sys.stderr)


@dataclass
class Context:
    sizes: Sizes
    tmp: str
    floor: str
    record_path: str
    record_len: int
    rng: random.Random
    pylock_error: str | None


def progress(what: str, i: int, n: int) -> None:
    if sys.stderr.isatty() or i == n or i % max(1, n // 5) == 0:
        print(f"  {what}: {i}/{n}", file=sys.stderr, flush=True)
