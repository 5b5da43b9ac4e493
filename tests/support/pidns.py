"""Private pid namespaces with deterministic pid reuse.

Outside (in the test):

    result = run_in_pidns(SCRIPT, "arg1")      # CompletedProcess, script is pid 1
    data = run_json_in_pidns(SCRIPT)           # the JSON object the script printed last

Inside (in SCRIPT, which runs as pid 1 of a fresh pid namespace with its own
/proc):

    from tests.support.pidns import spawn_at, fork_at, set_next_pid
    victim = spawn_at(500, [sys.executable, "-c", "..."])
    ...victim dies, is reaped...
    impostor = spawn_at(500, [...])            # the very same pid

The next pid is chosen by writing N-1 to /proc/sys/kernel/ns_last_pid just
before the fork. Nothing else may fork or start a thread in the namespace
between the write and the fork (threads take pids too), so ``spawn_at`` checks
the pid it got and raises ``PidNotAvailable`` otherwise. Every process in the
namespace is killed when its pid 1 (the script) exits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tests.support import env_with_repo, is_root

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


class PidNotAvailable(RuntimeError):
    """The chosen pid was taken, or someone else forked in between."""


def available() -> str | None:
    """None when pid namespaces can be used here, else the reason they cannot."""
    if shutil.which("unshare") is None:
        return "util-linux unshare(1) is not installed"
    if not sys.platform.startswith("linux"):
        return "pid namespaces are Linux only"
    return None


def pidns_command(argv: Sequence[str]) -> list[str]:
    """argv prefixed so that it runs as pid 1 of a new pid namespace with its own /proc.

    As root the namespace is created directly; otherwise inside a new user
    namespace where the caller is mapped to root (needed to write ns_last_pid).
    """
    prefix = ["unshare"]
    if not is_root():
        prefix += ["--user", "--map-root-user"]
    # --kill-child: if the test (our parent) is killed, the namespace dies too.
    prefix += ["--pid", "--fork", "--mount-proc", "--kill-child"]
    return [*prefix, *argv]


def run_in_pidns(
    script: str,
    *args: str,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    python: str | None = None,
    old_kernel: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a Python source string as pid 1 of a private pid namespace.

    The script can import pylock and tests.support from this checkout.
    old_kernel=True runs the whole namespace under the seccomp filter that
    makes the pidfd syscalls fail with ENOSYS (see seccomp.py).
    On failure (check=True) the script's stderr is part of the exception text.
    """
    argv = pidns_command([python or sys.executable, "-c", script, *args])
    if old_kernel:
        from tests.support import seccomp

        argv = seccomp.command(argv, python=python)
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_with_repo(dict(env) if env is not None else None),
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"pid-namespace script failed (exit {proc.returncode})\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


def run_json_in_pidns(script: str, *args: str, **kwargs: Any) -> Any:
    """Like run_in_pidns, returning the JSON value printed on the last stdout line."""
    proc = run_in_pidns(script, *args, **kwargs)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"pid-namespace script printed nothing\n{proc.stderr}")
    return json.loads(lines[-1])


# ---- used inside the namespace -------------------------------------------------


def in_private_pidns() -> bool:
    return os.getpid() == 1


def set_next_pid(pid: int) -> None:
    """Make pid the next one the kernel hands out in this namespace (if free)."""
    if pid < 2:
        raise ValueError("pid must be >= 2")
    with open(NS_LAST_PID, "w") as f:
        f.write(str(pid - 1))


def spawn_at(pid: int, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """Start argv as a process with exactly this pid, or raise PidNotAvailable."""
    set_next_pid(pid)
    proc = subprocess.Popen(list(argv), **popen_kwargs)
    if proc.pid != pid:
        proc.kill()
        proc.wait()
        raise PidNotAvailable(f"wanted pid {pid}, got {proc.pid}")
    return proc


def fork_at(pid: int) -> int:
    """os.fork() giving the child exactly this pid; returns 0 in the child.

    In the parent, raises PidNotAvailable (after killing and reaping the stray
    child) when the kernel handed out another pid.
    """
    set_next_pid(pid)
    child = os.fork()
    if child == 0:
        return 0
    if child != pid:
        os.kill(child, 9)
        os.waitpid(child, 0)
        raise PidNotAvailable(f"wanted pid {pid}, got {child}")
    return child


def reap(pid: int) -> int:
    """Wait for and reap pid (our child, or an orphan re-parented to us as pid 1).

    Returns the raw wait status. Reaping is what frees the pid for reuse.
    """
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except InterruptedError:
            continue


def pid_exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def start_time_of(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[19])
