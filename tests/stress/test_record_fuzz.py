"""The record fuzz at full size, and holder() in a loop beside an acquirer.

Large size: 100,000 fuzzed records through the reader and every use of a
record (tests/lock/test_record_fuzz.py runs a quick sample in the normal suite),
and 20,000 non-blocking acquisitions beside a process calling holder() in a
loop, which before pylock stopped probing were refused about 3 times.
"""

from __future__ import annotations

import subprocess
import sys
import time

from hypothesis import HealthCheck, given, settings

import pylock
from tests.lock.test_record_fuzz import RAW_RECORDS, cases_checked, check_record
from tests.support import env_with_repo
from tests.support.sizes import Figures, size

FUZZ_CASES = size(1_000, 100_000)
PROBE_ROUNDS = size(2_000, 20_000)


def test_record_fuzz(figures: Figures) -> None:
    before = cases_checked[0]
    started = time.monotonic()

    @settings(
        max_examples=FUZZ_CASES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(RAW_RECORDS)
    def fuzz(raw: bytes) -> None:
        check_record(raw)

    fuzz()
    cases = cases_checked[0] - before
    figures(cases=cases, seconds=round(time.monotonic() - started, 1))
    assert cases >= FUZZ_CASES


def test_holder_in_a_loop_never_refuses_an_acquirer(lock_path: str, figures: Figures) -> None:
    open(lock_path, "w").close()
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pylock\nlock = pylock.Lock(sys.argv[1])\n"
            "print('ready', flush=True)\nwhile True: lock.holder()",
            lock_path,
        ],
        env=env_with_repo(),
        stdout=subprocess.PIPE,
        text=True,
    )
    refused = 0
    try:
        assert monitor.stdout is not None and monitor.stdout.readline() == "ready\n"
        lock = pylock.Lock(lock_path)
        for _ in range(PROBE_ROUNDS):
            try:
                lock.acquire(blocking=False)
            except pylock.LockHeld:
                refused += 1
            else:
                lock.release()
    finally:
        monitor.kill()
        monitor.wait()
        if monitor.stdout is not None:
            monitor.stdout.close()
    figures(rounds=PROBE_ROUNDS, refused=refused)
    assert refused == 0
