"""Interoperation with other flock users (util-linux flock(1), both ways), and
the refusal of filesystems where flock cannot be trusted, on a real FUSE mount."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

import pylock
from tests.support.kernel_locks import flock_n, wait_blocked

FLOCK = shutil.which("flock")
pytestmark = pytest.mark.skipif(FLOCK is None, reason="util-linux flock(1) is not installed")


class FlockHolder:
    """`flock [-s] FILE -c 'echo ready; read x'`: flock(1) and its shell hold the lock."""

    def __init__(self, path: str, shared: bool = False) -> None:
        argv = ["flock", *(["-s"] if shared else []), path, "-c", "echo ready; read x"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("x\n")
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0
        self.proc.stdout.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def flock_holder() -> Iterator:
    started: list[FlockHolder] = []

    def start(path: str, shared: bool = False) -> FlockHolder:
        started.append(FlockHolder(path, shared))
        return started[-1]

    yield start
    for holder in started:
        holder.close()


# -- pylock holds, flock(1) is refused ---------------------------------------------


def test_flock_cli_is_refused_while_pylock_holds(lock_path: str) -> None:
    with pylock.Lock(lock_path):
        assert flock_n(lock_path) == 1
        assert flock_n(lock_path, "-s") == 1
        assert subprocess.run(["flock", "-w", "0.05", lock_path, "true"]).returncode == 1
    assert flock_n(lock_path) == 0


def test_shared_pylock_and_shared_flock_cli_coexist(lock_path: str) -> None:
    with pylock.Lock(lock_path, shared=True):
        assert flock_n(lock_path, "-s") == 0
        assert flock_n(lock_path) == 1


def test_flock_cli_waiter_gets_the_lock_when_pylock_releases(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    waiter = subprocess.Popen(
        ["flock", lock_path, "-c", "echo got"], stdout=subprocess.PIPE, text=True
    )
    try:
        wait_blocked(lock_path, waiter.pid)
        lock.release()
        out, _ = waiter.communicate(timeout=10)
        assert out == "got\n" and waiter.returncode == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


# -- flock(1) holds, pylock is refused ---------------------------------------------------


def test_pylock_is_refused_while_flock_cli_holds(lock_path: str, flock_holder) -> None:
    holder = flock_holder(lock_path)
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    exc = info.value
    # flock(1) and the shell it forked share the locked description: both hold it.
    listed = {h.pid: h for h in pylock.holders(lock_path)}
    assert holder.pid in listed and len(listed) == 2
    assert all(h.verified for h in listed.values())
    assert exc.holder is not None and exc.holder.pid in listed and exc.holder.verified
    assert f"pid {exc.holder.pid}" in str(exc)
    assert listed[holder.pid].program == "flock"
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(lock_path, shared=True).acquire(blocking=False)
    with pytest.raises(pylock.LockTimeout):
        pylock.Lock(lock_path).acquire(timeout=0.05)


def test_shared_flock_cli_admits_shared_pylock(lock_path: str, flock_holder) -> None:
    flock_holder(lock_path, shared=True)
    with pylock.Lock(lock_path, shared=True) as lock:
        assert lock.locked
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(lock_path).acquire(blocking=False)


def test_pylock_waiter_gets_the_lock_when_flock_cli_releases(lock_path: str, flock_holder) -> None:
    holder = flock_holder(lock_path)
    lock = pylock.Lock(lock_path)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (lock.acquire(), done.set()))
    waiter.start()
    wait_blocked(lock_path, os.getpid())
    assert not done.is_set()
    holder.release()
    assert done.wait(10)
    waiter.join()
    assert lock.locked and flock_n(lock_path) == 1
    lock.release()


# -- a real FUSE filesystem: flock there is not pylock's to trust ------------------------
#
# NFS, SMB and CephFS cannot be mounted here (no kernel clients, no servers);
# test_errors.py checks their statfs magic numbers.  FUSE can: the fixture
# below mounts a tiny read-mostly filesystem served from a thread of this
# process over /dev/fuse (the kernel protocol, version 7.31), with one file.

FUSE_SUPER_MAGIC = 0x65735546
ROOT_ID, FILE_ID, FILE_NAME = 1, 2, b"x.lock"
_IN = struct.Struct("<IIQQIIIHH")  # fuse_in_header
_OUT = struct.Struct("<IiQ")  # fuse_out_header
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr


def _attr(node: int) -> bytes:
    mode = 0o040755 if node == ROOT_ID else 0o100644
    now = int(time.time())
    return _ATTR.pack(node, 0, 0, now, now, now, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def _answer(opcode: int, node: int, body: bytes) -> tuple[int, bytes] | None:
    """(error, payload) for one request; None for requests that take no reply."""
    if opcode in (2, 42, 36):  # FORGET, BATCH_FORGET, INTERRUPT
        return None
    if opcode == 26:  # INIT: protocol 7.31, no flags: the kernel keeps flock local
        init = struct.pack("<IIIIHHIIHHI", 7, 31, 0, 0, 0, 0, 4096, 0, 0, 0, 0)
        return 0, init + b"\0" * (64 - len(init))
    if opcode == 1:  # LOOKUP
        if node != ROOT_ID or body.rstrip(b"\0") != FILE_NAME:
            return -errno.ENOENT, b""
        return 0, struct.pack("<QQQQII", FILE_ID, 0, 1, 1, 0, 0) + _attr(FILE_ID)
    if opcode == 3:  # GETATTR
        return 0, struct.pack("<QII", 1, 0, 0) + _attr(node)
    if opcode in (14, 27):  # OPEN, OPENDIR
        return 0, struct.pack("<QIi", 0, 0, 0)
    if opcode == 15:  # READ: always empty
        return 0, b""
    if opcode == 16:  # WRITE: accepted, dropped
        size = struct.unpack_from("<QQI", body)[2]
        return 0, struct.pack("<II", size, 0)
    if opcode == 17:  # STATFS
        return 0, struct.pack("<QQQQQIIII", 1, 1, 1, 1, 1, 4096, 255, 4096, 0) + b"\0" * 24
    if opcode in (18, 25, 29, 38, 20):  # RELEASE, FLUSH, RELEASEDIR, DESTROY, FSYNC
        return 0, b""
    return -errno.ENOSYS, b""


def _serve(fd: int) -> None:
    while True:
        try:
            request = os.read(fd, 1 << 17)
        except OSError:  # ENODEV once unmounted, EBADF once closed
            return
        if len(request) < _IN.size:  # the end, as some kernels report an unmount
            return
        length, opcode, unique, node, *_ = _IN.unpack_from(request)
        try:
            answer = _answer(opcode, node, request[_IN.size : length])
        except Exception:
            answer = (-errno.EIO, b"")
        if answer is None:
            continue
        error, payload = answer
        with contextlib.suppress(OSError):  # the request was interrupted
            os.write(fd, _OUT.pack(_OUT.size + len(payload), error, unique) + payload)


@pytest.fixture
def fuse_dir() -> Iterator[str]:
    """A real FUSE mount served by a thread here (tests using it are marked root)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("mounting FUSE needs /dev/fuse")
    libc = ctypes.CDLL(None, use_errno=True)
    target = tempfile.mkdtemp(prefix="pylock-fuse-")
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV
    if libc.mount(b"pylock-test", target.encode(), b"fuse", flags, opts) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        os.rmdir(target)
        pytest.skip(f"cannot mount FUSE here: {os.strerror(err)}")
    server = threading.Thread(target=_serve, args=(fd,), daemon=True)
    server.start()
    try:
        yield target
    finally:
        libc.umount2(target.encode(), 2)  # MNT_DETACH
        server.join(10)
        os.close(fd)
        os.rmdir(target)


