"""Turn bench/run.py's results into Markdown tables and the latency plot."""

from __future__ import annotations

import datetime
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import _targets
from _doc import Doc, fmt_rate, latency_table, median
from _targets import fmt_ns, get, p99

if TYPE_CHECKING:
    from _common import Results, Row, Sizes

LABELS = {
    "pylock": "pylock",
    "pylock-async": "pylock `acquire_async`",
    "filelock": "filelock",
    "filelock-async": "filelock `AsyncFileLock`",
    "pylock-filelock": "`pylock.filelock.FileLock` (filelock's API on pylock)",
    "fasteners": "fasteners",
    "fasteners-thread": "fasteners (acquire in a thread)",
    "portalocker": "portalocker",
    "floor": "floor: `fcntl.flock` + `os.pwrite` (Python)",
    "floor-c": "bare floor: `flock`, `pwrite`, unlock, in C",
    "pylock-core": "pylock's C core through cffi, no `Lock` (`pl_acquire`, `pl_disown`)",
    "floor-c-safe": "rename-safe floor: `flock`, `statx` of the path, `pwrite`, unlock, in C",
    "floor-async": "async floor: that in a thread + `call_soon_threadsafe`",
}
DEATH_LABELS = {
    "pylock": "pylock `holder_exit(pid)`",
    "pylock-lock": "pylock `holder_exit(lock)`",
    "pylock-many": "pylock `ExitWatcher`",
    "pidfd": "bare `loop.add_reader(os.pidfd_open(pid))`",
    "pidfd-await": "bare `await` of a future set by `loop.add_reader(os.pidfd_open(pid))`",
    "psutil": "psutil `Process(pid).wait()`",
    "fallback": "pylock fallback, pidfd blocked: `holder_exit(pid)`",
    "fallback-lock": "pylock fallback, pidfd blocked: `holder_exit(lock)`",
    "fallback-many": "pylock fallback, pidfd blocked: `ExitWatcher`",
}
DEATH_MANY_LABELS = dict(
    DEATH_LABELS,
    pylock="pylock `holder_exit(pid)`, one task each",
    psutil="psutil `wait_procs(procs, callback=...)`",
)


@dataclass
class Report:
    markdown: str
    failed_rows: list[str] = field(default_factory=list)
    summary: str = ""  # the targets table, for the project README


def render(
    results: Results, machine: dict[str, str], sizes: Sizes, record_len: int, cmd: str
) -> Report:
    d = Doc()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    d.add(
        "# pylock benchmarks",
        "",
        f"Made by `{cmd}` on {stamp}. All figures below come from this one run.",
        "",
    )
    d.add("## Machine", "")
    d.table(["", ""], [[k, v.replace("|", "\\|")] for k, v in machine.items()])

    targets = _targets.targets(results)
    summary = Doc()
    summary.add(
        f"From `{cmd}` on {stamp} (cores: {machine.get('cores', '?')}; "
        f"{machine.get('kernel', '?')}, {machine.get('Python', '?').split(' (')[0]}, "
        f"{machine.get('pylock', '?')}; load average {machine.get('load average at start', '?')} "
        "at the start): the targets, each with its figure from that one run.",
        "",
    )
    summary.table(["target", "measured", "met"], targets)
    d.add("## Targets", "")
    d.table(["target", "measured", "met"], targets)
    if any(t[2] == "**no**" for t in targets):
        d.add(
            "Where the time of a missed target goes, from profiles: bench/README.md, "
            '"Where the time goes".',
            "",
        )

    if "uncontended" in results:
        _uncontended(d, results["uncontended"], sizes, record_len)
    for name, title in (
        ("handoff", "Handoff"),
        ("takeover", "Takeover after SIGKILL of the holder"),
    ):
        if name in results:
            _handoff(d, name, title, results[name], sizes)
    if "death" in results:
        _death(d, results["death"], sizes)
    if "contention" in results:
        _contention(d, results["contention"], sizes)
    if "startup" in results:
        _startup(d, results["startup"], sizes)
    if "front" in results:
        _front(d, results["front"], sizes)
    if "waiters" in results:
        _waiters(d, results["waiters"])
    return Report(
        "\n".join(d.lines).rstrip() + "\n", d.failed, "\n".join(summary.lines).rstrip() + "\n"
    )


