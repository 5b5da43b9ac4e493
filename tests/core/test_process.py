"""Process identity: identity_of, self_identity, same_process, is_alive.

Real processes only.  The same module runs under the seccomp launcher
(pidfd_open refused), where identities carry no pidfs inode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from pylock._core import process as _process
from pylock._core.process import ProcessIdentity, identity_of, is_alive, same_process, self_identity
from tests.support import pidfd_open
from tests.support.children import Sleeper
from tests.support.procs import boot_id, start_time, stat_fields

PINNING = _process.pinning_available()


def test_identity_of_self_matches_the_kernel() -> None:
    me = identity_of(os.getpid())
    assert me is not None
    assert me.pid == os.getpid()
    assert me.start_time == start_time(os.getpid())
    assert me.boot_id == boot_id()
    if PINNING:
        fd = pidfd_open(os.getpid())
        try:
            pidfs = _is_pidfs(fd)
            assert me.pidfs_ino == (os.fstat(fd).st_ino if pidfs else 0)
        finally:
            os.close(fd)
    else:
        assert me.pidfs_ino == 0


def _is_pidfs(fd: int) -> bool:
    # Two processes' pidfds have distinct inodes only on pidfs (6.9+).
    other = pidfd_open(1)
    try:
        return os.fstat(fd).st_ino != os.fstat(other).st_ino
    finally:
        os.close(other)


def test_identity_of_parses_a_command_name_with_spaces_and_parentheses() -> None:
    code = (
        "import sys\n"
        "with open('/proc/self/comm', 'w') as comm:\n"
        "    comm.write('x) 1 2 (y) Z 9')\n"
        "print('named', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"named\n"
        with open(f"/proc/{proc.pid}/comm") as f:
            assert f.read().startswith("x) 1 2 (y) Z 9")
        ident = identity_of(proc.pid)
        assert ident is not None
        assert ident.start_time == start_time(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            assert stream is not None
            stream.close()


def test_identity_of_a_zombie_is_none(sleeper: Sleeper) -> None:
    assert identity_of(sleeper.pid) is not None
    sleeper.zombify()
    assert stat_fields(sleeper.pid)[0] == b"Z"
    assert identity_of(sleeper.pid) is None
    assert sleeper.proc.wait() == 0  # still the owner's to reap


def test_identity_of_missing_and_impossible_pids() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert identity_of(proc.pid) is None
    for pid in (0, -1, 2**31, 2**40):
        assert identity_of(pid) is None


def test_a_thread_id_is_not_a_process() -> None:
    got: list[int] = []
    release = threading.Event()

    def run() -> None:
        got.append(threading.get_native_id())
        release.wait()

    t = threading.Thread(target=run)
    t.start()
    while not got:
        t.join(0.001)
    try:
        assert got[0] != os.getpid()
        assert os.path.exists(f"/proc/{got[0]}/stat")
        assert identity_of(got[0]) is None
    finally:
        release.set()
        t.join()


def test_self_identity_is_cached_and_renewed_in_a_forked_child() -> None:
    mine = self_identity()
    assert self_identity() is mine
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            child = self_identity()
            ok = child.pid == os.getpid() and child != mine and child == identity_of(os.getpid())
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_same_process() -> None:
    a = ProcessIdentity(10, 500, "boot-a", 77)
    assert same_process(a, a)
    assert not same_process(a, a.replace(pid=11))
    assert not same_process(a, a.replace(boot_id="boot-b"))
    # The pidfs inode is exact when both have one ...
    assert not same_process(a, a.replace(pidfs_ino=78))
    assert same_process(a, a.replace(start_time=501))
    # ... otherwise start time (and boot) decide.
    no_ino = a.replace(pidfs_ino=0)
    assert same_process(a, no_ino)
    assert not same_process(a, no_ino.replace(start_time=501))
    # An old record without a boot id still compares by start time.
    assert same_process(a, a.replace(boot_id=""))


def test_is_alive(sleeper: Sleeper) -> None:
    ident = identity_of(sleeper.pid)
    assert ident is not None
    assert is_alive(ident)
    assert is_alive(self_identity())
    # Same pid, another start: the pid names someone else.
    assert not is_alive(ident.replace(start_time=ident.start_time + 1, pidfs_ino=0))
    assert not is_alive(ident.replace(boot_id="another-boot"))
    if ident.pidfs_ino:
        assert not is_alive(ident.replace(pidfs_ino=ident.pidfs_ino + 1))
    sleeper.zombify()
    assert not is_alive(ident)  # a zombie has exited
    sleeper.proc.wait()
    assert not is_alive(ident)
    assert not is_alive(ProcessIdentity(0, 0, ""))


def test_check_pid() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    assert _process.check_pid(pid_max) == pid_max
    for bad in (0, -1, pid_max + 1):
        with pytest.raises(ValueError, match="not a process id"):
            _process.check_pid(bad)
    for wrong in ("12", 1.0, True, None):
        with pytest.raises(TypeError):
            _process.check_pid(wrong)


@pytest.mark.skipif(not PINNING, reason="pinning (pidfd_open) is refused here")
def test_pin_verifies_after_pinning(sleeper: Sleeper) -> None:
    ident = identity_of(sleeper.pid)
    assert ident is not None
    pinned = _process.pin(sleeper.pid, ident)
    assert pinned is not None
    try:
        assert not pinned.exited()
        assert pinned.identity() == ident
        assert _process.pin(sleeper.pid, ident.replace(start_time=1, pidfs_ino=0)) is None
        sleeper.zombify()
        assert pinned.exited()
        assert pinned.identity() == ident  # a zombie still has its identity ...
        assert pinned.returncode() == 0  # ... and its status, unreaped
        assert sleeper.proc.wait() == 0
        assert pinned.identity() is None  # reaped
    finally:
        pinned.close()
