"""Helpers for the pylock command's tests: the installed console script, flock(1)
holders, and kernel probes.  Every test runs the real `pylock` script (the one
pip installed beside this interpreter) as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support import env_with_repo
from tests.support.kernel_locks import blocked_waiters, wait_blocked  # noqa: F401 (for the CLI tests)

PYLOCK = os.path.join(os.path.dirname(sys.executable), "pylock")
FLOCK = shutil.which("flock")

needs_flock = pytest.mark.skipif(FLOCK is None, reason="util-linux flock(1) is not installed")


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = env_with_repo()
    env.pop("PYLOCK_DEBUG", None)
    if extra:
        env.update(extra)
    return env


def cli(
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run the installed `pylock` console script to completion."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(
        [PYLOCK, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
        **kwargs,
    )


def flock(*args: str, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    assert FLOCK is not None
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([FLOCK, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


def free_now(path: str) -> bool:
    """Whether an exclusive flock(2) on path would be granted right now (nothing written)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    finally:
        os.close(fd)


class Holder:
    """A process holding path through `<tool> [opts] path sh -c ...` until released.

    It prints its shell's pid once it holds the lock (the pipe is the
    synchronisation) and holds it until its stdin closes.
    """

    def __init__(self, tool: Sequence[str], path: str, *opts: str) -> None:
        self.proc = subprocess.Popen(
            [*tool, *opts, path, "sh", "-c", "echo $$; read x || true"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), f"holder failed: {line!r}"
        self.shell_pid = int(line)

    def release(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.release()


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(word) for word in f.read().split()]
    except OSError:
        return []


def signal_mask(pid: int, field: str) -> int:
    """A signal set from /proc/<pid>/status (SigIgn, SigBlk, ...), as a bit mask."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")
