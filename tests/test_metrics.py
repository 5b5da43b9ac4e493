"""Lock metrics: counters after scripted contention, the Prometheus text output, off by default."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pylock
from pylock import metrics
from pylock._lock.lockfile import current_observer
from tests.support import env_with_repo

HOLDER = textwrap.dedent(
    """
    import sys, pylock
    lock = pylock.Lock(sys.argv[1])
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def observed():
    # Locks earlier tests dropped in reference cycles (a caught LockHeld's
    # traceback holds its Lock) are open until the collector runs, and an
    # open lock keeps its row: collect them so each test sees only its own.
    gc.collect()
    metrics.reset()
    metrics.enable()
    yield
    metrics.disable()
    metrics.reset()


def test_off_by_default_and_nothing_counted(tmp_path):
    assert current_observer() is None and not metrics.enabled()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pylock, sys; from pylock._lock.lockfile import current_observer; "
            "l = pylock.Lock(sys.argv[1]); "
            "l.acquire(); l.release(); print(current_observer(), l.stats.acquisitions, "
            "'pylock.metrics' in sys.modules)",
            str(tmp_path / "off.lock"),
        ],
        capture_output=True,
        text=True,
        env=env_with_repo(),
        check=True,
    )
    # The hooks found no observer, and stats (asked after) shows nothing
    # counted without loading pylock.metrics.
    assert out.stdout.split() == ["None", "0", "False"]


def test_counters_after_scripted_contention(tmp_path, observed):
    path = str(tmp_path / "x.lock")
    lock = pylock.Lock(path)
    for _ in range(3):
        lock.acquire()
        lock.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = time.monotonic()
        with pytest.raises(pylock.LockHeld):
            lock.acquire(blocking=False)  # conflict 1, given up at once
        with pytest.raises(pylock.LockTimeout):
            lock.acquire(timeout=0.1)  # conflict 2, waits until the timeout
        after = time.monotonic()
        assert lock.stats.conflicts == 2
        assert 0 < lock.stats.waited <= after - before
        timed_out = lock.stats.waited

        got = threading.Event()

        def waiter() -> None:
            lock.acquire(timeout=60)  # conflict 3: waits until the holder releases
            got.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        while lock.stats.conflicts < 3:  # the waiter found it held and is waiting
            time.sleep(0.001)
        started = time.monotonic()
        time.sleep(0.05)  # held a while longer, so the wait has a lower bound
        floor = time.monotonic() - started  # the waiter cannot have the lock before this
        holder.stdin.write("release\n")
        holder.stdin.flush()
        thread.join()
        assert got.is_set() and lock.locked
        lock.release()
    finally:
        holder.stdin.close()
        holder.wait()

    stats = lock.stats
    assert stats.acquisitions == 4
    assert stats.releases == 4
    assert stats.conflicts == 3
    assert sum(stats.wait_buckets) == 3  # three contended attempts ended
    assert stats.waited >= timed_out + floor
    # The last wait lasted at least `floor`: it is filed in a bucket reaching that far.
    bounds = (*metrics.BUCKETS, float("inf"))
    assert sum(n for bound, n in zip(bounds, stats.wait_buckets) if bound >= floor) >= 1
    assert stats.held > 0 and sum(stats.hold_buckets) == 4
    assert metrics.snapshot()[path] == stats
    assert metrics.total().conflicts >= 3


def test_prometheus_text_output(tmp_path, observed):
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    path = str(tmp_path / "p.lock")
    lock = pylock.Lock(path)
    other = pylock.Lock(path)  # another object on the same file: the same lock
    lock.acquire()
    for _ in range(2):
        with pytest.raises(pylock.LockHeld):
            other.acquire(blocking=False)
    lock.release()
    other.acquire()
    other.release()

    registry = prometheus_client.CollectorRegistry()
    metrics.register(registry)
    text = prometheus_client.generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"lock": path, **labels}.items())))]

    assert value("pylock_lock_conflicts_total") == 2
    assert value("pylock_lock_hold_seconds_count") == 2
    assert value("pylock_lock_hold_seconds_bucket", le="+Inf") == 2
    assert value("pylock_lock_hold_seconds_sum") == pytest.approx(lock.stats.held)
    assert value("pylock_lock_wait_seconds_count") == 2
    assert value("pylock_lock_wait_seconds_sum") == pytest.approx(lock.stats.waited)
    bounds = [
        dict(labels)["le"]
        for (name, labels) in samples
        if name == "pylock_lock_hold_seconds_bucket" and dict(labels)["lock"] == path
    ]
    assert len(bounds) == len(metrics.BUCKETS) + 1
    counts = [value("pylock_lock_hold_seconds_bucket", le=le) for le in bounds]
    assert counts == sorted(counts)  # cumulative


def test_debug_logging_of_acquisitions(tmp_path, caplog):
    metrics.enable(log_acquisitions=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="pylock"):
            lock = pylock.Lock(tmp_path / "l.lock")
            lock.acquire()
            lock.release()
    finally:
        metrics.disable()
    assert f"acquired {lock.path}" in caplog.text and f"released {lock.path}" in caplog.text


def test_enabling_while_held_counts_from_the_next_acquisition(tmp_path):
    metrics.reset()
    lock = pylock.Lock(tmp_path / "e.lock")
    lock.acquire()
    metrics.enable()
    try:
        lock.release()  # taken before: no hold to measure
        assert lock.stats.releases == 0
        lock.acquire()
        lock.release()
        assert lock.stats.acquisitions == 1 and lock.stats.releases == 1
    finally:
        metrics.disable()
        metrics.reset()


