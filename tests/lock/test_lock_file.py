"""The lock file: pylock writes only into a file that is empty or already holds
a pylock record, decided under the lock at each acquisition; anything else is
locked and left byte for byte as it was.  Inputs that name no lock file are
refused."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pylock
from pylock._lock import record as _record
from tests.support import REPO_ROOT, env_with_repo

SETTINGS = b'{"theme": "dark", "retries": 3}\n'


def held_by_other_process(path: str) -> bool:
    return subprocess.run(["flock", "-n", path, "true"]).returncode == 1


def descriptor_access_mode(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
    return flags & getattr(os, "O_ACCMODE", 3)  # Linux's value; PyPy's os lacks it


# -- item 1: never destroy data ------------------------------------------------------


@pytest.mark.parametrize("info", [None, {"port": 1}])
def test_a_file_that_is_not_pylocks_is_locked_and_never_written(
    lock_path: str, info: dict | None, caplog: pytest.LogCaptureFixture
) -> None:
    Path(lock_path).write_bytes(SETTINGS)
    lock = pylock.Lock(lock_path, info=info)
    for _ in range(2):
        with lock:
            assert held_by_other_process(lock_path)
            found = lock.holder()
            assert found is not None and found.pid == os.getpid() and found.verified
            assert found.info is None and found.acquired_at is None
        assert Path(lock_path).read_bytes() == SETTINGS
    # Nothing went wrong, so nothing is logged: not writing into data is the design.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_decision_is_made_under_the_lock_at_each_acquisition(lock_path: str) -> None:
    """One Lock object, a file that changes between its acquisitions: the
    record goes only into an empty file or over a record."""
    lock = pylock.Lock(lock_path, info={"n": 1})
    with lock:  # a new, empty file: the record goes in
        assert _record.parse(Path(lock_path).read_bytes()) is not None
    Path(lock_path).write_bytes(SETTINGS)  # someone replaces its contents
    with lock:
        pass
    assert Path(lock_path).read_bytes() == SETTINGS
    # Someone's data of exactly the record's length is read, not assumed ours.
    Path(lock_path).write_bytes(b"")
    with lock:
        pass
    record_len = os.path.getsize(lock_path)
    same_size = b"x" * record_len
    Path(lock_path).write_bytes(same_size)
    fresh = pylock.Lock(lock_path, info={"n": 1})
    with fresh:
        pass
    assert Path(lock_path).read_bytes() == same_size
    Path(lock_path).write_bytes(b"")  # emptied: the record goes in again
    with lock:
        assert _record.parse(Path(lock_path).read_bytes()) is not None


def test_a_running_program_is_locked_read_only(tmp_path: Path) -> None:
    """Opening a running executable for writing fails with ETXTBSY: it is
    locked through a read-only descriptor instead, and never touched."""
    program = tmp_path / "sleeper"
    shutil.copy("/bin/sleep", program)
    before = hashlib.sha256(program.read_bytes()).hexdigest()
    proc = subprocess.Popen([str(program), "1000"])
    try:
        with pytest.raises(OSError) as busy:
            os.close(os.open(program, os.O_RDWR))
        assert busy.value.errno == errno.ETXTBSY
        lock = pylock.Lock(program)
        with lock:
            assert held_by_other_process(str(program))
            assert descriptor_access_mode(lock._handle) == os.O_RDONLY
        assert hashlib.sha256(program.read_bytes()).hexdigest() == before
    finally:
        proc.kill()
        proc.wait()


def test_a_script_that_locks_itself_keeps_its_text(tmp_path: Path) -> None:
    """flock(1)'s self-locking idiom, through pylock run: the script locks its
    own file, and runs the same the second time."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'"{sys.executable}" -m pylock run -n "$0" -- echo "ran under the lock"\n'
        "echo done\n"
    )
    script.chmod(0o755)
    text = script.read_bytes()
    for _ in range(2):
        out = subprocess.run(
            [str(script)], env=env_with_repo(), cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout == "ran under the lock\ndone\n"
        assert script.read_bytes() == text


def test_record_false_never_writes_nor_opens_for_writing(lock_path: str) -> None:
    lock = pylock.Lock(lock_path, record=False)
    with lock:
        assert held_by_other_process(lock_path)
        assert descriptor_access_mode(lock._handle) == os.O_RDONLY
        found = lock.holder()
        assert found is not None and found.pid == os.getpid() and found.verified
    assert os.path.getsize(lock_path) == 0  # created, empty, and left so
    with pytest.raises(ValueError):
        pylock.Lock(lock_path, record=False, info={"x": 1})


# -- item 9: inputs that name no lock file -------------------------------------------


def test_the_empty_path_is_refused() -> None:
    with pytest.raises(pylock.LockFileError) as refused:
        pylock.Lock("")
    assert refused.value.errno == errno.ENOENT and "empty" in str(refused.value)
    with pytest.raises(pylock.LockFileError):
        pylock.holders("")


# Read-only files (0444): a broken pylock could not change the kernel's settings.
PSEUDO_FILES = {
    "proc": ["/proc/self/status"],
    "sysfs": ["/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "/sys/kernel/notes"],
    "cgroup": [
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/unified/cgroup.controllers",
        "/sys/fs/cgroup/pids/cgroup.sane_behavior",
    ],
}


@pytest.mark.parametrize("fs", list(PSEUDO_FILES))
def test_pseudo_filesystems_are_refused(fs: str) -> None:
    path = next((p for p in PSEUDO_FILES[fs] if os.path.isfile(p)), None)
    if path is None:
        pytest.skip(f"no {fs} file on this machine")
    before = Path(path).read_bytes() if fs != "proc" else b""
    lock = pylock.Lock(path)
    with pytest.raises(pylock.LockFileError) as refused:
        lock.acquire(blocking=False)
    assert not lock.locked
    assert fs in str(refused.value) and path in str(refused.value)
    assert refused.value.errno == errno.EINVAL
    if before:
        assert Path(path).read_bytes() == before
    with pytest.raises(pylock.LockFileError):
        pylock.Lock(path).holder()


@pytest.mark.parametrize("mode", [0o1777, 0o4755, 0o2644, 0o10000, -1, True])
def test_mode_takes_permission_bits_only(lock_path: str, mode: int) -> None:
    with pytest.raises(ValueError):
        pylock.Lock(lock_path, mode=mode)
    assert not os.path.exists(lock_path)


def test_mode_0o777_is_taken(lock_path: str) -> None:
    with pylock.Lock(lock_path, mode=0o777):
        assert os.stat(lock_path).st_mode & 0o7777 == 0o777
