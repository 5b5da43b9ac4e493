"""Lock metrics: acquisitions, conflicts, time waited and time held, per lock and process-wide.

Off by default, and then free: each of Lock's hooks is one check of a
module global.  enable() installs this module as the observer; the hooks
then add a clock read and a few counters (benchmarked in bench/daemon.py).
Counters are kept per lock path (two Lock objects on one file are one lock),
for this process only.  With prometheus_client installed (the `metrics`
extra), register() exposes them as pylock_lock_wait_seconds and
pylock_lock_hold_seconds histograms and pylock_lock_conflicts_total,
labelled by lock name (its path); the collector reads the counters at
scrape time, so nothing is pushed on the lock's paths.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _lock

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._lock import Lock

log = logging.getLogger("pylock")

# Histogram buckets: durations of at most 2**k - 1 ns, from about 1 us to
# 275 s.  The hooks file a duration of d ns under slot d.bit_length(), the b
# with 2**(b-1) <= d < 2**b: one integer operation instead of a search, and
# exact for these bounds.
_POWERS = (10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38)
BUCKETS = tuple((2**k - 1) / 1e9 for k in _POWERS)
_SLOTS = 65  # a duration below 2**64 ns
_now = time.monotonic_ns
# _pl_since after a release: later than any clock reading, so a release
# without an observed acquisition computes a negative hold and is ignored.
_NEVER = 1 << 63


class _Counters:
    """The live counters of one lock path (mutated by the hooks)."""

    __slots__ = ("conflicts", "hold_ns", "hold_slots", "wait_ns", "wait_slots")

    def __init__(self) -> None:
        self.conflicts = 0
        self.wait_ns = 0
        self.hold_ns = 0
        # Waits are recorded for the contended attempts only (taken or given up).
        self.wait_slots = [0] * _SLOTS
        self.hold_slots = [0] * _SLOTS


def _buckets(slots: list[int]) -> tuple[int, ...]:
    """Counts per bucket of BUCKETS (not cumulative; the last is +Inf)."""
    out = []
    low = 0
    for k in _POWERS:  # slots up to k hold durations below 2**k
        out.append(sum(slots[low : k + 1]))
        low = k + 1
    out.append(sum(slots[low:]))
    return tuple(out)


@dataclass(frozen=True)
class LockStats:
    """A snapshot of one lock's counters (or of all of them: name is "")."""

    name: str
    acquisitions: int = 0
    conflicts: int = 0  # attempts that found the lock held
    waited: float = 0.0  # seconds spent waiting, in acquisitions and in attempts given up
    held: float = 0.0  # seconds held, over completed holds
    releases: int = 0
    wait_buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    hold_buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)


_table: dict[str, _Counters] = {}
_table_lock = threading.Lock()


def _counters(path: str) -> _Counters:
    found = _table.get(path)
    if found is None:
        with _table_lock:
            found = _table.setdefault(path, _Counters())
    return found


def _attach(lock: Lock) -> _Counters:
    """Give a Lock object its counters, the first time a hook sees it."""
    counters = _counters(lock.path)
    lock._pl_stats = counters  # type: ignore[attr-defined]
    lock._pl_waiting = 0  # type: ignore[attr-defined]
    if not hasattr(lock, "_pl_since"):
        lock._pl_since = _NEVER  # type: ignore[attr-defined]
    return counters


# -- the hooks Lock calls while enabled -----------------------------------------


def acquired(lock: Lock) -> None:
    lock._pl_since = now = _now()  # type: ignore[attr-defined]
    try:
        if lock._pl_waiting:  # type: ignore[attr-defined]
            _end_wait(lock, now)
    except AttributeError:
        _attach(lock)


def conflicted(lock: Lock) -> None:
    try:
        counters: _Counters = lock._pl_stats  # type: ignore[attr-defined]
    except AttributeError:
        counters = _attach(lock)
    lock._pl_waiting = _now()  # type: ignore[attr-defined]
    counters.conflicts += 1  # after the stamp: whoever sees the count, sees a wait begun


def gave_up(lock: Lock) -> None:
    if getattr(lock, "_pl_waiting", 0):
        _end_wait(lock, _now())


def _end_wait(lock: Lock, now: int) -> None:
    waited = now - lock._pl_waiting  # type: ignore[attr-defined]
    lock._pl_waiting = 0  # type: ignore[attr-defined]
    counters: _Counters = lock._pl_stats  # type: ignore[attr-defined]
    counters.wait_ns += waited
    counters.wait_slots[waited.bit_length()] += 1


def released(lock: Lock) -> None:
    try:
        held: int = _now() - lock._pl_since  # type: ignore[attr-defined]
    except AttributeError:
        return  # taken before metrics were enabled
    if held < 0:
        return  # idem, for an object seen before
    lock._pl_since = _NEVER  # type: ignore[attr-defined]
    counters: _Counters = lock._pl_stats  # type: ignore[attr-defined]
    counters.hold_ns += held
    counters.hold_slots[held.bit_length()] += 1


class _Observer:
    """What Lock's hooks call (one attribute lookup each).  Acquisitions are
    not counted as they happen: they are the completed holds (the hold
    histogram's count) plus the holds in progress, counted when asked."""

    acquired = staticmethod(acquired)
    conflicted = staticmethod(conflicted)
    gave_up = staticmethod(gave_up)
    released = staticmethod(released)


class _LoggingObserver:
    """The same, with a debug record on the "pylock" logger for each event."""

    @staticmethod
    def acquired(lock: Lock) -> None:
        acquired(lock)
        log.debug("pylock: acquired %s", lock.path)

    @staticmethod
    def conflicted(lock: Lock) -> None:
        conflicted(lock)
        log.debug("pylock: %s is held by another owner", lock.path)

    gave_up = staticmethod(gave_up)

    @staticmethod
    def released(lock: Lock) -> None:
        since = getattr(lock, "_pl_since", _NEVER)
        released(lock)
        if since != _NEVER:
            log.debug("pylock: released %s after %.6f s", lock.path, (_now() - since) / 1e9)


def _holds_in_progress(path: str) -> int:
    return sum(
        1
        for lock in list(_lock._open_locks)
        if lock.path == path and getattr(lock, "_pl_since", _NEVER) != _NEVER and lock.locked
    )


# -- the public API --------------------------------------------------------------


def enable(*, log_acquisitions: bool = False) -> None:
    """Start counting, in this process.  log_acquisitions: a debug record on the
    "pylock" logger for each acquisition, conflict and release."""
    # A hold that began while counting was off is not measured.
    for lock in list(_lock._open_locks):
        if hasattr(lock, "_pl_since"):
            lock._pl_since = _NEVER
    _lock._observer = _LoggingObserver if log_acquisitions else _Observer


def disable() -> None:
    """Stop counting; the counters so far are kept (reset() clears them)."""
    _lock._observer = None


def enabled() -> bool:
    return _lock._observer is not None


def reset() -> None:
    """Forget every counter (locks held now count their hold from their next acquisition)."""
    with _table_lock:
        for counters in _table.values():
            counters.__init__()  # type: ignore[misc]


def _snapshot(name: str, c: _Counters) -> LockStats:
    hold_buckets = _buckets(c.hold_slots)
    return LockStats(
        name=name,
        acquisitions=sum(c.hold_slots) + _holds_in_progress(name),
        conflicts=c.conflicts,
        waited=c.wait_ns / 1e9,
        held=c.hold_ns / 1e9,
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
        for name, s in sorted(snapshot().items()):
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
