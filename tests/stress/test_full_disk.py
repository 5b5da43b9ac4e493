"""Full disk and few inodes: the lock works where its file exists, a record
that cannot be written is a warning, diagnostics still tell the truth, and a
file that cannot be created is a clear, immediate error."""

from __future__ import annotations

import errno
import json
import logging
import os
import time

import pytest

import pylock
from tests.support import mounts
from tests.support.procs import Script
from tests.support.sizes import Figures

# Another process's view: try the lock once and report who holds it.
PROBE = r"""
import json, sys, pylock
try:
    pylock.Lock(sys.argv[1]).acquire(blocking=False)
    print("acquired")
except pylock.LockHeld as e:
    h = e.holder
    print("held " + json.dumps(None if h is None else {
        "pid": h.pid, "verified": h.verified, "info": h.info, "message": str(e)}))
"""


def _probe(path: str) -> dict[str, object] | None:
    s = Script(PROBE, path)
    try:
        out = s.expect("held")
        return dict(json.loads(out))
    finally:
        s.close()


def _record_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pylock" and r.levelno == logging.WARNING and "record" in r.getMessage()
    ]


pytestmark = pytest.mark.root  # every scenario mounts a tiny tmpfs


def test_full_tmpfs_existing_file_locks_with_a_warning(
    caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    with mounts.tmpfs(size="64k") as d:
        path = os.path.join(d, "full.lock")
        open(path, "wb").close()
        filled = mounts.fill_space(d)
        caplog.set_level(logging.WARNING, logger="pylock")
        lock = pylock.Lock(path, info={"role": "full-disk"})
        assert lock.acquire(blocking=False)
        try:
            warnings = _record_warnings(caplog)
            assert len(warnings) == 1, caplog.text
            assert path in warnings[0]
            assert os.strerror(errno.ENOSPC) in warnings[0]
            # The kernel still names the holder, to this process and to others.
            me = lock.holder()
            assert me is not None and me.pid == os.getpid() and me.verified
            assert [h.pid for h in pylock.holders(path)] == [os.getpid()]
            seen = _probe(path)
            assert seen is not None and seen["pid"] == os.getpid() and seen["verified"]
            assert f"pid {os.getpid()}" in str(seen["message"])
        finally:
            lock.release()
            lock.close()
        assert lock.holder() is None
        figures(filesystem="tmpfs size=64k", filled_bytes=filled, warnings=warnings)


def test_full_tmpfs_stale_record_never_names_the_dead(caplog: pytest.LogCaptureFixture) -> None:
    """A dead holder's record stays in the file and the new, longer record cannot
    be written (a torn write at most): nobody may read the dead one as holder."""
    with mounts.tmpfs(size="64k") as d:
        path = os.path.join(d, "stale.lock")
        dead = Script(
            "import sys, pylock\n"
            "l = pylock.Lock(sys.argv[1], info={'who': 'dead'})\n"
            "l.acquire()\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
            path,
        )
        dead.expect("held")
        dead.kill()
        with open(path, "rb") as f:
            stale = f.read()
        assert b'"who":"dead"' in stale
        mounts.fill_space(d)
        caplog.set_level(logging.WARNING, logger="pylock")
        # A record larger than the page the stale one sits in needs a new page.
        lock = pylock.Lock(path, info={"pad": "x" * 8000})
        lock.acquire()
        try:
            assert _record_warnings(caplog), caplog.text
            h = lock.holder()
            assert h is not None and h.pid == os.getpid() and h.verified
            assert h.info is None or h.info.get("who") != "dead"
            seen = _probe(path)
            assert seen is not None and seen["pid"] == os.getpid()
            assert seen["info"] is None or "who" not in str(seen["info"])
        finally:
            lock.release()
            lock.close()
        dead.close()


def test_out_of_inodes(figures: Figures) -> None:
    with mounts.tmpfs(size="1m", nr_inodes=8) as d:
        existing = os.path.join(d, "existing.lock")
        open(existing, "wb").close()
        made = mounts.exhaust_inodes(d)
        # Where the file exists, everything works, record included.
        lock = pylock.Lock(existing, info={"k": 1})
        lock.acquire()
        h = lock.holder()
        assert h is not None and h.verified and h.info == {"k": 1}
        lock.release()
        lock.close()
        # A new file cannot be created: a clear error at once, never a wait.
        missing = os.path.join(d, "missing.lock")
        t0 = time.monotonic()
        with pytest.raises(pylock.LockFileError) as info:
            pylock.Lock(missing).acquire(timeout=30)
        elapsed = time.monotonic() - t0
        assert info.value.errno == errno.ENOSPC
        assert info.value.filename == missing
        assert missing in str(info.value)
        assert "inodes" in str(info.value)
        assert elapsed < 5
        assert not os.path.exists(missing)
        # holder() of a file that cannot exist: nobody holds it.
        assert pylock.Lock(missing).holder() is None
        figures(filesystem="tmpfs nr_inodes=8", files_made_to_exhaust=made, error=str(info.value))


def test_full_tmpfs_missing_file_still_creatable() -> None:
    """No space left but inodes free: an empty lock file can still be created
    and locked; only the record is lost."""
    with mounts.tmpfs(size="64k") as d:
        mounts.fill_space(d)
        path = os.path.join(d, "new.lock")
        lock = pylock.Lock(path)
        lock.acquire()
        try:
            h = lock.holder()
            assert h is not None and h.pid == os.getpid() and h.verified
        finally:
            lock.release()
            lock.close()
