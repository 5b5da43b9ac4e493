"""The pylock command as its tests run it: the console script pip installed
beside this interpreter, run as a subprocess, and processes holding a lock
through it or through util-linux flock(1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support import env_with_repo
from tests.support.children import Child

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


class Holder(Child):
    """A process holding path through `<tool> [opts] path sh -c ...` until released.

    It prints its shell's pid once it holds the lock (the pipe is the
    synchronisation) and holds it until its stdin closes.
    """

    def __init__(self, tool: Sequence[str], path: str, *opts: str) -> None:
        argv = [*tool, *opts, path, "sh", "-c", "echo $$; read x || true"]
        super().__init__(argv, env=cli_env(), capture_stderr=False)
        line = self.expect()
        assert line.isdigit(), f"holder failed: {line!r}"
        self.shell_pid = int(line)

    def release(self) -> int:
        """Close its stdin; its exit status once it has ended."""
        self.close_stdin()
        code = self.wait(timeout=30)
        super().close()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.release()
        super().close()
