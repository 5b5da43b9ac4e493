"""The targets pylock's figures are held to, checked against one run's results.

Each target names the issue that set it.  A target whose figures were not
measured in this run (a section left out with --only, a row that failed)
says so instead of passing.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _common import Results, Row


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def p99(xs: list[float]) -> float:
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def get(rows: dict[str, Row] | None, key: str) -> Row | None:
    if rows is None:
        return None
    row = rows.get(key)
    return row if row is not None and row.ok else None


Target = list[str]  # [target, measured, met]
NOT_MEASURED = "not measured in this run"


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _ratio(what: str, num: Row | None, den: Row | None, limit: float, at_least: bool) -> Target:
    """median(num) / median(den) against limit."""
    if num is None or den is None:
        return [what, NOT_MEASURED, "-"]
    a, b = statistics.median(num.samples), statistics.median(den.samples)
    r = a / b
    ok = r >= limit if at_least else r <= limit
    shown = f"{r:.2f}x ({fmt_ns(a)} / {fmt_ns(b)})"
    if not ok and at_least:  # a is the peer's time: pylock's (b) would have to be a / limit
        shown += f"; pylock {fmt_ns(b - a / limit)} too slow ({limit / r - 1:.0%})"
    elif not ok:
        shown += f"; {fmt_ns(a - b * limit)} too slow ({r / limit - 1:.0%})"
    return [what, shown, _verdict(ok)]


def _startup_added(res: Results) -> Target:
    what = "start-up (#14): `import pylock` adds at most `python -c pass`'s own time (<= 1x)"
    rows = res.get("startup")
    imp, bare = get(rows, "import-pylock"), get(rows, "python")
    if imp is None or bare is None:
        return [what, NOT_MEASURED, "-"]
    a, b = statistics.median(imp.samples), statistics.median(bare.samples)
    added = a - b
    shown = f"adds {fmt_ns(added)} = {added / b:.2f}x ({fmt_ns(a)} - {fmt_ns(b)})"
    if added > b:
        shown += f"; {fmt_ns(added - b)} too slow"
    return [what, shown, _verdict(added <= b)]


def _rate_ratio(what: str, num: Row | None, den: Row | None, limit: float) -> Target:
    if num is None or den is None:
        return [what, NOT_MEASURED, "-"]
    a, b = num.samples[0], den.samples[0]
    broken = num.extra.get("violations", 0) or num.extra.get("lost", 0)
    shown = f"{a / b:.2f}x ({a:,.0f}/s / {b:,.0f}/s)" + (" **exclusion broken**" if broken else "")
    if a / b < limit:
        shown += f"; {b * limit - a:,.0f}/s short"
    return [what, shown, _verdict(a / b >= limit and not broken)]


def _fallback_many(res: Results) -> list[Target]:
    dth = res.get("death")
    row = get(dth, "many:fallback-many")
    cpu_what = "exit watching, fallback (#14): 10,000 watched cost under 1% of a core while idle"
    lat_what = "exit watching, fallback (#14): an exit still seen within about 100 ms (p99)"
    if row is None or "idle_cpu_pct" not in row.extra:
        return [[cpu_what, NOT_MEASURED, "-"], [lat_what, NOT_MEASURED, "-"]]
    n = row.extra.get("n", 0)
    cpu = row.extra["idle_cpu_pct"]
    out = [[cpu_what.replace("10,000", f"{n:,}"), f"{cpu:.2f}% of a core", _verdict(cpu < 1.0)]]
    lat = p99(row.samples)
    shown = f"p99 {fmt_ns(lat)}, median {fmt_ns(statistics.median(row.samples))}"
    out.append([lat_what, shown, _verdict(lat <= 100e6)])
    return out


def _exit_watcher_many(res: Results) -> list[Target]:
    dth = res.get("death")
    if dth is None:
        return []
    many = get(dth, "many:pylock-many")
    name = "ExitWatcher"
    if many is None:
        many, name = get(dth, "many:pylock"), "holder_exit tasks"
    if many is None:
        return [["many watched: latency, memory, idle CPU", NOT_MEASURED, "-"]]
    name = f"{many.extra.get('n', 0):,} watched, {name}"
    one = get(dth, "one:pylock")
    out = [_ratio(f"{name}: exit latency / 1 watched <= 2x", many, one, 2, False)]
    bpw = many.extra.get("bytes_per_watch", math.nan)
    out.append([f"{name}: memory per watch < 2 KiB", f"{bpw:.0f} B", _verdict(bpw < 2048)])
    cpu = many.extra.get("idle_cpu_pct", math.nan)
    wakeups = many.extra.get("idle_wakeups_s", math.nan)
    shown = f"{cpu:.3f}% of a core, {wakeups:.1f} wakeups/s"
    out.append([f"{name}: no CPU while idle", shown, _verdict(cpu < 0.1 and wakeups < 1)])
    return out


def _row(res: Results, section: str, key: str) -> Row | None:
    return get(res.get(section), key)


def _targets_14(res: Results) -> list[Target]:
    r = res
    return [
        _ratio(
            "uncontended (#14): pylock <= 1.3x the rename-safe C floor",
            _row(r, "uncontended", "pylock"),
            _row(r, "uncontended", "floor-c-safe"),
            1.3,
            False,
        ),
        _ratio(
            "uncontended (#14): pylock >= 25x faster than filelock",
            _row(r, "uncontended", "filelock"),
            _row(r, "uncontended", "pylock"),
            25,
            True,
        ),
        _startup_added(r),
        _ratio(
            "start-up (#14): `pylock run FILE true` <= 3x `python -c pass`",
            _row(r, "startup", "pylock-run"),
            _row(r, "startup", "python"),
            3,
            False,
        ),
        _ratio(
            "handoff sync (#14): pylock <= 1.3x the floor",
            _row(r, "handoff", "pylock"),
            _row(r, "handoff", "floor"),
            1.3,
            False,
        ),
        _ratio(
            "handoff async (#14): pylock <= 1.2x the async floor",
            _row(r, "handoff", "pylock-async"),
            _row(r, "handoff", "floor-async"),
            1.2,
            False,
        ),
        _rate_ratio(
            "64 asyncio tasks (#14): pylock >= 0.9x the async floor's throughput",
            _row(r, "contention", "pylock-async 64 asyncio tasks"),
            _row(r, "contention", "floor-async 64 asyncio tasks"),
            0.9,
        ),
        *_fallback_many(r),
    ]


def _earlier_targets(res: Results) -> list[Target]:
    r = res
    out = [
        _ratio(
            "handoff sync: pylock >= 20x faster than filelock",
            _row(r, "handoff", "filelock"),
            _row(r, "handoff", "pylock"),
            20,
            True,
        ),
        _ratio(
            "handoff async: pylock >= 20x faster than `AsyncFileLock`",
            _row(r, "handoff", "filelock-async"),
            _row(r, "handoff", "pylock-async"),
            20,
            True,
        ),
        _ratio(
            "death notification: pylock <= 1.5x the bare pidfd await",
            _row(r, "death", "one:pylock"),
            _row(r, "death", "one:pidfd-await"),
            1.5,
            False,
        ),
    ]
    return out + _exit_watcher_many(r)


def targets(res: Results) -> list[Target]:
    """Every target with its figure from this run and whether it is met."""
    return _targets_14(res) + _waiters(res) + _earlier_targets(res)


def _waiters(res: Results) -> list[Target]:
    """Issue 23: thousands of waiting tasks."""
    rows = res.get("waiters")
    pylock = {n: get(rows, f"pylock-async {n}") for n in (1000, 4000)}
    peer = get(rows, "filelock-async 4000")
    out = [
        _ratio(
            "23: N = 4,000 waiters all hold their locks within 0.25x AsyncFileLock's time",
            pylock[4000],
            peer,
            0.25,
            False,
        ),
        _ratio(
            "23: the N = 4,000 time is at most 8x the N = 1,000 time",
            pylock[4000],
            pylock[1000],
            8.0,
            False,
        ),
    ]
    big = pylock[4000]
    if big is None:
        return [*out, *([f"23: {what}", NOT_MEASURED, "-"] for what in ("threads", "RSS", "CPU"))]
    threads = max(big.extra["threads"])
    rss = statistics.median(big.extra["rss"])
    cpu = max(big.extra["cpu"])
    return [
        *out,
        [
            "23: no thread per waiting task (N = 4,000, at most 4 more)",
            f"{threads}",
            _verdict(threads <= 4),
        ],
        ["23: at most 4 KiB of RSS per waiting task", f"{rss:.0f} B", _verdict(rss <= 4096)],
        ["23: under 0.5% of a core while 4,000 wait", f"{cpu:.2f}%", _verdict(cpu < 0.5)],
    ]