def _uncontended(d: Doc, rows: dict[str, Row], sizes: Sizes, record_len: int) -> None:
    d.add(
        "## Uncontended acquire + release",
        "",
        "One process, nobody else on the lock: acquire then release, each pair timed alone "
        f"(CLOCK_MONOTONIC around the pair), {sizes.uncontended} pairs per Python library and "
        f"{sizes.uncontended_c} per C floor, in {sizes.rounds} rounds that run every row once "
        f"in a shuffled order. pylock writes its {record_len}-byte holder record on every "
        "acquire and then checks that the path still names the locked file (one `statx`), "
        "which is what keeps waiters from splitting when the file or its directory is renamed "
        "or unlinked under a long-lived `Lock`. The rename-safe floor does exactly those "
        "syscalls in a C loop on an already-open descriptor: `flock(LOCK_EX)`, `statx` of the "
        "path compared with the descriptor's device and inode, `pwrite` of the same bytes, "
        "`flock(LOCK_UN)`; the bare floors leave out the `statx`, in C and from Python "
        "(`fcntl.flock` + `os.pwrite`). The peers do what they do by default (filelock and "
        "portalocker open and close the file each time and write no record; none of them "
        "checks the path).",
        "",
    )
    order = [
        (k, LABELS[k], "pylock", k.startswith("floor") or k == "pylock-core")
        for k in (
            "pylock",
            "pylock-core",
            "floor-c-safe",
            "floor-c",
            "floor",
            "filelock",
            "fasteners",
            "portalocker",
        )
    ]
    latency_table(d, "uncontended", rows, order, with_max=False)


def _front(d: Doc, rows: dict[str, Row], sizes: Sizes) -> None:
    lo, hi = sizes.block_ms
    d.add(
        "## The filelock front: `pylock.filelock.FileLock`",
        "",
        "filelock's API on pylock (`from pylock.filelock import FileLock`), measured as the "
        "uncontended and handoff sections measure, beside the `pylock.Lock` it stands on and "
        "filelock's own `FileLock`, all three in this section's rounds: acquire + release "
        f"pairs timed alone; then a waiter in another process blocked for {lo:.0f}-{hi:.0f} ms "
        "before the holder releases. The last column compares the front with each row.",
        "",
    )
    order = [
        (k, LABELS[k], "pylock-filelock", False) for k in ("pylock-filelock", "pylock", "filelock")
    ]
    for part, with_max in (("uncontended", False), ("handoff", True)):
        d.add(f"### {part.capitalize()}", "")
        mine = {k.split(":", 1)[1]: r for k, r in rows.items() if k.startswith(f"{part}:")}
        latency_table(d, f"front {part}", mine, order, with_max=with_max)


def _handoff(d: Doc, name: str, title: str, rows: dict[str, Row], sizes: Sizes) -> None:
    lo, hi = sizes.block_ms
    if name == "handoff":
        how = (
            "The holder (another process) calls release; the time from just before that call "
            "to the "
            "moment acquire returns in the waiting process"
        )
    else:
        how = (
            "The holder (a forked process holding the lock) is killed with SIGKILL; the time from "
            "just before `kill()` to the moment acquire returns in the waiting process"
        )
    d.add(
        f"## {title}",
        "",
        f"{how}, both CLOCK_MONOTONIC. Before each trial the waiter has been blocked in acquire "
        "for "
        f"a random {lo:.0f}-{hi:.0f} ms (uniform), so no poll schedule lines up with the release. "
        "Trials go round-robin over the libraries. Sync rows compare with pylock's blocking "
        "`acquire()`, async rows with `await acquire_async()`.",
        "",
    )
    order = []
    for k in ("pylock", "floor", "filelock", "fasteners", "portalocker"):
        order.append((k, LABELS[k], "pylock", k == "floor"))
    for k in ("pylock-async", "floor-async", "filelock-async"):
        order.append((k, LABELS[k], "pylock-async", k == "floor-async"))
    latency_table(d, name, rows, order, with_max=True)


