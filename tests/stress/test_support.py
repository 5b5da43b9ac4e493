"""The test machinery itself does what the scenarios rely on."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT, env_with_repo, mounts, pidfd_open, pidns, seccomp

# The system call itself (434), as the filter sees it: PyPy's os has no pidfd_open.
PROBE = (
    "import ctypes, errno, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.syscall(434, os.getpid(), 0)\n"
    "if fd < 0:\n"
    "    print(errno.errorcode[ctypes.get_errno()])\n"
    "else:\n"
    "    os.close(fd)\n"
    "    print('OK')\n"
)


def _kernel_has_pidfd() -> bool:
    try:
        os.close(pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _kernel_has_pidfd(), reason="this kernel has no pidfd_open to block")
def test_seccomp_launcher_makes_pidfd_open_enosys() -> None:
    plain = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    )
    assert plain.stdout.strip() == "OK"

    # The documented spelling, run from the repo root.
    filtered = subprocess.run(
        [sys.executable, "-m", "tests.support.seccomp", "--", sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    assert filtered.stdout.strip() == "ENOSYS"


@pytest.mark.skipif(not _kernel_has_pidfd(), reason="this kernel has no pidfd_open to block")
def test_seccomp_filter_is_inherited_by_fork_and_exec_and_spares_other_syscalls() -> None:
    script = (
        "import ctypes, errno, os, signal, subprocess, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "out = []\n"
        "for nr in (434, 424, 438):\n"
        "    r = libc.syscall(nr, 0, 0, 0, 0)\n"
        "    out.append(errno.errorcode[ctypes.get_errno()] if r == -1 else 'OK')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    r = libc.syscall(434, os.getppid(), 0)\n"
        "    os._exit(ctypes.get_errno() if r == -1 else 0)\n"
        "out.append(errno.errorcode.get(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), 'OK'))\n"
        "out.append(subprocess.run([sys.executable, '-c', sys.argv[1]],\n"
        "                          capture_output=True, text=True).stdout.strip())\n"
        "out.append(str(os.getpid() > 0 and os.stat('/') is not None))\n"
        "print(' '.join(out))\n"
    )
    res = subprocess.run(
        seccomp.command([sys.executable, "-c", script, PROBE]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.split() == ["ENOSYS", "ENOSYS", "ENOSYS", "ENOSYS", "ENOSYS", "True"]


def test_seccomp_filter_program_shape() -> None:
    prog = seccomp.filter_bytes()
    assert len(prog) % 8 == 0
    # load arch, 2 arch tests, load nr, 3 syscall tests, allow, errno
    assert len(prog) // 8 == 9


def test_seccomp_launcher_without_command_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "tests.support.seccomp", "--"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert res.returncode == 2
    assert "usage" in res.stderr


REUSE = r"""
import json, os, sys, time
from tests.support.pidns import spawn_at, fork_at, reap, start_time_of, in_private_pidns

assert in_private_pidns()
results = []
for trial in range(20):
    target = 300 + trial
    victim = spawn_at(target, [sys.executable, "-c", "import time; time.sleep(60)"])
    st_victim = start_time_of(target)
    victim.kill()
    victim.wait()
    child = fork_at(target)
    if child == 0:
        time.sleep(60)
        os._exit(0)
    results.append([victim.pid, child, st_victim, start_time_of(child)])
    os.kill(child, 9)
    reap(child)
