"""Turn bench/run.py's results into Markdown tables and the latency plot."""

from __future__ import annotations

import datetime
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from run import Results, Row, Sizes

LABELS = {
    "pylock": "pylock",
    "pylock-async": "pylock `acquire_async`",
    "filelock": "filelock",
    "filelock-async": "filelock `AsyncFileLock`",
    "fasteners": "fasteners",
    "fasteners-thread": "fasteners (acquire in a thread)",
    "portalocker": "portalocker",
    "floor": "floor: `fcntl.flock` + `os.pwrite` (Python)",
    "floor-c": "floor: the same syscalls in C",
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


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}/s"


def faster(pylock: float, other: float, floor: bool = False) -> str:
    """pylock's time against another's, in words."""
    if floor:
        return f"pylock = {pylock / other:.2f}x this"
    if other >= pylock:
        return f"pylock {other / pylock:.1f}x faster"
    return f"pylock {pylock / other:.2f}x slower"


@dataclass
class Report:
    markdown: str
    failed_rows: list[str] = field(default_factory=list)


class _Doc:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(head) + " |", "|" + "---|" * len(head))
        for r in rows:
            self.add("| " + " | ".join(r) + " |")
        self.add("")

    def error_row(self, section: str, row: Row, width: int, label: str) -> list[str]:
        self.failed.append(f"{section}: {row.lib}")
        msg = (row.error or "no samples").replace("|", "\\|").replace("\n", " ")
        return [label, f"not measured: {msg}"] + [""] * (width - 2)


def _get(rows: dict[str, Row] | None, key: str) -> Row | None:
    if rows is None:
        return None
    row = rows.get(key)
    return row if row is not None and row.ok else None


def render(
    results: Results, machine: dict[str, str], sizes: Sizes, record_len: int, cmd: str
) -> Report:
    d = _Doc()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    d.add(
        "# pylock benchmarks",
        "",
        f"Made by `{cmd}` on {stamp}. All figures below come from this one run.",
        "",
    )
    d.add("## Machine", "")
    d.table(["", ""], [[k, v.replace("|", "\\|")] for k, v in machine.items()])

    targets = _targets(results)
    if targets:
        d.add("## Targets", "")
        d.table(["target", "measured", "met"], targets)

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
    if "imports" in results:
        _imports(d, results["imports"], sizes)
    return Report("\n".join(d.lines).rstrip() + "\n", d.failed)


def _ratio_target(
    what: str, num: Row | None, den: Row | None, limit: float, at_least: bool
) -> list[str]:
    if num is None or den is None:
        return [what, "not measured", "-"]
    r = median(num.samples) / median(den.samples)
    ok = r >= limit if at_least else r <= limit
    shown = f"{r:.2f}x ({fmt_ns(median(num.samples))} / {fmt_ns(median(den.samples))})"
    return [what, shown, "yes" if ok else "**no**"]


# (section, what, numerator key, denominator key, limit, at least)
RATIO_TARGETS = [
    ("uncontended", "uncontended: pylock / Python floor <= 1.5x", "pylock", "floor", 1.5, False),
    ("uncontended", "uncontended: pylock / C floor <= 1.5x", "pylock", "floor-c", 1.5, False),
    ("uncontended", "uncontended: filelock / pylock >= 25x", "filelock", "pylock", 25, True),
    ("handoff", "handoff sync: pylock / floor <= 1.5x", "pylock", "floor", 1.5, False),
    (
        "handoff",
        "handoff async: pylock / async floor <= 1.5x",
        "pylock-async",
        "floor-async",
        1.5,
        False,
    ),
    ("handoff", "handoff sync: filelock / pylock >= 20x", "filelock", "pylock", 20, True),
    (
        "handoff",
        "handoff async: AsyncFileLock / pylock async >= 20x",
        "filelock-async",
        "pylock-async",
        20,
        True,
    ),
    (
        "death",
        "death notification: pylock / bare pidfd <= 1.5x",
        "one:pylock",
        "one:pidfd-await",
        1.5,
        False,
    ),
]