def _death(d: Doc, rows: dict[str, Row], sizes: Sizes) -> None:
    lo, hi = sizes.death_block_ms
    one = {k[4:]: r for k, r in rows.items() if k.startswith("one:")}
    many = {k[5:]: r for k, r in rows.items() if k.startswith("many:")}
    if one:
        d.add(
            "## Death notification, one process watched",
            "",
            "A process that is not the watcher's child is watched, then killed with SIGKILL "
            "after a "
            f"random {lo:.0f}-{hi:.0f} ms; the time from just before `kill()` to the watcher's "
            "await "
            "(or blocking wait) returning. `holder_exit(lock)` watches the process holding a "
            "pylock "
            "lock. The fallback rows run the watcher under a seccomp filter that makes "
            "`pidfd_open` "
            "fail with ENOSYS (`python -m tests.support.seccomp`), as on kernels before 5.3; they "
            "are compared with pylock's pidfd path. The processes watched by pid are tiny C "
            "sleepers; the lock holders are forked Python processes, whose exit takes the kernel "
            "longer to tear down (compare the lock rows with each other only).",
            "",
        )
        order = [
            ("pylock", DEATH_LABELS["pylock"], "pylock", False),
            ("pidfd-await", DEATH_LABELS["pidfd-await"], "pylock", True),
            ("psutil", DEATH_LABELS["psutil"], "pylock", False),
            ("pylock-lock", DEATH_LABELS["pylock-lock"], None, False),
            ("fallback", DEATH_LABELS["fallback"], "pylock", False),
            ("fallback-lock", DEATH_LABELS["fallback-lock"], "pylock-lock", False),
        ]
        latency_table(d, "death", one, order, with_max=True)
    if many:
        n = sizes.many
        d.add(
            f"## Death notification, {n:,} processes watched at once",
            "",
            f"One process watches {n:,} sleeping processes (not its children), each a small "
            "program of its own (fork + exec of floor.c, statically linked where the C library "
            "allows, so they share almost no pages). Memory per watch is the watcher's "
            "resident set growth while registering the last nine tenths, divided by their count "
            "(the first tenth warms up what is built once; kernel objects such as pidfds are not "
            "in it). Idle CPU and wakeups (context switches of all "
            f"its threads) are taken over {sizes.idle_s:.0f} s in which nothing exits. Then "
            f"{sizes.many_kills} of the watched processes are killed one at a time and each exit's "
            "latency is timed as above; with that few exits the p99 is in effect the largest, "
            "and a stall of the whole machine shows in every row alike (see the bare pidfd row).",
            "",
        )
        head = [
            "",
            "exit latency median",
            "p99",
            "memory per watch",
            "idle CPU",
            "idle wakeups",
            "registering",
        ]
        out = []
        for key in ("pylock-many", "pylock", "pidfd", "psutil", "fallback-many", "fallback"):
            row = many.get(key)
            if row is None:
                continue
            label = DEATH_MANY_LABELS[key]
            x = row.extra
            if row.error is not None or "bytes_per_watch" not in x:
                out.append(d.error_row("death many", row, len(head), label))
                continue
            lat = (
                [fmt_ns(median(row.samples)), fmt_ns(p99(row.samples))]
                if row.samples
                else ["-", "-"]
            )
            out.append(
                [
                    label,
                    *lat,
                    f"{x['bytes_per_watch']:.0f} B",
                    f"{x['idle_cpu_pct']:.3f}% of a core",
                    f"{x['idle_wakeups_s']:.1f}/s",
                    f"{x['register_s']:.2f} s",
                ]
            )
        d.table(head, out)


def _contention(d: Doc, rows: dict[str, Row], sizes: Sizes) -> None:
    d.add(
        "## Contention throughput",
        "",
        f"N processes (or 64 asyncio tasks in one process, each with its own lock object) take one "
        f"lock in a loop for {sizes.contention_s:.0f} s; critical sections per second, all "
        "together. "
        "The critical section increments a counter in shared memory non-atomically and checks an "
        '"inside" flag, so a lock that fails to exclude shows up as overlaps and lost updates '
        "(the tasks' critical section yields to the loop once while holding). Async rows: pylock "
        "`acquire_async`, filelock `AsyncFileLock`, fasteners run in a thread (it has no asyncio "
        "API), and the async floor.",
        "",
    )
    configs: list[str] = []
    libs: list[str] = []
    for key, row in rows.items():
        cfg = key.split(" ", 1)[1]
        if cfg not in configs:
            configs.append(cfg)
        base = row.lib.replace("-async", "").replace("-thread", "")
        if base not in libs:
            libs.append(base)

    def cell(lib: str, cfg: str) -> tuple[str, float | None]:
        for key, row in rows.items():
            if (
                key.split(" ", 1)[1] != cfg
                or row.lib.replace("-async", "").replace("-thread", "") != lib
            ):
                continue
            if not row.ok:
                d.failed.append(f"contention: {key}")
                return f"not measured: {(row.error or '').replace('|', '/')[:120]}", None
            rate = row.samples[0]
            text = fmt_rate(rate)
            v, lost = row.extra.get("violations", 0), row.extra.get("lost", 0)
            if v or lost:
                text += f" (**exclusion broken**: {v} overlaps, {lost} lost updates)"
            return text, rate
        return "", None

    out = []
    rates: dict[tuple[str, str], float | None] = {}
    for lib in libs:
        cells = []
        for cfg in configs:
            text, rate = cell(lib, cfg)
            rates[lib, cfg] = rate
            cells.append(text)
        out.append([LABELS.get(lib, lib), *cells])
    for peer in ("filelock", "fasteners", "floor"):
        if peer not in libs:
            continue
        cells = []
        for cfg in configs:
            p, o = rates.get(("pylock", cfg)), rates.get((peer, cfg))
            cells.append(f"{p / o:.2f}x" if p and o else "-")
        out.append([f"pylock ÷ {peer}", *cells])
    d.table(["critical sections per second", *configs], out)


