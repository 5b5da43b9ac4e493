"""Recycled pids never fool holder(), holder_exit, wait_exit or verified.

Each trial kills a lock holder and hands its pid to an impostor at once, in a
private pid namespace (tests/support/pidreuse.py has the full protocol). Run
once with pidfd (pinning) and once with the pidfd syscalls failing with
ENOSYS, as on kernels before 5.3 (the start-time identity fallback).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import pidns
from tests.support.pidreuse import CHECKS
from tests.support.sizes import Figures, size

TRIALS = size(100, 500)

SCRIPT = "from tests.support.pidreuse import main; main()"


@pytest.mark.root  # pid namespaces with a chosen pid (ns_last_pid)
@pytest.mark.parametrize("path_kind", ["pidfd", "fallback"])
def test_recycled_pids_never_fool_pylock(tmp_path: Path, path_kind: str, figures: Figures) -> None:
    reason = pidns.available()
    if reason:
        pytest.skip(reason)
    old_kernel = path_kind == "fallback"
    data = pidns.run_json_in_pidns(
        SCRIPT,
        str(tmp_path / "reuse.lock"),
        str(TRIALS),
        "300",
        old_kernel=old_kernel,
        timeout=size(600, 3000),
    )
    figures(
        path=path_kind,
        trials=data["trials"],
        pinning=data["pinning"],
        passed=data["passed"],
        pid_conflicts_retried=data["pid_conflicts"],
        armed_waits_returned_within_s=data["armed_wait_max_s"],
        late_holder_exit_max_s=data["late_holder_exit_max_s"],
    )
    # The run really took the path it names.
    assert data["pinning"] is (not old_kernel)
    if old_kernel:
        assert data["pidfs_in_snapshots"] == 0
    assert data["failures"] == [], data["failures"]
    assert data["passed"] == dict.fromkeys(CHECKS, TRIALS)