def _targets(results: Results) -> list[list[str]]:
    out: list[list[str]] = []
    for section, what, num, den, limit, at_least in RATIO_TARGETS:
        rows = results.get(section)
        if rows is not None:
            out.append(_ratio_target(what, _get(rows, num), _get(rows, den), limit, at_least))
    dth = results.get("death")
    if dth is None:
        return out
    many = _get(dth, "many:pylock-many")
    name = "ExitWatcher"
    if many is None:
        many, name = _get(dth, "many:pylock"), "holder_exit tasks"
    if many is None:
        out.append(["many watched: latency, memory, idle CPU", "not measured", "-"])
        return out
    name = f"{many.extra.get('n', 0):,} watched, {name}"
    what = f"{name}: exit latency / 1 watched <= 2x"
    out.append(_ratio_target(what, many, _get(dth, "one:pylock"), 2, False))
    bpw = many.extra.get("bytes_per_watch", math.nan)
    out.append(
        [f"{name}: memory per watch < 2 KiB", f"{bpw:.0f} B", "yes" if bpw < 2048 else "**no**"]
    )
    cpu = many.extra.get("idle_cpu_pct", math.nan)
    wakeups = many.extra.get("idle_wakeups_s", math.nan)
    out.append(
        [
            f"{name}: no CPU while idle",
            f"{cpu:.3f}% of a core, {wakeups:.1f} wakeups/s",
            "yes" if cpu < 0.1 and wakeups < 1 else "**no**",
        ]
    )
    return out


def _latency_table(
    d: _Doc,
    section: str,
    rows: dict[str, Row],
    order: list[tuple[str, str, str | None, bool]],
    with_max: bool,
) -> None:
    """order: (key, label, pylock key to compare with or None, compare as floor)."""
    head = (
        ["", "median", "p99"]
        + (["max"] if with_max else [])
        + ["trials", "pylock vs this (medians)"]
    )
    out = []
    for key, label, ref, is_floor in order:
        row = rows.get(key)
        if row is None:
            continue
        if not row.ok:
            out.append(d.error_row(section, row, len(head), label))
            continue
        m = median(row.samples)
        cells = [label, fmt_ns(m), fmt_ns(p99(row.samples))]
        if with_max:
            cells.append(fmt_ns(max(row.samples)))
        cells.append(str(len(row.samples)))
        refrow = _get(rows, ref) if ref else None
        if ref is None or key == ref:
            cells.append("")
        elif refrow is None:
            cells.append("pylock not measured")
        else:
            cells.append(faster(median(refrow.samples), m, is_floor))
        out.append(cells)
    d.table(head, out)


def _uncontended(d: _Doc, rows: dict[str, Row], sizes: Sizes, record_len: int) -> None:
    d.add(
        "## Uncontended acquire + release",
        "",
        f"One process, nobody else on the lock: acquire then release, each pair timed alone "
        f"(CLOCK_MONOTONIC around the pair), {sizes.uncontended} pairs per Python library in "
        f"{sizes.rounds} interleaved rounds, {sizes.uncontended_c} for the C loop. pylock "
        "writes its "
        f"{record_len}-byte holder record on every acquire; the floors `pwrite` the same bytes "
        "on an "
        "already-open descriptor between `flock(LOCK_EX)` and `flock(LOCK_UN)`. The peers do what "
        "they do by default (filelock and portalocker open and close the file each time and write "
        "no record).",
        "",
    )
    order = [
        (k, LABELS[k], "pylock", k.startswith("floor"))
        for k in ("pylock", "floor", "floor-c", "filelock", "fasteners", "portalocker")
    ]
    _latency_table(d, "uncontended", rows, order, with_max=False)


def _handoff(d: _Doc, name: str, title: str, rows: dict[str, Row], sizes: Sizes) -> None:
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
    _latency_table(d, name, rows, order, with_max=True)


def _death(d: _Doc, rows: dict[str, Row], sizes: Sizes) -> None:
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
        _latency_table(d, "death", one, order, with_max=True)
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


def _contention(d: _Doc, rows: dict[str, Row], sizes: Sizes) -> None:
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