STARTUP_LABELS = {
    "python": "`python -c pass` (the interpreter's own start)",
    "import-pylock": '`python -c "import pylock"`',
    "import-filelock": '`python -c "import filelock"`',
    "pylock-run": "`pylock run FILE true` (the console script)",
    "flock-run": "`flock FILE true` (util-linux flock(1))",
}


def _startup(d: Doc, rows: dict[str, Row], sizes: Sizes) -> None:
    bare = rows.get("python")
    interp = bare.extra.get("interpreter", "?") if bare is not None else "?"
    run_row = rows.get("pylock-run")
    run_as = ""
    if run_row is not None and "argv" in run_row.extra:
        run_as = f", run as `pylock {run_row.extra['argv']}`"
    d.add(
        "## Start-up",
        "",
        "Whole processes, each timed from just before `posix_spawn` to the return of `waitpid`, "
        f"{sizes.startup} of each, round-robin in a shuffled order. Every Python row runs "
        f"`{interp}` in a fresh, empty virtual environment, as a "
        "service's venv would be (PYTHONPATH names the checkout and the directories of the C "
        "extensions), because an editable install's finder or a distribution's or pyenv's "
        "`.pth` files can double the interpreter's own start and would flatter every ratio; "
        "pylock's bytecode is compiled beforehand, as an installed "
        "wheel has it. `pylock run` is the console script exactly as pip writes it "
        "(its `import re` included)" + run_as + ".",
        "",
    )
    head = ["", "median", "p99", "trials", "vs `python -c pass` (medians)"]
    out = []
    base = get(rows, "python")
    for key, label in STARTUP_LABELS.items():
        row = rows.get(key)
        if row is None:
            continue
        if not row.ok:
            out.append(d.error_row("startup", row, len(head), label))
            continue
        m = median(row.samples)
        vs = "" if base is None or key == "python" else f"{m / median(base.samples):.2f}x"
        if base is not None and key == "import-pylock":
            added = m - median(base.samples)
            vs += f" (adds {fmt_ns(added)} = {added / median(base.samples):.2f}x)"
        out.append([label, fmt_ns(m), fmt_ns(p99(row.samples)), str(len(row.samples)), vs])
    d.table(head, out)
    for key, what in (("import-pylock", "`import pylock`"), ("pylock-run", "`pylock run`")):
        row = rows.get(key)
        heaviest = row.extra.get("heaviest") if row is not None else None
        if heaviest:
            listed = ", ".join(f"{name} {us / 1000:.1f} ms" for name, us in heaviest)
            d.add(
                f"Where {what} goes beyond the interpreter's start (cumulative `-X importtime` "
                f"of one run, largest first, none inside another): {listed}.",
                "",
            )


# -- README -------------------------------------------------------------------


def _waiters(d: Doc, rows: dict[str, Row]) -> None:
    d.add(
        "## Many waiting tasks",
        "",
        "N asyncio tasks of one process, each waiting for its own lock, all held by one "
        "other (pylock) process, which is then killed with SIGKILL. Threads: how many the "
        "waiting process has beyond those it had before the tasks. RSS: its growth per "
        "waiting task. Idle CPU: while everything waits, in percent of one core. Wake-all: "
        "from the SIGKILL until the last task holds its lock (median of the rounds).",
        "",
    )
    table = []
    for key, row in rows.items():
        lib, n = key.rsplit(" ", 1)
        if not row.ok:
            table.append([lib, n, row.error or "no samples", "", "", "", ""])
            continue
        mine = statistics.median(row.samples)
        peer = rows.get(f"filelock-async {n}")
        ratio = ""
        if peer is not None and peer.ok:
            ratio = f"{mine / statistics.median(peer.samples):.2f}x"
        table.append(
            [
                lib,
                n,
                str(max(row.extra["threads"])),
                f"{statistics.median(row.extra['rss']) / 1024:.1f} KiB",
                f"{max(row.extra['cpu']):.2f}%",
                fmt_ns(mine),
                ratio,
            ]
        )
    d.table(
        ["library", "N", "threads", "RSS per waiter", "idle CPU", "wake-all", "vs AsyncFileLock"],
        table,
    )
