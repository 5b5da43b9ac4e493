"""Chaos exclusion: 8 processes hammer one lock while a killer SIGKILLs holders.

See tests/support/chaos.py for the mechanics (token file, logs, conductor).
"""

from __future__ import annotations

import os
from pathlib import Path

import pylock
from tests.support.chaos import ALL_MODES, ChaosResult, run_chaos
from tests.support.sizes import Figures, size

WORKERS = size(8, 16)
SECTIONS = size(2000, 5000)
DEADLINE = size(300, 1800)


def _check(result: ChaosResult, lock_path: str) -> None:
    assert not result.worker_failures, "\n".join(result.worker_failures[:3])
    assert not result.stuck, "stuck waiters:\n" + "\n".join(result.stuck)
    assert not result.overlaps, "overlapping critical sections:\n" + "\n".join(result.overlaps[:10])
    assert not result.bad_entries, "\n".join(result.bad_entries[:10])
    assert not result.diagnostics, "\n".join(result.diagnostics[:10])
    assert result.completed == result.workers * result.sections_per_worker
    # Every kill of a holder was followed by a next holder, woken by the death:
    # a poll or a stuck wakeup would show as tens or hundreds of ms.
    assert result.kills_without_successor == 0
    assert result.holder_kills >= result.requested_kills > 0
    lat = result.latency_summary()
    assert lat["p50_ms"] < 10, result.report()
    assert lat["max_ms"] < 500, result.report()
    # Nobody is left holding or waiting: the lock is free and the kernel shows no holder.
    assert pylock.holders(lock_path) == []
    if os.path.exists(lock_path):
        lock = pylock.Lock(lock_path)
        assert lock.acquire(blocking=False)
        lock.release()
        lock.close()


def _figures(result: ChaosResult) -> dict[str, object]:
    return {
        "processes x sections": f"{result.workers} x {result.sections_per_worker}",
        "elapsed_s": round(result.elapsed_s, 1),
        "critical sections completed": result.completed,
        "entries (incl. killed)": result.entries,
        "holders killed": result.holder_kills,
        "kills on request / random": f"{result.requested_kills} / {result.random_kills}",
        "overlaps": len(result.overlaps),
        "stuck": len(result.stuck),
        "timed-out/refused/cancelled attempts retried": result.retries,
        "kill -> next holder": result.latency_summary(),
        "histogram": dict(result.histogram()),
    }


def test_chaos_exclusion(tmp_path: Path, figures: Figures) -> None:
    result = run_chaos(
        str(tmp_path), workers=WORKERS, sections=SECTIONS, deadline_s=DEADLINE, seed="chaos"
    )
    print(result.report())
    figures(**_figures(result))
    assert set(result.modes) == set(ALL_MODES)
    _check(result, str(tmp_path / "chaos.lock"))


def test_unlink_chaos(tmp_path: Path, figures: Figures) -> None:
    """Half the releases remove the lock file while others wait on it."""
    result = run_chaos(
        str(tmp_path),
        workers=WORKERS,
        sections=SECTIONS,
        deadline_s=DEADLINE,
        unlink_p=0.5,
        seed="unlink",
    )
    print(result.report())
    figures(**_figures(result))
    _check(result, str(tmp_path / "chaos.lock"))


def test_detector_sees_overlaps_without_a_lock(tmp_path: Path) -> None:
    """Control: the same workers with no lock at all must be caught overlapping,
    so zero overlaps above means exclusion, not a blind detector."""
    result = run_chaos(str(tmp_path), workers=4, sections=100, impl="none", deadline_s=120)
    assert result.overlaps or result.bad_entries, result.report()


def test_harness_agrees_with_raw_flock(tmp_path: Path) -> None:
    """Control: raw fcntl.flock through the same harness shows zero overlaps."""
    result = run_chaos(
        str(tmp_path),
        workers=4,
        sections=200,
        impl="flock",
        modes=("sync", "with", "async", "async_with"),
        deadline_s=120,
    )
    assert not result.problems, result.report()
    assert result.completed == 800
