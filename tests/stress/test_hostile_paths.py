"""Hostile and bad lock paths: each gives the documented behaviour or a
specific error naming the path, at once; never a hang, never a crash.

Anything that could hang runs in a forked child with a deadline
(tests.support.procs.in_child), so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pylock
from pylock._core.errors import NOT_REGULAR, SYMLINK
from pylock._core.process import identity_of
from pylock._lock import record as _record
from tests.support import mounts
from tests.support.procs import NOBODY, Script, become, in_child
from tests.support.sizes import Figures

PERMANENT_TIMEOUT = 30.0  # a permanent error must not turn into this wait
AT_ONCE = 2.0  # "at once", generously, for a loaded CI machine


def _try_lock(path: str, **kw: Any) -> Any:
    lock = pylock.Lock(path, **kw)
    lock.acquire(timeout=PERMANENT_TIMEOUT)
    try:
        h = lock.holder()
        return {"pid": h.pid if h else None, "verified": h.verified if h else None}
    finally:
        lock.release()
        lock.close()


def _assert_lock_file_error(
    res: dict[str, Any], path: str, code: int, words: str, errno_value: int | None = None
) -> None:
    """A LockFileError naming path, raised at once. code is pylock's own code
    (LockFileError.code); errno_value the real errno when it differs."""
    assert not res.get("hang"), f"{path}: hung"
    assert res.get("exc") == "LockFileError", res
    assert "OSError" in res["mro"] and "LockError" in res["mro"]
    assert res["code"] == code, res
    assert res["errno"] == (code if errno_value is None else errno_value), res
    assert res["filename"] == path.replace("\0", "\\0"), res
    assert words in res["msg"], res
    assert res["elapsed"] < AT_ONCE, res


# ---------------------------------------------------------------- symlinks


@pytest.mark.parametrize("kind", ["to_file", "dangling", "to_directory", "to_fifo"])
def test_symlink_as_lock_file_is_refused_and_target_untouched(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "to_file":
        target.write_bytes(b"precious data\n")
    elif kind == "to_directory":
        target.mkdir()
    elif kind == "to_fifo":
        os.mkfifo(target)
    link = str(tmp_path / "app.lock")
    os.symlink(target, link)
    before = os.lstat(target) if kind != "dangling" else None

    res = in_child(lambda: _try_lock(link))
    _assert_lock_file_error(res, link, SYMLINK, "symbolic link", errno.ELOOP)
    # Diagnostics do not follow it either (a FIFO target would block them).
    diag = in_child(lambda: repr(pylock.Lock(link).holder()))
    assert not diag.get("hang")
    assert diag.get("exc") == "LockFileError" or diag.get("value") == "None", diag

    if kind == "dangling":
        assert not target.exists(), "the symlink's target was created"
    else:
        after = os.lstat(target)
        assert before is not None
        assert (after.st_size, after.st_mtime_ns, after.st_mode) == (
            before.st_size,
            before.st_mtime_ns,
            before.st_mode,
        )
    if kind == "to_file":
        assert target.read_bytes() == b"precious data\n"


def _nobody_runs(fn: Any) -> dict[str, Any]:
    return in_child(fn, user=NOBODY)


class _UserHolder:
    """A process of another user holding a plain flock on path (no record)."""

    def __init__(self, path: str, user: tuple[int, int], record: bytes | None = None) -> None:
        ready_r, ready_w = os.pipe()
        self._hold_r, hold_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                os.close(hold_w)
                become(user)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
                if record is not None:
                    os.pwrite(fd, record, 0)
                os.write(ready_w, b"r")
                os.read(self._hold_r, 1)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(self._hold_r)
        self._hold_w = hold_w
        self.pid = pid
        assert os.read(ready_r, 1) == b"r"
        os.close(ready_r)

    def close(self) -> None:
        os.close(self._hold_w)
        os.waitpid(self.pid, 0)


def _identity_fields(pid: int) -> dict[str, Any]:
    """What a perfect forgery of pid's record would carry: pylock's own view."""
    ident = identity_of(pid)
    assert ident is not None
    return {
        "pid": ident.pid,
        "start_time": ident.start_time,
        "boot_id": ident.boot_id,
        "pidfs_ino": ident.pidfs_ino,
    }


def _crafted_record(pid: int, **extra: Any) -> bytes:
    fields = {
        **_identity_fields(pid),
        "host": socket.gethostname(),
        "program": "forged",
        "argv": ["forged", "--by", "attacker"],
        "info": {"forged": True},
        "acquired_at": time.time(),
        **extra,
    }
    return _record.encode(json.dumps(fields, separators=(",", ":")).encode())


@pytest.mark.root
def test_sticky_world_writable_directory_attacks(public_dir: Path) -> None:
    """The classic /tmp attacks by another user, in a sticky 1777 directory."""
    shared = public_dir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    precious = public_dir / "precious"
    precious.write_bytes(b"root's data\n")
    before = os.stat(precious)

    # 1. The attacker plants a symlink where root will lock.
    link = str(shared / "daemon.lock")
    res = _nobody_runs(lambda: os.symlink(precious, link))
    assert res == {"value": None, "elapsed": res["elapsed"]}, res
    assert os.lstat(link).st_uid == NOBODY[0]
    out = in_child(lambda: _try_lock(link))
    _assert_lock_file_error(out, link, SYMLINK, "symbolic link", errno.ELOOP)
    after = os.stat(precious)
    assert precious.read_bytes() == b"root's data\n"
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    # 2. The attacker pre-creates the lock file, holds it, and writes a record
    # naming the victim (this very test process): the victim is refused, and
    # the refusal names the attacker as the kernel shows, not the forgery.
    squat = str(shared / "squat.lock")
    attacker = _UserHolder(squat, NOBODY, record=_crafted_record(os.getpid()))
    try:
        with pytest.raises(pylock.LockHeld) as info:
            pylock.Lock(squat).acquire(blocking=False)
        h = info.value.holder
        assert h is not None
        assert h.pid == attacker.pid and h.verified
        assert h.info is None, "the forged record was attributed to the attacker"
        assert f"pid {attacker.pid}" in str(info.value)
        assert [x.pid for x in pylock.holders(squat)] == [attacker.pid]
    finally:
        attacker.close()
    # Released: the forged record naming us is not taken for a holder.
    assert pylock.Lock(squat).holder() is None


# ---------------------------------------------------------------- not a regular file


def _make_special(tmp_path: Path, kind: str) -> str:
    path = str(tmp_path / f"{kind}.lock")
    if kind == "directory":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif kind == "char_device":  # mknod: marked root
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "dev_null":
        path = "/dev/null"
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "directory",
        "fifo",
        "socket",
        pytest.param("char_device", marks=pytest.mark.root),  # mknod
        "dev_null",
    ],
)
def test_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = _make_special(tmp_path, kind)
    res = in_child(lambda: _try_lock(path))
    if kind == "directory":
        _assert_lock_file_error(res, path, errno.EISDIR, "directory")
    else:
        _assert_lock_file_error(res, path, NOT_REGULAR, "not a regular file", errno.EINVAL)
    # Diagnostics and async acquisition neither hang nor crash.
    for probe in (
        lambda: repr(pylock.Lock(path).holder()),
        lambda: repr(pylock.holders(path)),
        lambda: __import__("asyncio").run(pylock.Lock(path).acquire_async(timeout=30)),
    ):
        out = in_child(probe)
        assert not out.get("hang"), (kind, out)
        assert out.get("exc") in (None, "LockFileError"), (kind, out)
        assert out["elapsed"] < AT_ONCE


# ---------------------------------------------------------------- bad names


@pytest.mark.parametrize(
    "case",
    [
        "missing_parent",
        "parent_is_a_file",
        "name_too_long",
        "path_too_long",
        "nul_byte",
        "trailing_separator",
    ],
)
def test_bad_names_fail_at_once(tmp_path: Path, case: str) -> None:
    (tmp_path / "file").write_bytes(b"")
    path, code, words = {
        "missing_parent": (str(tmp_path / "no" / "such" / "x.lock"), errno.ENOENT, "create it"),
        "parent_is_a_file": (str(tmp_path / "file" / "x.lock"), errno.ENOTDIR, "not a directory"),
        "name_too_long": (str(tmp_path / ("n" * 300)), errno.ENAMETOOLONG, "too long"),
        "path_too_long": (
            str(tmp_path) + ("/" + "d" * 200) * 25 + "/x.lock",
            errno.ENAMETOOLONG,
            "too long",
        ),
        "nul_byte": (str(tmp_path / "a\0b.lock"), errno.EINVAL, "NUL byte"),
        "trailing_separator": (str(tmp_path / "x.lock") + "/", errno.EISDIR, "trailing separator"),
    }[case]
    res = in_child(lambda: _try_lock(path))
    _assert_lock_file_error(res, path, code, words)
    res = in_child(lambda: __import__("asyncio").run(pylock.Lock(path).acquire_async(timeout=30)))
    _assert_lock_file_error(res, path, code, words)
    assert not (tmp_path / "no").exists()


def test_relative_path_is_fixed_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    lock = pylock.Lock("rel.lock")
    assert lock.path == str(a / "rel.lock")
    monkeypatch.chdir(b)
    lock.acquire()
    try:
        assert (a / "rel.lock").exists()
        assert not (b / "rel.lock").exists()
        # Other spellings of the same file are the same lock.
        with pytest.raises(pylock.LockHeld):
            pylock.Lock(str(a / "rel.lock")).acquire(blocking=False)
        with pytest.raises(pylock.LockHeld):
            pylock.Lock("../a/./rel.lock").acquire(blocking=False)
        os.symlink(a, tmp_path / "alias")
        with pytest.raises(pylock.LockHeld):
            pylock.Lock(str(tmp_path / "alias" / "rel.lock")).acquire(blocking=False)
        # In b, the same relative name is another lock.
        other = pylock.Lock("rel.lock")
        other.acquire(blocking=False)
        other.release()
        other.close()
    finally:
        lock.release()
        lock.close()


# ---------------------------------------------------------------- permissions


@pytest.mark.root
def test_no_permission_as_an_unprivileged_user(public_dir: Path, figures: Figures) -> None:
    tmp_path = public_dir
    d = tmp_path / "rootdir"
    d.mkdir()
    os.chmod(d, 0o755)
    readable = d / "readable.lock"
    readable.write_bytes(b"")
    os.chmod(readable, 0o644)
    private = d / "private.lock"
    private.write_bytes(b"")
    os.chmod(private, 0o600)
    missing = str(d / "missing.lock")

    # Cannot create in a directory it may not write.
    res = in_child(lambda: _try_lock(missing), user=NOBODY)
    _assert_lock_file_error(res, missing, errno.EACCES, "permission denied")
    assert not os.path.exists(missing)
    # Cannot open at all.
    res = in_child(lambda: _try_lock(str(private)), user=NOBODY)
    _assert_lock_file_error(res, str(private), errno.EACCES, "permission denied")
    # May read but not write: the lock works (flock needs no write access),
    # without a record; the kernel still shows who holds it.
    res = in_child(lambda: _try_lock(str(readable)), user=NOBODY)
    assert "value" in res, res
    assert res["value"]["verified"] is True
    assert readable.read_bytes() == b""

    # A root holder seen by the unprivileged user: named from its record, but
    # it cannot be verified (root's fdinfo is not readable to nobody).
    pub = tmp_path / "pub"
    pub.mkdir()
    os.chmod(pub, 0o755)
    shared_lock = str(pub / "root-held.lock")
    lock = pylock.Lock(shared_lock, mode=0o644, info={"owner": "root"})
    lock.acquire()
    try:

        def look() -> Any:
            h = pylock.Lock(shared_lock).holder()
            try:
                pylock.Lock(shared_lock).acquire(blocking=False)
                refused = None
            except pylock.LockHeld as e:
                refused = str(e)
            return {
                "pid": h.pid if h else None,
                "verified": h.verified if h else None,
                "info": h.info if h else None,
                "note": h.note if h else None,
                "refused": refused,
            }

        seen = in_child(look, user=NOBODY)
    finally:
        lock.release()
        lock.close()
    assert "value" in seen, seen
    v = seen["value"]
    assert v["pid"] == os.getpid()
    assert v["verified"] is False
    assert v["refused"] and f"pid {os.getpid()}" in v["refused"]
    figures(
        missing_in_root_dir="LockFileError EACCES",
        root_file_0600="LockFileError EACCES",
        root_file_0644="locked read-only, no record",
        root_holder_seen_by_nobody=v,
    )


# ---------------------------------------------------------------- read-only filesystem


@pytest.mark.root
def test_read_only_filesystem(caplog: pytest.LogCaptureFixture, figures: Figures) -> None:
    def populate(d: str) -> None:
        Path(d, "existing.lock").write_bytes(b"")

    with mounts.readonly_tmpfs(populate) as d:
        existing = os.path.join(d, "existing.lock")
        caplog.set_level(logging.WARNING, logger="pylock")
        lock = pylock.Lock(existing)
        lock.acquire(blocking=False)
        try:
            h = lock.holder()
            assert h is not None and h.pid == os.getpid() and h.verified
            with pytest.raises(pylock.LockHeld):
                pylock.Lock(existing).acquire(blocking=False)
        finally:
            lock.release()
            lock.close()
        warnings = [r.getMessage() for r in caplog.records if r.name == "pylock"]
        missing = os.path.join(d, "missing.lock")
        res = in_child(lambda: _try_lock(missing))
        _assert_lock_file_error(res, missing, errno.EROFS, "read-only")
        figures(existing_file="locked, no record", warnings=warnings, missing_file=res["msg"])
        assert len(warnings) == 1 and "record" in warnings[0], warnings


# ---------------------------------------------------------------- records


def _garbage(kind: str) -> bytes:
    if kind == "random":
        return os.urandom(4096)
    if kind == "zeros":
        return b"\0" * 4096
    if kind == "bad_crc":
        good = _crafted_record(1)
        head, _, payload = good.partition(b"\n")
        return head[:-8] + b"%08x" % (zlib.crc32(payload) ^ 1) + b"\n" + payload
    if kind == "huge_length":
        return b"pylock-record v1 999999999999 00000000\n{}"
    if kind == "truncated":
        return _crafted_record(1)[:-10]
    if kind == "not_a_dict":
        return _record.encode(b"[1, 2, 3]")
    if kind == "pid_not_int":
        return _record.encode(b'{"pid": "1", "start_time": 0}')
    if kind == "bad_json":
        return _record.encode(b'{"pid": 1, ')
    if kind == "header_only":
        return b"pylock-record v1 "
    raise ValueError(kind)


GARBAGE = [
    "random",
    "zeros",
    "bad_crc",
    "huge_length",
    "truncated",
    "not_a_dict",
    "pid_not_int",
    "bad_json",
    "header_only",
]


@pytest.fixture
def raw_holder() -> Iterator[Any]:
    """Start a process that holds a plain flock (no pylock, no record) on a path."""
    started: list[Script] = []

    def start(path: str) -> Script:
        s = Script(
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
            path,
        )
        s.expect("held")
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_record(tmp_path: Path, kind: str, raw_holder: Any) -> None:
    path = str(tmp_path / "garbage.lock")
    data = _garbage(kind)
    Path(path).write_bytes(data)
    # Free: garbage is no holder.
    assert pylock.Lock(path).holder() is None
    assert pylock.holders(path) == []
    # Held by a process with no record: the kernel names it; garbage is ignored.
    raw = raw_holder(path)
    h = pylock.Lock(path).holder()
    assert h is not None and h.pid == raw.pid and h.verified and h.info is None
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(path).acquire(blocking=False)
    assert f"pid {raw.pid}" in str(info.value)
    raw.kill()
    # Locking over garbage works; a real record replaces only a damaged
    # record (the file starts as one), never someone's other bytes.
    ours = data.startswith(_record.MAGIC)
    lock = pylock.Lock(path, info={"after": kind})
    lock.acquire(blocking=False)
    try:
        h = lock.holder()
        assert h is not None and h.pid == os.getpid() and h.verified
        assert h.info == ({"after": kind} if ours else None)
    finally:
        lock.release()
        lock.close()
    if not ours:
        assert Path(path).read_bytes() == data


def test_crafted_record_naming_another_live_process_is_not_verified(
    tmp_path: Path, raw_holder: Any
) -> None:
    path = str(tmp_path / "crafted.lock")
    other = str(tmp_path / "other.lock")
    Path(path).write_bytes(b"")
    Path(other).write_bytes(b"")
    # The process the forgery names: alive, with this very file open, and
    # holding a lock on another file, but not on this one.
    named = Script(
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "od = os.open(sys.argv[2], os.O_RDWR)\n"
        "fcntl.flock(od, fcntl.LOCK_EX)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n",
        path,
        other,
    )
    try:
        named.expect("ready")
        forged = _crafted_record(named.pid)
        Path(path).write_bytes(forged)

        # Nobody holds the lock: a perfect forgery is still no holder.
        assert pylock.Lock(path).holder() is None
        assert pylock.holders(path) == []

        # Someone else holds it: the kernel's holder is named, never the forgery.
        raw = raw_holder(path)
        Path(path).write_bytes(forged)
        for h in (pylock.Lock(path).holder(), *pylock.holders(path)):
            assert h is not None
            assert not (h.pid == named.pid and h.verified), h
            assert h.pid == raw.pid and h.verified and h.info is None, h
        with pytest.raises(pylock.LockHeld) as info:
            pylock.Lock(path).acquire(blocking=False)
        assert info.value.holder is not None and info.value.holder.pid == raw.pid
        assert "forged" not in str(info.value)
    finally:
        named.close()


@pytest.mark.parametrize("kind", ["valid_header_10mib_json", "garbage_10mib"])
def test_10_mib_record_is_read_bounded(tmp_path: Path, kind: str, figures: Figures) -> None:
    path = str(tmp_path / "big.lock")
    small = str(tmp_path / "small.lock")
    ten = 10 * 1024 * 1024
    if kind == "valid_header_10mib_json":
        body = json.dumps({"pid": os.getpid(), "pad": "p" * (ten - 64)}).encode()
        Path(path).write_bytes(_record.encode(body))
    else:
        with open(path, "wb") as f:
            f.write(os.urandom(ten))
    Path(small).write_bytes(_crafted_record(os.getpid()))

    def read_cost(p: str) -> tuple[int, float]:
        def rchar() -> int:
            with open("/proc/self/io") as f:
                return int(next(line for line in f if line.startswith("rchar:")).split()[1])

        before, t0 = rchar(), time.monotonic()
        assert pylock.Lock(p).holder() is None
        return rchar() - before, time.monotonic() - t0

    baseline, _ = read_cost(small)
    cost, elapsed = read_cost(path)
    figures(kind=kind, file_bytes=os.path.getsize(path), holder_read_bytes=cost, baseline=baseline)
    assert cost - baseline < 256 * 1024, f"holder() read {cost} bytes of a 10 MiB file"
    assert elapsed < AT_ONCE
    size = os.path.getsize(path)
    lock = pylock.Lock(path, info={"k": "v"})
    lock.acquire(blocking=False)
    try:
        h = lock.holder()
        # Random bytes are someone's data: locked, never written.
        expected = {"k": "v"} if kind == "valid_header_10mib_json" else None
        assert h is not None and h.verified and h.info == expected
    finally:
        lock.release()
        lock.close()
    assert os.path.getsize(path) == size  # never truncated nor extended