print(json.dumps(results))
"""


def test_pid_reuse_in_private_namespace_gives_the_same_pid() -> None:
    reason = pidns.available()
    if reason:
        pytest.skip(reason)
    results = pidns.run_json_in_pidns(REUSE)
    assert len(results) == 20
    for victim_pid, impostor_pid, st_v, st_i in results:
        assert victim_pid == impostor_pid
        assert st_i >= st_v


def test_pidns_script_failure_reports_stderr() -> None:
    reason = pidns.available()
    if reason:
        pytest.skip(reason)
    with pytest.raises(AssertionError, match="boom"):
        pidns.run_in_pidns("raise SystemExit('boom')")


@pytest.mark.root
def test_tiny_tmpfs_fills_up_but_flock_still_works() -> None:
    with mounts.tmpfs(size="64k") as d:
        lockfile = os.path.join(d, "a.lock")
        os.close(os.open(lockfile, os.O_CREAT | os.O_WRONLY, 0o644))
        written = mounts.fill_space(d)
        assert 0 < written <= 64 * 1024
        fd = os.open(lockfile, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(OSError) as exc:
                os.write(fd, b"x" * 8192)
            assert exc.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
    assert not os.path.exists(d)


@pytest.mark.root
def test_tmpfs_out_of_inodes() -> None:
    with mounts.tmpfs(size="1m", nr_inodes=4) as d:
        made = mounts.exhaust_inodes(d)
        assert made >= 1
        with pytest.raises(OSError) as exc:
            os.open(os.path.join(d, "one-more"), os.O_CREAT | os.O_WRONLY, 0o644)
        assert exc.value.errno == errno.ENOSPC


@pytest.mark.root
def test_readonly_mounts_refuse_writes(tmp_path: object) -> None:
    def populate(d: str) -> None:
        with open(os.path.join(d, "x.lock"), "w"):
            pass

    with mounts.readonly_tmpfs(populate) as d:
        with pytest.raises(OSError) as exc:
            os.open(os.path.join(d, "x.lock"), os.O_RDWR)
        assert exc.value.errno == errno.EROFS
        fd = os.open(os.path.join(d, "x.lock"), os.O_RDONLY)
        os.close(fd)
    src = str(tmp_path)
    with mounts.readonly_bind(src) as d:
        with pytest.raises(OSError) as exc:
            os.open(os.path.join(d, "new"), os.O_CREAT | os.O_WRONLY, 0o644)
        assert exc.value.errno == errno.EROFS


def test_env_with_repo_puts_checkout_first() -> None:
    """A child finds this checkout's tests first, and the suite's own pylock:
    the checkout's root when that pylock is the checkout's, else a directory
    holding only a link to tests/ (the checkout's pylock/ would shadow it)."""
    import subprocess
    import sys

    import pylock

    env = env_with_repo({**os.environ, "PYTHONPATH": "/elsewhere"})
    first, rest = env["PYTHONPATH"].split(os.pathsep)[0], env["PYTHONPATH"].split(os.pathsep)[1:]
    assert rest == ["/elsewhere"]
    if first != REPO_ROOT:
        assert os.listdir(first) == ["tests"]
        assert os.path.realpath(os.path.join(first, "tests")) == os.path.join(REPO_ROOT, "tests")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pylock, tests.support as s; print(pylock.__file__, s.REPO_ROOT)",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout.split()
    assert out == [os.path.realpath(pylock.__file__), REPO_ROOT]


def test_child_lines_written_in_one_go_are_each_read_within_the_bound() -> None:
    # Two lines the child wrote together (as a reply and a callback from
    # another thread may arrive) must both be returned: a select on the pipe
    # after a buffered readline took both would wait out the bound (the
    # etcd harness did, before its lines were read from the pipe here).
    from tests.support.children import Script

    child = Script("import os, sys; os.write(1, b'one 1\\ntwo 2\\nlast'); sys.stdin.read()")
    try:
        assert child.expect("one", within=30) == "1"
        assert child.expect("two", within=30) == "2"
        with pytest.raises(AssertionError, match=r"said nothing in 0\.2 s"):
            child.expect("last", within=0.2)  # no newline yet: not a line
        child.close_stdin()
        assert child.expect("last", within=30) == ""  # a last line without its newline
        with pytest.raises(AssertionError, match="exited"):
            child.expect("more", within=30)
    finally:
        child.close()
