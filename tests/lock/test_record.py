"""The holder record: written after the lock is taken, best effort; a reader
never takes a torn, partial or garbage record for a real one, and nothing in
the file can break locking."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylock
from pylock._core.process import self_identity
from pylock._lock import record as _record
from tests.support import mounts
from tests.support.children import Forked
from tests.support.kernel_locks import free_from_elsewhere
from tests.support.procs import NOBODY

HEADER = re.compile(rb"\Apylock-record v1 (\d+) ([0-9a-f]{8})\n")


def read_record(path: str) -> tuple[dict, bytes]:
    """The record at offset 0 of path, checked against the documented layout."""
    with open(path, "rb") as f:
        raw = f.read()
    match = HEADER.match(raw)
    assert match, raw[:80]
    length, crc = int(match.group(1)), int(match.group(2), 16)
    payload = raw[match.end() : match.end() + length]
    assert len(payload) == length and zlib.crc32(payload) == crc
    return json.loads(payload), raw[: match.end() + length]


def held_by_other_process(path: str) -> bool:
    """A second process is refused while the lock is held."""
    return subprocess.run(["flock", "-n", path, "true"]).returncode == 1


# -- what is written -------------------------------------------------------------


def test_exclusive_holder_writes_its_record_after_locking(lock_path: str) -> None:
    before = time.time()
    with pylock.Lock(lock_path, info={"port": 9000, "v": [1, 2]}):
        after = time.time()
        fields, raw = read_record(lock_path)
        me = self_identity()
        assert fields["pid"] == os.getpid() == me.pid
        assert fields["start_time"] == me.start_time
        assert fields["boot_id"] == me.boot_id
        assert fields["pidfs_ino"] == me.pidfs_ino
        assert fields["host"] == socket.gethostname()
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        assert fields["program"] == os.path.basename(argv[0])
        assert fields["argv"] == argv[:64]  # the command line, as the kernel has it
        assert fields["info"] == {"port": 9000, "v": [1, 2]}
        assert before - 1 <= fields["acquired_at"] <= after + 1
        assert _record.parse(raw) == fields
    # Release leaves the record; it names a process that no longer holds the lock.
    assert read_record(lock_path)[0]["pid"] == os.getpid()
    assert pylock.Lock(lock_path).holder() is None


def test_shared_holders_write_no_record(lock_path: str) -> None:
    with pylock.Lock(lock_path, shared=True):
        assert os.path.getsize(lock_path) == 0
        found = pylock.Lock(lock_path).holder()
        assert found is not None and found.pid == os.getpid() and found.shared
        assert found.verified


def test_shorter_record_over_a_longer_one(lock_path: str) -> None:
    with pylock.Lock(lock_path, info={"pad": "x" * 2000}):
        pass
    long_size = os.path.getsize(lock_path)
    with pylock.Lock(lock_path, info={"small": 1}) as lock:
        fields, raw = read_record(lock_path)
        assert fields["info"] == {"small": 1}
        assert len(raw) < long_size <= os.path.getsize(lock_path)  # the old tail stays
        found = lock.holder()
        assert found is not None and found.info == {"small": 1}


def test_record_format_round_trip() -> None:
    template = _record.RecordTemplate(self_identity(), {"k": "v"})
    raw = template.render(now=1795975229.5)
    fields = _record.parse(raw)
    assert fields is not None
    assert fields["acquired_at"] == 1795975229.5 and fields["info"] == {"k": "v"}
    assert HEADER.match(raw)
    assert _record.parse(_record.encode(b'{"pid": 7}')) == {"pid": 7}


def test_info_too_large_is_refused() -> None:
    with pytest.raises(ValueError):
        _record.RecordTemplate(self_identity(), {"big": "x" * (_record.MAX_INFO + 1)})


# -- what a reader accepts ---------------------------------------------------------


def test_torn_and_corrupted_records_are_no_record() -> None:
    raw = _record.RecordTemplate(self_identity(), {"port": 1}).render()
    assert _record.parse(raw) is not None
    for cut in range(len(raw)):  # every partial write
        assert _record.parse(raw[:cut]) is None, cut
    for i in range(len(raw)):  # every single flipped byte
        damaged = raw[:i] + bytes([raw[i] ^ 0x20]) + raw[i + 1 :]
        parsed = _record.parse(damaged)
        assert parsed is None or parsed == _record.parse(raw), i


def _valid(payload: bytes) -> bytes:
    return _record.encode(payload)


GARBAGE = {
    "random bytes": os.urandom(4096),
    "zeros": b"\0" * 8192,
    "text": b"hello, I am not a record\n" * 10,
    "magic only": b"pylock-record v1 ",
    "huge length": b"pylock-record v1 999999999 deadbeef\n{}",
    "negative length": b"pylock-record v1 -5 00000000\n{}",
    "no newline": b"pylock-record v1 " + b"1" * 200,
    "bad crc": b"pylock-record v1 10 00000000\n" + b'{"pid": 1}',
    "not json": _valid(b"{pid: 1,"),
    "json list": _valid(b"[1, 2, 3]"),
    "no pid": _valid(b'{"host": "x"}'),
    "pid as text": _valid(b'{"pid": "1"}'),
    "torn": _valid(json.dumps({"pid": 1, "argv": ["x"] * 50}).encode())[:120],
    "older format": b"pylock-record v0 10 00000000\n" + b'{"pid": 1}',
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_in_the_file_never_breaks_locking(lock_path: str, kind: str, forked_raw) -> None:
    data = GARBAGE[kind]
    Path(lock_path).write_bytes(data)
    assert _record.parse(data) is None
    assert pylock.Lock(lock_path).holder() is None

    # A holder that writes no record: the kernel names it.
    raw_pid = forked_raw(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == raw_pid and found.verified
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert f"pid {raw_pid}" in str(info.value)


def test_a_10_mib_file_at_the_lock_path(lock_path: str) -> None:
    """Someone's 10 MiB of data: locked, named from the kernel, never written."""
    data = os.urandom(1024) * 10 * 1024
    Path(lock_path).write_bytes(data)
    assert pylock.Lock(lock_path).holder() is None
    with pylock.Lock(lock_path, info={"ok": 1}) as lock:
        assert held_by_other_process(lock_path)
        found = lock.holder()
        assert found is not None and found.pid == os.getpid() and found.verified
        assert found.info is None  # no record could be written: the file is not pylock's
    assert Path(lock_path).read_bytes() == data


