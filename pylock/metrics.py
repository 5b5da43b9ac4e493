"""Lock metrics: acquisitions, conflicts, time waited and time held, per lock and process-wide.

Off by default, and then free: one check per acquire and release.
enable() makes this module the observer of every lock, through the lock
package's one registration point (set_observer), which points every lock
file at its path's pl_hold_stats: the C core then times each
hold itself (a clock reading when it takes the lock, another and two atomic
adds when it releases it), so an uncontended acquire + release runs no
Python for metrics (benchmarked in bench/daemon.py).  Conflicts and waits,
on the contended path, are counted here.  Counters are kept per lock path
(two Lock objects on one file are one lock), for this process only (a
forked child starts from zero); closed locks' counters are bounded
(CLOSED_LOCKS_KEPT).  With
prometheus_client installed (the `metrics` extra), register() exposes them
as pylock_lock_wait_seconds and pylock_lock_hold_seconds histograms and
pylock_lock_conflicts_total, labelled by lock name (its path, escaped
exactly: always UTF-8); the
collector reads the counters at scrape time, so nothing is pushed on the
lock's paths.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from ._core.display import escaped_exactly
from ._core.native import ffi
from ._lock.lockfile import current_observer, open_lock_paths, set_observer, timed_holds
from ._lock.protocol import BUCKET_POWERS, BUCKETS, LockStats

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._lock.lockfile import LockFile

log = logging.getLogger("pylock")

_SLOTS = 65  # a duration below 2**64 ns
_now = time.monotonic_ns


class _Counters:
    """The live counters of one lock path: waits and conflicts counted here,
    holds by the C core (into holds, which lives as long as the table)."""

    __slots__ = ("conflicts", "holds", "wait_ns", "wait_slots")

    def __init__(self) -> None:
        self.holds = ffi.new("pl_hold_stats *")
        self.clear()

    def clear(self) -> None:
        self.conflicts = 0
        self.wait_ns = 0
        # Waits are recorded for the contended attempts only (taken or given up).
        self.wait_slots = [0] * _SLOTS
        self.holds.held_ns = 0
        self.holds.slots = [0] * _SLOTS

    def add(self, other: _Counters) -> None:
        """other's counts into these (other is no open lock file's)."""
        self.conflicts += other.conflicts
        self.wait_ns += other.wait_ns
        self.wait_slots = [a + b for a, b in zip(self.wait_slots, other.wait_slots)]
        self.holds.held_ns += other.holds.held_ns
        self.holds.slots = [a + b for a, b in zip(self.holds.slots, other.holds.slots)]


def _buckets(slots: list[int]) -> tuple[int, ...]:
    """Counts per bucket of BUCKETS (not cumulative; the last is +Inf)."""
    out = []
    low = 0
    for k in BUCKET_POWERS:  # slots up to k hold durations below 2**k
        out.append(sum(slots[low : k + 1]))
        low = k + 1
    out.append(sum(slots[low:]))
    return tuple(out)


# The counters of closed locks are kept for the CLOSED_LOCKS_KEPT paths most
# recently observed that no open lock file uses (a process that locks a new
# path per job must not grow without bound); older ones are added together
# under the name CLOSED_LOCKS once as many again are observed: besides the
# open locks, at most 2 * CLOSED_LOCKS_KEPT + 1 paths.  A lock file in use
# keeps its own counters.
CLOSED_LOCKS_KEPT = 1000
CLOSED_LOCKS = "(closed locks)"  # no lock path: every path is absolute

_table: dict[str, _Counters] = {}
_table_lock = threading.Lock()
# The size of the table at which closed locks' counters are next folded.
_fold_at = CLOSED_LOCKS_KEPT


def _counters(path: str) -> _Counters:
    found = _table.get(path)
    if found is None:
        with _table_lock:
            found = _table.get(path)
            if found is None:
                if len(_table) >= _fold_at:
                    _fold_closed()
                found = _table[path] = _Counters()
    return found


def _fold_closed() -> None:
    """Add the oldest closed locks' counters into CLOSED_LOCKS, keeping the
    newest CLOSED_LOCKS_KEPT (the table's order is first observation)."""
    global _fold_at
    in_use = open_lock_paths()
    closed = [p for p in _table if p not in in_use and p != CLOSED_LOCKS]
    folded = closed[: max(0, len(closed) - CLOSED_LOCKS_KEPT)]
    if folded:
        into = _table.pop(CLOSED_LOCKS, None) or _Counters()
        for path in folded:
            into.add(_table.pop(path))
        _table[CLOSED_LOCKS] = into
    # Folding again only after as many new paths: each costs O(1) on average.
    _fold_at = len(_table) + CLOSED_LOCKS_KEPT


# -- what the locks tell the observer (on the contended path only) --------------

# When each lock object's contended attempt began to wait, and (logging
# acquisitions) when each was acquired: kept here, not on the objects.
_waiting_since: WeakKeyDictionary[LockFile, int] = WeakKeyDictionary()
_acquired_at: WeakKeyDictionary[LockFile, int] = WeakKeyDictionary()


def holds_of(path: str) -> Any:
    """The pl_hold_stats a newly opened lock file on path times its holds into."""
    return _counters(path).holds


def conflicted(lock: LockFile) -> None:
    _waiting_since[lock] = _now()
    # After the stamp: whoever sees the count, sees a wait begun.
    _counters(lock.path).conflicts += 1


def waited(lock: LockFile) -> None:
    """A contended attempt took the lock (or gave up, from gave_up)."""
    begun = _waiting_since.pop(lock, 0)
    if begun:
        wait_ns = _now() - begun
        counters = _counters(lock.path)
        counters.wait_ns += wait_ns
        counters.wait_slots[wait_ns.bit_length()] += 1


class _Observer:
    """What the locks call (pylock._lock.lockfile.LockObserver).  Acquisitions
    are not counted as they happen: they are the completed holds (the hold
    histogram's count) plus the holds in progress, counted when asked."""

    holds_of = staticmethod(holds_of)
    conflicted = staticmethod(conflicted)
    waited = staticmethod(waited)
    # The staticmethod just made: wrapping it again would be callable only
    # from Python 3.10 on (a TypeError on 3.9, CPython's and PyPy's).
    gave_up = waited

    @staticmethod
    def stats_of(path: str) -> LockStats:
        return stats_of(path)

    # With log_acquisitions: a debug record on the "pylock" logger for each
    # acquisition and release.

    @staticmethod
    def acquired(lock: LockFile) -> None:
        _acquired_at[lock] = _now()
        log.debug("pylock: acquired %s", lock.path)

    @staticmethod
    def released(lock: LockFile) -> None:
        since = _acquired_at.pop(lock, None)
        if since is not None:
            log.debug("pylock: released %s after %.6f s", lock.path, (_now() - since) / 1e9)


class _LoggingObserver(_Observer):
    """The same, with a debug record on the "pylock" logger for each conflict."""

    @staticmethod
    def conflicted(lock: LockFile) -> None:
        conflicted(lock)
        log.debug("pylock: %s is held by another owner", lock.path)


# -- the public API --------------------------------------------------------------


def enable(*, log_acquisitions: bool = False) -> None:
    """Start counting, in this process.  log_acquisitions: a debug record on the
    "pylock" logger for each acquisition, conflict and release.  A hold that
    began while counting was off is not measured."""
    observer = _LoggingObserver() if log_acquisitions else _Observer()
    set_observer(observer, log_events=log_acquisitions)


def disable() -> None:
    """Stop counting; the counters so far are kept (reset() clears them)."""
    set_observer(None)


def enabled() -> bool:
    return current_observer() is not None


def reset() -> None:
    """Forget every counter, and every lock no open lock file uses (locks
    held now count their hold from their next acquisition)."""
    global _fold_at
    with _table_lock:
        in_use = open_lock_paths()
        for path in list(_table):
            if path in in_use:
                _table[path].clear()
            else:
                del _table[path]
        _fold_at = len(_table) + CLOSED_LOCKS_KEPT


def _start_from_zero_after_fork() -> None:
    """A forked child counts for itself (its lock files are forgotten): its
    parent's counters are not its own.  The table's lock may have been held
    by a parent's thread at the fork: a new one."""
    global _table, _table_lock, _fold_at
    _table = {}
    _table_lock = threading.Lock()
    _fold_at = CLOSED_LOCKS_KEPT
    _waiting_since.clear()
    _acquired_at.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_start_from_zero_after_fork)


