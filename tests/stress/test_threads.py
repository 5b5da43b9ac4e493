"""Threads: 16 threads of one process hammer shared and separate Lock objects
on one path (blocking, with, timed, non-blocking, async, async timed, async
cancelled) under an overlap detector that does not trust pylock.  Written
for free-threaded CPython (`nox -s freethreaded` runs it there, where nothing
serialises the threads but pylock); it runs on every CPython.

The scenario runs in a child process, so a hang or a crash fails this test
with the child's thread stacks instead of stalling or killing the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import env_with_repo
from tests.support.sizes import Figures, size

THREADS = 16
SECTIONS = size(ci=300, large=3000)  # per thread
DEADLINE = 240.0  # s; far beyond a healthy run (seconds), short of CI's patience


def run_stress(path: Path, sections: int, control: bool = False) -> dict:
    argv = [sys.executable, "-m", "tests.support.threadstress", str(path), str(THREADS)]
    argv += [str(sections), "1", *(["none"] if control else [])]
    env = env_with_repo({**os.environ, "PYLOCK_THREADS_DEADLINE": str(DEADLINE)})
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=DEADLINE + 60)
    assert proc.returncode == 0, (
        f"the stress child {'crashed' if proc.returncode < 0 else 'failed or hung'} "
        f"(exit {proc.returncode}):\n{proc.stderr[-6000:]}"
    )
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def test_sixteen_threads_never_overlap(tmp_path: Path, figures: Figures) -> None:
    result = run_stress(tmp_path / "threads.lock", SECTIONS)
    figures(**result)
    assert result["errors"] == []
    assert result["overlaps"] == 0 and result["token_mismatches"] == 0
    assert result["sections"] == THREADS * SECTIONS
    assert all(result["by_way"].values()), result["by_way"]  # every way was taken
    assert result["still_held_after"] == [] and result["free_after"]
    # On a free-threaded build nothing may have turned the GIL back on.
    assert not (result["free_threaded_build"] and result["gil_enabled"])


def test_detector_sees_overlaps_without_a_lock(tmp_path: Path) -> None:
    """The control: the same threads taking no lock must be caught overlapping,
    or zero overlaps above would mean a blind detector."""
    result = run_stress(tmp_path / "control.lock", 200, control=True)
    assert result["errors"] == []
    assert result["overlaps"] > 0 and result["token_mismatches"] > 0, result
