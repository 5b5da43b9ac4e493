"""Benchmark pylock against the locks people use today and against the floor.

    python bench/run.py            # full run, ~10 minutes on 2 cores
    python bench/run.py --quick    # smaller sizes, ~2 minutes

Installs the pinned ``bench`` dependency group of pyproject.toml into the
running interpreter, compiles bench/floor.c with the system cc, runs every
measurement side by side in this one run and writes bench/report.md and
bench/latency.png (and, for a full run into bench/, refreshes the figures
in bench/README.md).  Every table is printed as well.  See bench/README.md
for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import select
import shutil
import signal
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
sys.path.insert(0, BENCH)

import _report  # noqa: E402


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
    imports: int
    block_ms: tuple[float, float]  # a waiter is blocked uniformly this long
    death_block_ms: tuple[float, float]


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
    imports=30,
    # Spans a whole poll period of the slowest peer (portalocker: 250 ms), so
    # the release falls at a uniformly random phase of every poll schedule.
    block_ms=(20.0, 270.0),
    death_block_ms=(10.0, 110.0),
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
    imports=8,
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


# -- set-up -------------------------------------------------------------------


def bench_group() -> list[str]:
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["dependency-groups"]["bench"])


def install_group() -> None:
    specs = bench_group()
    print(f"installing the bench group into {sys.executable}: {' '.join(specs)}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs],
        check=True,
    )


def build_floor(tmp: str) -> tuple[str, str]:
    """Compile floor.c; returns (executable, how it was linked).

    Static when the C library allows: the 10,000 sleepers then share only a
    few pages of floor's own text.  Dynamically linked, they share the pages
    of libc and ld.so 10,000 ways, and a memory monitor walking those pages'
    mappings (DAMON's pageout on this VM) holds up exits for milliseconds.
    """
    cc = os.environ.get("CC", "cc")
    exe = os.path.join(tmp, "floor")
    base = [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-o", exe, os.path.join(BENCH, "floor.c")]
    static = subprocess.run([*base, "-static"], capture_output=True, text=True)
    if static.returncode == 0:
        return exe, "static"
    try:
        subprocess.run(base, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BenchError(f"cannot compile bench/floor.c with {cc!r}: {exc}") from exc
    return exe, "dynamic (no static C library: the sleepers share libc's pages)"


def python_ok(code: str) -> str | None:
    """None when code runs in a worker's environment, else its error."""
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=worker_env(), capture_output=True, text=True
    )
    if res.returncode == 0:
        return None
    return (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]


def ensure_pylock() -> str | None:
    """Build pylock's C core in place when the checkout has none yet."""
    if python_ok("import pylock._native") is not None:
        print("building pylock's C core in place (csrc/_ffi_build.py)", flush=True)
        res = subprocess.run(
            [sys.executable, os.path.join("csrc", "_ffi_build.py")],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            return f"building the C core failed: {res.stderr.strip()[-500:]}"
    return python_ok("import pylock; pylock.Lock")


def pylock_record(tmp: str, usable: bool) -> bytes:
    """The bytes pylock writes as its holder record, for the floors to write."""
    if usable:
        path = os.path.join(tmp, "record-probe.lock")
        code = (
            "import sys, pylock\n"
            f"lock = pylock.Lock({path!r})\n"
            "lock.acquire()\n"
            f"sys.stdout.buffer.write(open({path!r}, 'rb').read())\n"
            "lock.release()\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", code, "worker", "holder", "pylock"],
            cwd=REPO,
            env=worker_env(),
            capture_output=True,
        )
        if res.returncode == 0 and res.stdout:
            return res.stdout
    # Same shape and about the same size as pylock's record.
    body = json.dumps(
        {
            "pid": 4242,
            "start_time": 123456,
            "boot_id": "0" * 36,
            "pidfs_ino": 0,
            "hostname": platform.node(),
            "program": sys.executable,
            "argv": [sys.executable, WORKER, "holder", "pylock"],
            "acquired_at": "2026-11-29T17:02:11.123456Z",
            "info": None,
        }
    ).encode()
    return b"pylock-record v1 %d %08x\n" % (len(body), 0) + body