def _snapshot(name: str, c: _Counters) -> LockStats:
    hold_slots = list(c.holds.slots)
    hold_buckets = _buckets(hold_slots)
    return LockStats(
        name=name,
        acquisitions=sum(hold_slots) + timed_holds(name),
        conflicts=c.conflicts,
        waited=c.wait_ns / 1e9,
        held=c.holds.held_ns / 1e9,
        releases=sum(hold_buckets),
        wait_buckets=_buckets(c.wait_slots),
        hold_buckets=hold_buckets,
    )


def stats_of(path: str) -> LockStats:
    """The counters of the lock at path (zero when it was never observed)."""
    found = _table.get(path)
    return LockStats(path) if found is None else _snapshot(path, found)


def snapshot() -> dict[str, LockStats]:
    """The process-wide view: every observed lock's counters, by path."""
    with _table_lock:
        items = list(_table.items())
    return {path: _snapshot(path, c) for path, c in items}


def total() -> LockStats:
    """All locks of this process together."""
    all_stats = list(snapshot().values())

    def add(field: str) -> Any:
        return sum(getattr(s, field) for s in all_stats)

    def add_buckets(field: str) -> tuple[int, ...]:
        return (
            tuple(map(sum, zip(*(getattr(s, field) for s in all_stats))))
            or LockStats("").wait_buckets
        )

    return LockStats(
        name="",
        acquisitions=add("acquisitions"),
        conflicts=add("conflicts"),
        waited=add("waited"),
        held=add("held"),
        releases=add("releases"),
        wait_buckets=add_buckets("wait_buckets"),
        hold_buckets=add_buckets("hold_buckets"),
    )


