"""Resource hygiene: 100,000 acquire/release cycles, 1,000 timed-out and 1,000
cancelled async acquisitions leave descriptors and threads at their baseline
and RSS within 1 MiB (measured in a fresh process, tests/support/hygiene.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import env_with_repo
from tests.support.sizes import Figures, size

CYCLES = size(100_000, 1_000_000)
TIMEOUTS = size(1_000, 10_000)
CANCELS = size(1_000, 10_000)


def test_no_descriptor_thread_or_memory_growth(tmp_path: Path, figures: Figures) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.hygiene",
            str(tmp_path / "hygiene.lock"),
            str(CYCLES),
            str(TIMEOUTS),
            str(CANCELS),
        ],
        capture_output=True,
        text=True,
        env=env_with_repo(),
        timeout=size(600, 3600),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    base, end = out["base"], out["end"]
    growth = end["rss"] - base["rss"]
    figures(
        cycles=CYCLES,
        timed_out=out["timed_out"],
        cancelled=out["cancelled"],
        seconds={
            "cycles": out["cycles_s"],
            "timeouts": out["timeouts_s"],
            "cancels": out["cancels_s"],
        },
        fds=f"{base['fds']} -> {end['fds']}",
        threads=f"{base['threads']} -> {end['threads']}",
        rss_growth_kib=growth // 1024,
    )
    assert out["timed_out"] == TIMEOUTS
    assert out["cancelled"] == CANCELS + CANCELS // 10
    # Descriptors and threads: back to baseline after every phase (the holder's
    # pipes are the only extra descriptors while it runs).
    assert out["after_cycles"]["fds"] == base["fds"]
    assert out["after_timeouts"]["fds"] == out["during_holder"]["fds"]
    assert out["after_cancels"]["fds"] == out["during_holder"]["fds"]
    assert end["fds"] == base["fds"]
    for phase in ("after_cycles", "after_timeouts", "after_cancels", "end"):
        assert out[phase]["threads"] == base["threads"] == 1, (phase, out[phase])
    # Nobody was left queued: once the holder left, nothing holds the lock.
    assert out["holders_after"] == []
    if sys.implementation.name == "cpython":
        # PyPy's collector lets its heap grow before it collects (14 MiB over
        # these cycles here): its RSS says nothing of a leak; fds and threads do.
        assert growth < 1024 * 1024, f"RSS grew {growth} bytes"