def filesystem_of(path: str) -> str:
    """The type of the mount holding path, from /proc/self/mounts."""
    best, kind = "", "unknown"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


def describe_machine(tmp: str) -> dict[str, str]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1048576:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    fs = filesystem_of(tmp)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    # Only changes to what is measured matter (the report itself is in bench/).
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", "pylock", "csrc"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if commit and changed:
        commit += " with uncommitted changes to pylock/ or csrc/"
    versions = {}
    for name in ("filelock", "fasteners", "portalocker", "psutil", "matplotlib"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = "missing"
    return {
        "CPU": model,
        "cores": f"{os.cpu_count()} online, {len(os.sched_getaffinity(0))} usable by this run",
        "memory": mem,
        "kernel": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "libc": " ".join(platform.libc_ver()),
        "Python": (
            f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"
        ),
        "lock files on": f"{tmp} ({fs})",
        "pylock": f"checkout {commit or 'unknown'}",
        "peers": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# -- measurements -------------------------------------------------------------

UNCONTENDED_LIBS = ("pylock", "filelock", "fasteners", "portalocker", "floor")
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


def measure_uncontended(ctx: Context) -> dict[str, Row]:
    rows = {lib: Row(lib) for lib in (*UNCONTENDED_LIBS, "floor-c")}
    workers: dict[str, Worker] = {}
    for lib in UNCONTENDED_LIBS:
        path = os.path.join(ctx.tmp, f"uncontended-{lib}.lock")
        guarded(
            rows[lib],
            lambda lib=lib, path=path: workers.__setitem__(
                lib, Worker(f"uncontended {lib}", ["uncontended", lib, path, ctx.record_path])
            ),
        )
    per_round = ctx.sizes.uncontended // ctx.sizes.rounds
    for w in workers.values():
        guarded(rows[w.name.split()[1]], lambda w=w: w.ask("run 500"))  # warm-up
    for _ in range(ctx.sizes.rounds):
        order = [lib for lib in UNCONTENDED_LIBS if lib in workers and rows[lib].error is None]
        ctx.rng.shuffle(order)
        for lib in order:
            guarded(
                rows[lib],
                lambda lib=lib: rows[lib].samples.extend(
                    json.loads(" ".join(workers[lib].ask(f"run {per_round}", 300)))
                ),
            )

    def c_floor() -> None:
        res = subprocess.run(
            [
                ctx.floor,
                "uncontended",
                os.path.join(ctx.tmp, "uncontended-floor-c.lock"),
                ctx.record_path,
                str(ctx.sizes.uncontended_c),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows["floor-c"].samples = [float(x) for x in res.stdout.split()]

    guarded(rows["floor-c"], c_floor)
    for w in workers.values():
        w.close()
    return rows


def measure_handoff(ctx: Context, kill: bool) -> dict[str, Row]:
    """Release (or SIGKILL of the holder) -> a blocked waiter in another
    process returns from acquire.  Trials go round-robin over the libraries,
    so noise from the rest of the machine falls on all of them alike."""
    what = "takeover" if kill else "handoff"
    trials = ctx.sizes.takeover if kill else ctx.sizes.handoff
    rows = {lib: Row(lib) for lib in HANDOFF_LIBS}
    pairs: dict[str, tuple[Worker, Worker]] = {}
    import _libs

    for lib in HANDOFF_LIBS:
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
        order = [lib for lib in HANDOFF_LIBS if lib in pairs and rows[lib].error is None]
        ctx.rng.shuffle(order)
        for lib in order:
            guarded(rows[lib], lambda lib=lib: trial(lib))
        progress(what, i + 1, trials)
    for holder, waiter in pairs.values():
        waiter.kill()
        holder.close()
    return rows


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


def measure_imports(ctx: Context) -> dict[str, Row]:
    rows = {m: Row(m) for m in ("pylock", "filelock")}
    if ctx.pylock_error:
        rows["pylock"].error = ctx.pylock_error
    mods = [m for m in rows if rows[m].error is None]

    def once(mod: str) -> float:
        code = (
            "import time; t = time.perf_counter_ns(); import "
            + mod
            + "; print(time.perf_counter_ns() - t)"
        )
        res = subprocess.run(
            [sys.executable, "-c", code],
            cwd=BENCH,
            env=worker_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        return float(res.stdout)

    for mod in mods:
        guarded(rows[mod], lambda mod=mod: once(mod))  # compile and cache
    for _ in range(ctx.sizes.imports):
        for mod in mods:
            guarded(rows[mod], lambda mod=mod: rows[mod].samples.append(once(mod)))
    return rows


# -- driver -------------------------------------------------------------------


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


SECTIONS = ("uncontended", "handoff", "takeover", "death", "contention", "imports")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (~2 minutes)")
    ap.add_argument("--no-install", action="store_true", help="do not pip install the bench group")
    ap.add_argument("--out", default=BENCH, help="where report.md and latency.png go (bench/)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    ap.add_argument("--seed", type=int, default=None, help="seed for the randomised waits")
    ap.add_argument("--raw", default=None, help="also write every sample to this JSON file")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if sys.version_info < (3, 11) or not sys.platform.startswith("linux"):
        print(
            "bench/run.py needs Linux and Python 3.11+ (the pinned matplotlib and filelock"
            " need 3.11; pidfd and the seccomp fallback are Linux)",
            file=sys.stderr,
        )
        return 2
    if not args.no_install:
        install_group()

    sizes = QUICK if args.quick else FULL
    tmp = tempfile.mkdtemp(prefix="pylock-bench-")
    started = time.monotonic()
    try:
        floor, floor_linking = build_floor(tmp)
        pylock_error = ensure_pylock()
        if pylock_error:
            print(f"pylock is not usable, its rows will say so: {pylock_error}", file=sys.stderr)
        record = pylock_record(tmp, pylock_error is None)
        record_path = os.path.join(tmp, "record")
        with open(record_path, "wb") as f:
            f.write(record)
        ctx = Context(
            sizes=sizes,
            tmp=tmp,
            floor=floor,
            record_path=record_path,
            record_len=len(record),
            rng=random.Random(args.seed),
            pylock_error=pylock_error,
        )
        machine = describe_machine(tmp)
        machine["floor.c"] = f"{os.environ.get('CC', 'cc')} -O2, linked {floor_linking}"
        results: Results = {}
        measures: dict[str, Callable[[], dict[str, Row]]] = {
            "uncontended": lambda: measure_uncontended(ctx),
            "handoff": lambda: measure_handoff(ctx, kill=False),
            "takeover": lambda: measure_handoff(ctx, kill=True),
            "death": lambda: {
                **{f"one:{k}": r for k, r in measure_death_one(ctx).items()},
                **{f"many:{k}": r for k, r in measure_death_many(ctx).items()},
            },
            "contention": lambda: measure_contention(ctx),
            "imports": lambda: measure_imports(ctx),
        }
        for name in SECTIONS:
            if name in only:
                print(f"== {name}", file=sys.stderr, flush=True)
                t = time.monotonic()
                results[name] = measures[name]()
                print(f"   ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True)
        machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        machine["run time"] = f"{time.monotonic() - started:.0f} s"
        cmd = "python bench/run.py" + (" --quick" if args.quick else "")
        report = _report.render(results, machine, sizes, ctx.record_len, cmd)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.md"), "w") as f:
            f.write(report.markdown)
        _report.plot(results, os.path.join(args.out, "latency.png"), cmd)
        if not args.quick and os.path.abspath(args.out) == BENCH and set(only) == set(SECTIONS):
            _report.update_readme(os.path.join(BENCH, "README.md"), report.markdown)
        if args.raw:
            with open(args.raw, "w") as f:
                json.dump(
                    {
                        s: {
                            k: {"samples": r.samples, "error": r.error, **r.extra}
                            for k, r in rows.items()
                        }
                        for s, rows in results.items()
                    },
                    f,
                )
        print(report.markdown)
        print(f"wrote {os.path.join(args.out, 'report.md')} and latency.png", file=sys.stderr)
        return 1 if report.failed_rows else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