def test_async_acquisitions_are_counted(tmp_path, observed):
    import asyncio

    lock = pylock.Lock(tmp_path / "a.lock")

    async def main() -> None:
        async with lock:
            pass

    asyncio.run(main())
    assert lock.stats.acquisitions == 1 and lock.stats.releases == 1


def test_a_hold_begun_while_off_is_not_measured_for_a_known_lock(tmp_path):
    metrics.reset()
    lock = pylock.Lock(tmp_path / "k.lock")
    metrics.enable()
    try:
        lock.acquire()
        lock.release()  # the object is known now
        metrics.disable()
        lock.acquire()  # not observed
        metrics.enable()
        lock.release()
        stats = lock.stats
        assert stats.releases == 1 and stats.acquisitions == 1
        assert 0 < stats.held < 60
    finally:
        metrics.disable()
        metrics.reset()


def test_each_hold_is_filed_in_the_bucket_of_its_length(tmp_path, observed):
    # The C core times holds and files them by bit length: each hold, alone,
    # must land in the one bucket whose bounds contain its measured length.
    lock = pylock.Lock(tmp_path / "b.lock")
    bounds = (float("-inf"), *metrics.BUCKETS, float("inf"))
    for spin_ns in (0, 1_500, 3_000, 6_000, 12_000, 50_000, 100_000, 300_000, 700_000, 2_000_000):
        metrics.reset()
        with lock:
            held_from = time.monotonic_ns()
            while time.monotonic_ns() - held_from < spin_ns:
                pass
            held_at_least = (time.monotonic_ns() - held_from) / 1e9
        stats = lock.stats
        assert stats.releases == 1 and stats.held >= held_at_least
        expected = [int(low < stats.held <= high) for low, high in zip(bounds, bounds[1:])]
        assert list(stats.hold_buckets) == expected, (spin_ns, stats.held)


def test_nothing_is_counted_while_disabled(tmp_path, observed):
    lock = pylock.Lock(tmp_path / "d.lock")
    lock.acquire()
    lock.release()
    metrics.disable()
    lock.acquire()
    lock.release()
    opened_while_off = pylock.Lock(tmp_path / "d.lock")
    opened_while_off.acquire()
    opened_while_off.release()
    metrics.enable()
    stats = lock.stats
    assert stats.acquisitions == 1 and stats.releases == 1


def test_closed_locks_counters_are_bounded_and_folded(tmp_path, observed, monkeypatch):
    monkeypatch.setattr(metrics, "CLOSED_LOCKS_KEPT", 3)
    monkeypatch.setattr(metrics, "_fold_at", 3)
    kept_open = pylock.Lock(tmp_path / "open.lock")
    kept_open.acquire()
    kept_open.release()
    for n in range(10):  # one-shot jobs: a new path each, closed after
        job = pylock.Lock(tmp_path / f"job{n}.lock")
        job.acquire()
        job.release()
        job.close()
    table = metrics.snapshot()
    # The open lock, at most 3 kept closed ones (the newest), and the rest
    # folded, so nothing is lost from the total.
    assert str(tmp_path / "open.lock") in table and str(tmp_path / "job9.lock") in table
    assert str(tmp_path / "job0.lock") not in table
    assert len(table) <= 1 + 3 + 1 + 3  # and one batch of new paths before a fold
    folded = table[metrics.CLOSED_LOCKS]
    assert folded.releases >= 10 - 3 - 3
    assert metrics.total().releases == 11
    assert kept_open.stats.releases == 1  # an open lock keeps its own counters


def test_reset_forgets_the_locks_no_open_lock_uses(tmp_path, observed):
    gone = pylock.Lock(tmp_path / "gone.lock")
    gone.acquire()
    gone.release()
    gone.close()
    kept = pylock.Lock(tmp_path / "kept.lock")
    kept.acquire()
    kept.release()
    metrics.reset()
    assert list(metrics.snapshot()) == [str(tmp_path / "kept.lock")]
    assert kept.stats.releases == 0
    kept.acquire()
    kept.release()
    assert kept.stats.releases == 1  # still timed into the table's counters


def test_a_path_that_is_not_utf8_does_not_break_the_scrape(tmp_path, observed):
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/odd\xff\\x.lock")
    plain = str(tmp_path / "plain.lock")
    for path in (odd, plain):
        lock = pylock.Lock(path)
        lock.acquire()
        lock.release()
    registry = prometheus_client.CollectorRegistry()
    metrics.register(registry)
    text = prometheus_client.generate_latest(registry).decode()
    labels = {
        s.labels["lock"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if family.name == "pylock_lock_conflicts"
    }
    # The exact path's bytes, escaped so no two paths share a label.
    assert labels == {plain, f"{tmp_path}/odd\\xff\\\\x.lock"}


def test_a_forked_child_starts_from_zero(tmp_path, observed):
    lock = pylock.Lock(tmp_path / "f.lock")
    lock.acquire()
    lock.release()
    assert metrics.total().releases == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it counts as its own, and exit
        try:
            before = metrics.total().releases, len(metrics.snapshot())
            lock.acquire()
            lock.release()
            after = lock.stats.releases
            os.write(write, f"{before[0]} {before[1]} {after}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(pid, 0)
    assert reported == "0 0 1"
    assert metrics.total().releases == 1  # the parent's own, untouched
