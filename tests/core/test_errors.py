"""Errors: who holds the lock is named in LockHeld/LockTimeout, and every
permanent problem with the lock file fails at once with a LockFileError
naming the path and the meaning, never as a wait or a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

import pylock
from pylock._core import fs as _fs
from pylock._core.errors import NOT_REGULAR, SYMLINK
from tests.support import IS_ROOT, env_with_repo, mounts
from tests.support.procs import NOBODY, in_child

# Permanent errors must not wait: acquire(timeout=FAR) has to come back at
# once.  Only "far below the timeout" is asserted; timing goals live in bench/.
FAR = 30.0
AT_ONCE = 5.0


# -- who holds it: the messages ----------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, sys, pylock
    lock = pylock.Lock(sys.argv[1], info=json.loads(sys.argv[2]))
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def worker(tmp_path: Path, lock_path: str) -> Iterator[tuple[subprocess.Popen[str], float, float]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    before = time.time()
    proc = subprocess.Popen(
        [sys.executable, "worker.py", lock_path, json.dumps({"port": 4242})],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    after = time.time()
    yield proc, before, after
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _assert_names_holder(text: str, pid: int, before: float, after: float) -> None:
    program = os.path.basename(sys.executable)
    match = re.search(
        rf"held by pid {pid} \({re.escape(program)} worker\.py[^)]*\) "
        rf"on {re.escape(socket.gethostname())} since (\S+Z)",
        text,
    )
    assert match, text
    since = dt.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%SZ")
    since = since.replace(tzinfo=dt.timezone.utc).timestamp()
    assert int(before) <= since <= after


def test_lock_held_names_the_holder(lock_path: str, worker) -> None:
    proc, before, after = worker
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    exc = info.value
    assert isinstance(exc, pylock.LockError) and not isinstance(exc, pylock.LockTimeout)
    assert exc.path == lock_path
    assert exc.holder is not None and exc.holder.pid == proc.pid and exc.holder.verified
    assert exc.holder.info == {"port": 4242}
    assert str(exc).startswith(lock_path)
    _assert_names_holder(str(exc), proc.pid, before, after)


def test_lock_timeout_names_the_holder(lock_path: str, worker) -> None:
    proc, before, after = worker
    with pytest.raises(pylock.LockTimeout) as info:
        pylock.Lock(lock_path).acquire(timeout=0.1)
    exc = info.value
    assert isinstance(exc, pylock.LockHeld) and isinstance(exc, TimeoutError)
    assert exc.path == lock_path and exc.holder is not None and exc.holder.pid == proc.pid
    assert "timed out after 0.1 s" in str(exc)
    _assert_names_holder(str(exc), proc.pid, before, after)

    async def main() -> None:
        with pytest.raises(pylock.LockTimeout) as ainfo:
            await pylock.Lock(lock_path).acquire_async(timeout=0.1)
        _assert_names_holder(str(ainfo.value), proc.pid, before, after)

    asyncio.run(main())


def test_message_of_a_python_c_holder_stays_on_one_line(lock_path: str, spawn_holder) -> None:
    """A holder started as `python -c CODE` must not pour its code into the message."""
    holder = spawn_holder(lock_path)
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    text = str(info.value)
    assert f"held by pid {holder.pid}" in text
    assert "\n" not in text, repr(text)


# -- permanent errors ----------------------------------------------------------


def _meaning(code: int) -> str:
    return {
        SYMLINK: "symbolic link",
        NOT_REGULAR: "not a regular file",
        errno.EINVAL: "NUL",
    }.get(code) or os.strerror(code)


def _attempts(path: str) -> dict[str, Callable[[], Any]]:
    def with_statement() -> None:
        with pylock.Lock(path):
            pass

    return {
        "acquire(timeout)": lambda: pylock.Lock(path).acquire(timeout=FAR),
        "acquire()": lambda: pylock.Lock(path).acquire(),
        "acquire(blocking=False)": lambda: pylock.Lock(path).acquire(blocking=False),
        "shared": lambda: pylock.Lock(path, shared=True).acquire(timeout=FAR),
        "acquire_async(timeout)": lambda: asyncio.run(pylock.Lock(path).acquire_async(FAR)),
        "with": with_statement,
    }


def outcomes(path: str) -> dict[str, dict[str, Any]]:
    """How each way of taking the lock at path failed, and how long it took."""
    found = {}
    for name, attempt in _attempts(path).items():
        t0 = time.monotonic()
        try:
            attempt()
        except BaseException as exc:
            found[name] = {
                "type": type(exc).__name__,
                "file_error": isinstance(exc, pylock.LockFileError),
                "lock_error": isinstance(exc, pylock.LockError),
                "os_error": isinstance(exc, OSError),
                "held": isinstance(exc, pylock.LockHeld),
                "errno": getattr(exc, "errno", None),
                "code": getattr(exc, "code", None),
                "filename": getattr(exc, "filename", None),
                "text": str(exc),
                "seconds": time.monotonic() - t0,
            }
        else:
            found[name] = {"type": "acquired", "seconds": time.monotonic() - t0}
    return found


def assert_permanent(found: dict[str, dict[str, Any]], path: str, code: int) -> None:
    for name, got in found.items():
        where = f"{name}: {got}"
        assert got["type"] == "LockFileError", where
        assert got["file_error"] and got["lock_error"] and got["os_error"], where
        assert not got["held"], where  # never LockHeld / LockTimeout
        # errno is a real errno value (what an open would have said); the
        # core's own reason (symlink, not a regular file) is in .code.
        assert got["errno"] == {SYMLINK: errno.ELOOP, NOT_REGULAR: errno.EINVAL}.get(code, code)
        assert got["code"] == code, where
        assert got["filename"] == path, where
        assert path in got["text"], where
        assert _meaning(code) in got["text"], where
        assert got["seconds"] < AT_ONCE, f"{name} took {got['seconds']:.3f} s: {where}"


def _fifo(d: Path) -> str:
    os.mkfifo(d / "fifo")
    return str(d / "fifo")


def _socket(d: Path) -> str:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "sock"))
    s.close()
    return str(d / "sock")


def _symlink(d: Path) -> str:
    (d / "target").write_text("")
    (d / "link").symlink_to(d / "target")
    return str(d / "link")


def _dangling(d: Path) -> str:
    (d / "dangling").symlink_to(d / "nowhere")
    return str(d / "dangling")


def _self_loop(d: Path) -> str:
    (d / "loop").symlink_to(d / "loop")
    return str(d / "loop")


def _file_component(d: Path) -> str:
    (d / "plain").write_text("")
    return str(d / "plain" / "x.lock")


def _subdir(d: Path) -> str:
    (d / "sub").mkdir()
    return str(d / "sub")


CASES: dict[str, tuple[Callable[[Path], str], int]] = {
    "missing directory": (lambda d: str(d / "nowhere" / "x.lock"), errno.ENOENT),
    "component is a file": (_file_component, errno.ENOTDIR),
    "directory": (_subdir, errno.EISDIR),
    "fifo": (_fifo, NOT_REGULAR),
    "device": (lambda d: "/dev/null", NOT_REGULAR),
    "socket": (_socket, NOT_REGULAR),
    "name too long": (lambda d: str(d / ("n" * 300)), errno.ENAMETOOLONG),
    "path too long": (lambda d: str(d / (("d" * 200 + "/") * 25)) + "x.lock", errno.ENAMETOOLONG),
    "symlink": (_symlink, SYMLINK),
    "dangling symlink": (_dangling, SYMLINK),
    "symlink to itself": (_self_loop, SYMLINK),
}


@pytest.mark.parametrize("case", list(CASES))
def test_permanent_error_raises_at_once(tmp_path: Path, case: str) -> None:
    make, code = CASES[case]
    path = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert_permanent(outcomes(path), path, code)
    assert sorted(os.listdir(tmp_path)) == before  # nothing created, no link followed


def test_symlink_error_says_what_to_do(tmp_path: Path) -> None:
    path = _symlink(tmp_path)
    with pytest.raises(pylock.LockFileError) as info:
        pylock.Lock(path).acquire()
    assert "never follows a symlink" in str(info.value)
    assert (tmp_path / "target").read_text() == ""  # the target was not written


def test_nul_byte_raises_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "a\0b.lock")
    found = outcomes(path)
    for name, got in found.items():
        assert got["type"] == "LockFileError", (name, got)
        assert got["errno"] == errno.EINVAL and not got["held"], (name, got)
        assert "NUL" in got["text"] and str(tmp_path) in got["text"], (name, got)
        assert got["seconds"] < AT_ONCE
    assert os.listdir(tmp_path) == []


def test_fifo_with_a_writer_waiting_is_still_refused(tmp_path: Path) -> None:
    """Opening a FIFO could block or steal a reader; pylock must not even open it."""
    path = _fifo(tmp_path)
    assert_permanent(outcomes(path), path, NOT_REGULAR)


# -- permission denied, as an unprivileged user -------------------------------


def as_nobody(path: str) -> dict[str, dict[str, Any]]:
    """outcomes(path) computed by a forked child running as uid/gid 65534."""
    if not IS_ROOT:
        return outcomes(path)
    result = in_child(lambda: outcomes(path), user=NOBODY)
    assert "value" in result, result
    return result["value"]  # type: ignore[no-any-return]


def test_unsearchable_directory_is_permission_denied(public_dir: Path) -> None:
    private = public_dir / "private"
    private.mkdir(mode=0o700)
    path = str(private / "x.lock")
    assert_permanent(as_nobody(path), path, errno.EACCES)
    assert os.listdir(private) == []


def test_unwritable_directory_is_permission_denied(public_dir: Path) -> None:
    path = str(public_dir / "x.lock")
    assert_permanent(as_nobody(path), path, errno.EACCES)
    assert not os.path.exists(path)


def test_file_with_mode_000_is_permission_denied(public_dir: Path) -> None:
    path = public_dir / "x.lock"
    path.touch()
    os.chmod(path, 0)
    assert_permanent(as_nobody(str(path)), str(path), errno.EACCES)


@pytest.mark.root
def test_missing_file_on_a_read_only_filesystem(tmp_path: Path) -> None:
    with mounts.readonly_tmpfs() as d:
        path = os.path.join(d, "x.lock")
        assert_permanent(outcomes(path), path, errno.EROFS)


@pytest.mark.root
def test_no_inode_left_for_the_lock_file() -> None:
    with mounts.tmpfs(size="1m", nr_inodes=8) as d:
        mounts.exhaust_inodes(d)
        path = os.path.join(d, "x.lock")
        assert_permanent(outcomes(path), path, errno.ENOSPC)


# -- network filesystems ---------------------------------------------------------

# NFS, SMB and the others cannot be mounted on this machine (no kernel
# clients); the decision is tested with their real statfs f_type values, and
# the refusal end to end on a real FUSE mount in test_interop.py.
NETWORK = {
    0x6969: "NFS",
    0x517B: "SMB",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2/3",
    0x65735546: "FUSE",
    0x00C36400: "CephFS",
    0x5346414F: "AFS",
    0x01021997: "9P",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
}
LOCAL = {
    0xEF53: "ext4",
    0x01021994: "tmpfs",
    0x794C7630: "overlay",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x858458F6: "ramfs",
}


@pytest.mark.parametrize("magic", list(NETWORK))
def test_network_filesystem_magic_is_refused(magic: int) -> None:
    name = _fs.network_filesystem(magic, -1, "")
    assert name is not None
    assert NETWORK[magic].lower().split("/")[0] in name.lower()


@pytest.mark.parametrize("magic", list(LOCAL))
def test_local_filesystem_magic_is_trusted(magic: int) -> None:
    assert _fs.network_filesystem(magic, -1, "") is None


def test_filesystem_names_where_the_platform_gives_them() -> None:
    assert _fs.network_filesystem(0, 1, "nfs") is not None  # macOS: not MNT_LOCAL
    assert _fs.network_filesystem(0, 0, "smbfs") is not None
    assert _fs.network_filesystem(0, 0, "macfuse") is not None
    assert _fs.network_filesystem(0, 0, "apfs") is None
    assert _fs.network_filesystem(0, 0, "hfs") is None


def _real_magic(path: str) -> int:
    out = subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout, 16)


def _core_magic(path: str) -> int:
    from pylock._core.native import open_lock_file
    from pylock._native import ffi, lib

    handle = open_lock_file(path, lib.PL_OPEN_READONLY)
    try:
        info = ffi.new("pl_fs_info *")
        assert lib.pl_fs_stat(handle, info) == 0
        return int(info.magic)
    finally:
        lib.pl_close(handle)


def _local_dirs(tmp_path: Path) -> list[str]:
    dirs = [str(tmp_path)]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        dirs.append("/dev/shm")
    return dirs


def test_real_local_filesystems_are_not_refused(tmp_path: Path) -> None:
    seen = set()
    for d in _local_dirs(tmp_path):
        path = os.path.join(d, f"pylock-fs-{os.getpid()}.lock")
        try:
            with pylock.Lock(path) as lock:
                magic = _core_magic(path)
                assert magic == _real_magic(path)
                assert _fs.network_filesystem(magic, -1, "") is None
                assert lock.locked
                seen.add(magic)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    assert seen


@pytest.mark.root
def test_a_fresh_tmpfs_is_not_refused() -> None:
    with mounts.tmpfs() as d:
        path = os.path.join(d, "x.lock")
        with pylock.Lock(path):
            assert _core_magic(path) == 0x01021994 == _real_magic(path)


def test_lock_file_error_is_an_oserror_with_errno_and_filename(tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere" / "x.lock")
    with pytest.raises(OSError) as info:
        pylock.Lock(path).acquire()
    assert isinstance(info.value, pylock.LockFileError)
    assert info.value.errno == errno.ENOENT and info.value.filename == path
    assert "create it first" in str(info.value)


# -- errors crossing a process boundary -------------------------------------------------


def _try_lock(path: str) -> bool:
    return pylock.Lock(path).acquire(blocking=False)


def test_errors_survive_pickling(tmp_path: Path) -> None:
    """multiprocessing and concurrent.futures pickle a worker's exception."""
    import pickle

    from pylock._lock.holder import Holder

    holder = Holder(pid=4242, hostname="host-a", program="worker.py")
    errors = [
        pylock.LockHeld("/x.lock", holder),
        pylock.LockTimeout("/x.lock", holder, 1.5),
        pylock.LockFileError(errno.ENOENT, "/x.lock", "the directory does not exist"),
        pylock.UnsafeFilesystem("/x.lock", "NFS"),
        pylock.ReentrantAcquire("/x.lock: this thread already holds this Lock"),
    ]
    for exc in errors:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert str(back) == str(exc)
        for attr in ("path", "holder", "timeout", "errno", "filename", "fs_name"):
            assert getattr(back, attr, None) == getattr(exc, attr, None), attr


def test_lock_held_in_a_process_pool_worker(lock_path: str) -> None:
    import concurrent.futures
    import multiprocessing

    with pylock.Lock(lock_path):
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            future = pool.submit(_try_lock, lock_path)
            with pytest.raises(pylock.LockHeld) as info:
                future.result(timeout=30)
    assert info.value.holder is not None and info.value.holder.pid == os.getpid()
