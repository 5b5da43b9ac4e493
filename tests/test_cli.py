"""The pylock command: run under a lock (flock(1)-style flags and exit codes),
who holds a lock, wait for a process to exit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pylock
from tests.support import env_with_repo


def blocked_waiters(path: str) -> list[int]:
    st = os.stat(path)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    with open("/proc/locks") as f:
        return [int(line.split()[5]) for line in f if " -> " in line and key in line]


def wait_blocked(path: str, pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while pid not in blocked_waiters(path):
        assert time.monotonic() < deadline, f"pid {pid} never blocked on {path}"
        time.sleep(0.001)  # re-reading kernel state, not standing in for a signal


def pylock_cli(*args: str, cwd: Path | None = None, timeout: float = 30):
    return subprocess.run(
        [sys.executable, "-m", "pylock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_with_repo(),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def flock_n(path: str) -> int:
    return subprocess.run(["flock", "-n", path, "true"]).returncode


# -- run ----------------------------------------------------------------------------


def test_run_holds_the_lock_while_the_command_runs(lock_path: str) -> None:
    # The command itself checks that another flock user is refused meanwhile.
    out = pylock_cli("run", lock_path, "--", "sh", "-c", f"flock -n {lock_path} true; echo $?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1\n"
    assert flock_n(lock_path) == 0  # released afterwards
    assert os.path.exists(lock_path)


def test_run_passes_the_exit_status_through(lock_path: str) -> None:
    assert pylock_cli("run", lock_path, "--", "sh", "-c", "exit 7").returncode == 7
    assert pylock_cli("run", lock_path, "--", "sh", "-c", "kill -9 $$").returncode == 137
    assert pylock_cli("run", lock_path, "--", "no-such-program-here").returncode == 127
    assert flock_n(lock_path) == 0


def test_run_nonblocking_conflict_names_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    out = pylock_cli("run", "-n", lock_path, "--", "echo", "ran")
    assert out.returncode == 1
    assert out.stdout == ""  # the command never ran
    assert f"held by pid {holder.pid} (" in out.stderr
    assert f"on {socket.gethostname()} since " in out.stderr
    assert lock_path in out.stderr

    custom = pylock_cli("run", "-n", "-E", "42", lock_path, "--", "echo", "ran")
    assert custom.returncode == 42 and custom.stdout == ""

    quiet = pylock_cli("run", "-n", "-q", lock_path, "--", "echo", "ran")
    assert quiet.returncode == 1 and quiet.stderr == ""


def test_run_timeout_conflict(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    out = pylock_cli("run", "-w", "0.1", "-E", "9", lock_path, "--", "echo", "ran")
    assert out.returncode == 9 and out.stdout == ""
    assert "timed out after 0.1 s" in out.stderr and f"pid {holder.pid}" in out.stderr


def test_run_waits_for_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylock", "run", lock_path, "--", "echo", "ran"],
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    try:
        wait_blocked(lock_path, proc.pid)
        holder.release()
        out, _ = proc.communicate(timeout=30)
        assert (out, proc.returncode) == ("ran\n", 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_unusable_lock_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere" / "x.lock")
    out = pylock_cli("run", path, "--", "echo", "ran")
    assert out.returncode == 73 and out.stdout == ""
    assert path in out.stderr and "No such file or directory" in out.stderr


def test_run_without_a_command(lock_path: str) -> None:
    out = pylock_cli("run", lock_path)
    assert out.returncode == 64 and "no command" in out.stderr


def test_run_relative_path_and_unlink(tmp_path: Path) -> None:
    out = pylock_cli(
        "run", "--unlink", "rel.lock", "--", "sh", "-c", "test -e rel.lock", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "rel.lock").exists()


def test_command_keeps_the_lock_if_pylock_is_killed(lock_path: str) -> None:
    """As with flock(1), the command inherits the locked descriptor (unless -o)."""
    for close, held_after in ((False, True), (True, False)):
        argv = [sys.executable, "-m", "pylock", "run", *(["-o"] if close else []), lock_path]
        proc = subprocess.Popen(
            [*argv, "--", "sh", "-c", "echo $$; read x || true"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env_with_repo(),
        )
        assert proc.stdout is not None and proc.stdin is not None
        child = int(proc.stdout.readline())
        try:
            assert flock_n(lock_path) == 1
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert os.path.exists(f"/proc/{child}")
            assert (flock_n(lock_path) == 1) is held_after
            if held_after:
                assert [h.pid for h in pylock.holders(lock_path)] == [child]
        finally:
            proc.stdin.close()  # the shell reads EOF and exits
            proc.stdout.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


# -- who -------------------------------------------------------------------------


def test_who_free_and_missing(lock_path: str, tmp_path: Path) -> None:
    out = pylock_cli("who", lock_path)
    assert out.returncode == 1 and out.stdout == f"{lock_path}: free\n"
    Path(lock_path).touch()
    out = pylock_cli("who", "--json", lock_path)
    assert out.returncode == 1 and json.loads(out.stdout) == []


def test_who_names_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path, info={"port": 8080})
    out = pylock_cli("who", lock_path)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[0], out.stdout.splitlines()[-1]
    assert first.startswith(f"{lock_path}: held by pid {holder.pid} (")
    assert f"on {socket.gethostname()} since " in first
    assert "unverified" not in first
    assert second == '  info: {"port": 8080}'


def test_who_json(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path, info={"port": 8080})
    out = pylock_cli("who", "--json", lock_path)
    assert out.returncode == 0, out.stderr
    (entry,) = json.loads(out.stdout)
    assert entry["pid"] == holder.pid
    assert entry["verified"] is True and entry["shared"] is False
    assert entry["info"] == {"port": 8080}
    assert entry["hostname"] == socket.gethostname()
    assert entry["program"] == os.path.basename(sys.executable)
    assert entry["acquired_at"].endswith("+00:00")
    found = pylock.Lock(lock_path).holder()
    assert found is not None and entry["start_time"] == found.start_time


def test_who_all_lists_shared_holders(lock_path: str, spawn_holder) -> None:
    a = spawn_holder(lock_path, shared=True)
    b = spawn_holder(lock_path, shared=True)
    out = pylock_cli("who", "--all", "--json", lock_path)
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)
    assert sorted(e["pid"] for e in entries) == sorted([a.pid, b.pid])
    assert all(e["shared"] and e["verified"] for e in entries)
    text = pylock_cli("who", "--all", lock_path)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{lock_path}: shared by pid") for line in lines)


def test_who_lists_the_command_sharing_pylock_runs_descriptor(lock_path: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pylock",
            "run",
            lock_path,
            "--",
            "sh",
            "-c",
            "echo $$; read x || true",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        child = int(proc.stdout.readline())
        out = pylock_cli("who", "--all", "--json", lock_path)
        assert sorted(e["pid"] for e in json.loads(out.stdout)) == sorted([proc.pid, child])
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()


# -- wait-exit ----------------------------------------------------------------------


def _waiting_on_a_pidfd(pid: int) -> bool:
    """The process sleeps in poll with a pidfd open: it is waiting for an exit."""
    fds = os.listdir(f"/proc/{pid}/fd")
    links = []
    for fd in fds:
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    with open(f"/proc/{pid}/wchan") as f:
        wchan = f.read()
    return any("pidfd" in link for link in links) and "poll" in wchan


def test_wait_exit(lock_path: str) -> None:
    target = subprocess.Popen(["sleep", "1000"])
    try:
        out = pylock_cli("wait-exit", "-w", "0.1", str(target.pid))
        assert out.returncode == 1, out.stderr
        waiter = subprocess.Popen(
            [sys.executable, "-m", "pylock", "wait-exit", str(target.pid)], env=env_with_repo()
        )
        try:
            deadline = time.monotonic() + 20
            while not _waiting_on_a_pidfd(waiter.pid):
                assert waiter.poll() is None, "wait-exit returned while its target lived"
                assert time.monotonic() < deadline, "wait-exit never started waiting"
                time.sleep(0.005)  # re-reading kernel state, not standing in for a signal
            target.kill()
            assert waiter.wait(timeout=30) == 0
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
    finally:
        target.kill()
        target.wait()
    # A process that has already exited: nothing to wait for.
    assert pylock_cli("wait-exit", str(target.pid)).returncode == 0


def test_usage_errors() -> None:
    assert pylock_cli().returncode == 2
    assert pylock_cli("wait-exit", "notapid").returncode == 2
    out = pylock_cli("wait-exit", "0")
    assert out.returncode != 0 and "process" in out.stderr