def _imports(d: _Doc, rows: dict[str, Row], sizes: Sizes) -> None:
    d.add(
        "## Import time",
        "",
        "`import <module>` timed inside a fresh interpreter (warm bytecode cache), "
        f"{sizes.imports} "
        "runs each, alternating.",
        "",
    )
    _latency_table(
        d,
        "imports",
        rows,
        [("pylock", "pylock", "pylock", False), ("filelock", "filelock", "pylock", False)],
        with_max=False,
    )


# -- plot ---------------------------------------------------------------------


def plot(results: Results, path: str, cmd: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, list[tuple[str, list[float]]]]] = []

    def collect(title: str, rows: dict[str, Row] | None, keys: list[tuple[str, str]]) -> None:
        if not rows:
            return
        series = [
            (label, [x / 1e3 for x in rows[k].samples])
            for k, label in keys
            if k in rows and rows[k].ok
        ]
        if series:
            panels.append((title, series))

    plain = {k: v.replace("`", "") for k, v in LABELS.items()}
    hk = [
        (k, plain[k])
        for k in (
            "pylock",
            "floor",
            "pylock-async",
            "floor-async",
            "filelock",
            "filelock-async",
            "fasteners",
            "portalocker",
        )
    ]
    collect("Handoff: release -> blocked waiter returns", results.get("handoff"), hk)
    collect("Takeover: SIGKILL of holder -> waiter returns", results.get("takeover"), hk)
    death = results.get("death") or {}
    one = {k[4:]: r for k, r in death.items() if k.startswith("one:")}
    many = {k[5:]: r for k, r in death.items() if k.startswith("many:")}
    dl = {k: v.replace("`", "") for k, v in DEATH_LABELS.items()}
    dl["pidfd-await"] = "bare: await add_reader(pidfd_open(pid))"
    collect(
        "Death notification: SIGKILL -> watcher returns (1 watched)",
        one,
        [
            (k, dl[k])
            for k in ("pylock", "pidfd-await", "psutil", "pylock-lock", "fallback", "fallback-lock")
        ],
    )
    n_many = next((r.extra.get("n") for r in many.values() if r.extra.get("n")), None)
    dml = {k: v.replace("`", "") for k, v in DEATH_MANY_LABELS.items()}
    collect(
        f"Death notification with {n_many:,} watched" if n_many else "Death notification, many",
        many,
        [
            (k, dml[k])
            for k in ("pylock-many", "pylock", "pidfd", "psutil", "fallback-many", "fallback")
        ],
    )
    if not panels:
        return
    height = sum(1.2 + 0.45 * len(s) for _, s in panels)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, height), squeeze=False, layout="constrained"
    )
    rng = random.Random(0)
    for ax, (title, series) in zip(axes[:, 0], panels):
        labels = [s[0] for s in series][::-1]
        data = [s[1] for s in series][::-1]
        ax.boxplot(
            data,
            orientation="horizontal",
            whis=(1, 99),
            showfliers=False,
            widths=0.6,
            medianprops={"color": "tab:red", "linewidth": 2},
        )
        for i, xs in enumerate(data, start=1):
            jitter = [i + rng.uniform(-0.22, 0.22) for _ in xs]
            ax.scatter(xs, jitter, s=4, alpha=0.45, color="tab:blue", linewidths=0)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(
            "microseconds (log scale); box: quartiles, whiskers: p1-p99, red: median", fontsize=8
        )
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", which="both", alpha=0.3)
    fig.suptitle(f"pylock latency distributions ({cmd})", fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- README -------------------------------------------------------------------

BEGIN = "<!-- bench-report:begin -->"
END = "<!-- bench-report:end -->"


def update_readme(path: str, markdown: str) -> None:
    """Replace the figures between the markers in bench/README.md."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return
    body = markdown.split("\n", 1)[1].lstrip("\n")  # drop the report's own title
    body = body.replace("\n## ", "\n### ")
    if body.startswith("## "):
        body = "#" + body
    new = (
        text[: start + len(BEGIN)]
        + "\n"
        + body
        + "\n![latency distributions](latency.png)\n"
        + text[end:]
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