# -- Prometheus ------------------------------------------------------------------


class PrometheusCollector:
    """A prometheus_client collector reading pylock's counters at scrape time."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        wait = HistogramMetricFamily(
            "pylock_lock_wait_seconds",
            "Time waited by attempts that found a pylock lock held (until taken or given up)",
            labels=["lock"],
        )
        hold = HistogramMetricFamily(
            "pylock_lock_hold_seconds", "Time a pylock lock was held", labels=["lock"]
        )
        conflicts = CounterMetricFamily(
            "pylock_lock_conflicts",
            "Attempts to take a pylock lock that found it held",
            labels=["lock"],
        )
        for path, s in sorted(snapshot().items()):
            # A label value must be UTF-8: a path that is not has its bytes escaped.
            name = escaped_exactly(path)
            wait.add_metric([name], _cumulative(s.wait_buckets), s.waited)
            hold.add_metric([name], _cumulative(s.hold_buckets), s.held)
            conflicts.add_metric([name], s.conflicts)
        yield wait
        yield hold
        yield conflicts


def _cumulative(counts: tuple[int, ...]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*(repr(b) for b in BUCKETS), "+Inf"), counts):
        running += count
        out.append((bound, float(running)))
    return out


def register(registry: Any = None) -> PrometheusCollector:
    """Expose pylock's metrics on a prometheus_client registry (the default one if None).

    Needs the optional extra: pip install 'pylock-kernel[metrics]'.
    """
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        raise ImportError(
            "pylock.metrics.register() needs prometheus_client: "
            "pip install 'pylock-kernel[metrics]'"
        ) from None
    collector = PrometheusCollector()
    (REGISTRY if registry is None else registry).register(collector)
    return collector