@pytest.mark.root
def test_fuse_filesystem_is_refused(fuse_dir: str) -> None:
    path = os.path.join(fuse_dir, FILE_NAME.decode())
    out = subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True)
    assert int(out.stdout, 16) == FUSE_SUPER_MAGIC  # a real FUSE mount
    for attempt in (
        lambda: pylock.Lock(path).acquire(timeout=30),
        lambda: pylock.Lock(path).acquire(blocking=False),
        lambda: pylock.Lock(path, shared=True).acquire(),
    ):
        t0 = time.monotonic()
        with pytest.raises(pylock.UnsafeFilesystem) as info:
            attempt()
        assert time.monotonic() - t0 < 5  # refused at once, never a wait
        exc = info.value
        assert isinstance(exc, pylock.LockError) and not isinstance(exc, pylock.LockHeld)
        assert exc.path == path and "FUSE" in exc.fs_name
        text = str(exc)
        assert path in text and "allow_network_fs=True" in text and "flock" in text


@pytest.mark.root
def test_fuse_filesystem_with_explicit_opt_in(fuse_dir: str) -> None:
    path = os.path.join(fuse_dir, FILE_NAME.decode())
    lock = pylock.Lock(path, allow_network_fs=True)
    lock.acquire(blocking=False)
    assert lock.locked
    with pytest.raises(pylock.LockHeld):
        pylock.Lock(path, allow_network_fs=True).acquire(blocking=False)
    lock.release()
    lock.close()