@pytest.fixture
def forked_raw() -> Iterator:
    """Fork children that hold a bare flock (no record) until the test ends."""
    children: list[tuple[int, int]] = []

    def start(path: str) -> int:
        ready_r, ready_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            import fcntl

            try:
                os.close(ready_r)
                os.close(stop_w)
                fd = os.open(path, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(ready_w, b"x")
                os.read(stop_r, 1)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(stop_r)
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        children.append((pid, stop_w))
        return pid

    yield start
    for pid, stop_w in children:
        os.close(stop_w)
        os.waitpid(pid, 0)


# -- when the record cannot be written ------------------------------------------------


@pytest.mark.root
def test_full_disk_lock_still_works_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with mounts.tmpfs(size="64k") as d:
        filled = mounts.fill_space(d)
        assert filled > 0
        path = os.path.join(d, "x.lock")
        lock = pylock.Lock(path, info={"port": 1})
        with caplog.at_level(logging.WARNING, logger="pylock"):
            lock.acquire()
        assert lock.locked
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, caplog.text
        assert path in warnings[0].getMessage()
        assert "could not be written" in warnings[0].getMessage()
        assert os.path.getsize(path) == 0  # no record, not even a torn one

        assert held_by_other_process(path)
        found = lock.holder()  # the kernel still tells the truth
        assert found is not None and found.pid == os.getpid() and found.verified
        assert found.info is None  # what only the record could have said
        lock.release()
        assert free_from_elsewhere(path)
        lock.close()


@pytest.mark.root
def test_full_disk_holder_in_another_process(spawn_holder) -> None:
    with mounts.tmpfs(size="64k") as d:
        mounts.fill_space(d)
        path = os.path.join(d, "x.lock")
        holder = spawn_holder(path)
        found = pylock.Lock(path).holder()
        assert found is not None and found.pid == holder.pid and found.verified
        assert found.acquired_at is None  # named by the kernel, not a record
        with pytest.raises(pylock.LockHeld) as info:
            pylock.Lock(path).acquire(blocking=False)
        assert f"pid {holder.pid}" in str(info.value)
        holder.release()
        assert free_from_elsewhere(path)


@pytest.mark.root
def test_read_only_filesystem_lock_works_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    def populate(d: str) -> None:
        Path(d, "x.lock").touch()

    with mounts.readonly_tmpfs(populate) as d:
        path = os.path.join(d, "x.lock")
        lock = pylock.Lock(path)
        with caplog.at_level(logging.WARNING, logger="pylock"):
            lock.acquire()
        assert lock.locked and held_by_other_process(path)
        found = lock.holder()
        assert found is not None and found.pid == os.getpid() and found.verified
        lock.release()
        assert free_from_elsewhere(path)
        lock.close()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(path in w and "could not be written" in w for w in warnings), warnings


@pytest.mark.root
def test_read_only_lock_file_of_another_user(public_dir: Path, spawn_holder) -> None:
    """A file the user may read but not write can still be locked, without a record."""
    path = public_dir / "x.lock"
    path.touch()
    os.chmod(path, 0o644)

    def hold(chan: Forked.Chan) -> None:
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logging.getLogger("pylock").addHandler(handler)
        lock = pylock.Lock(path)
        lock.acquire(timeout=10)
        chan.say(f"locked {len(records)}")
        chan.until_closed()  # hold until the test has looked

    child = Forked(hold, user=NOBODY)
    try:
        word, warnings = child.line().split()
        assert word == "locked"
        assert held_by_other_process(str(path))
        found = pylock.Lock(path).holder()
        assert found is not None and found.pid == child.pid and found.verified
        assert os.path.getsize(path) == 0
        assert int(warnings) == 1, "no warning that the record could not be written"
        child.close_input()
        assert child.wait() == 0
    finally:
        child.kill()


def test_acquired_at_is_utc(lock_path: str) -> None:
    with pylock.Lock(lock_path) as lock:
        found = lock.holder()
        assert found is not None and found.acquired_at is not None
        assert found.acquired_at.tzinfo is not None
        assert found.acquired_at.utcoffset() == dt.timedelta(0)
        assert abs(found.acquired_at.timestamp() - time.time()) < 60
