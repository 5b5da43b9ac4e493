"""Shared fixtures: lock paths and real holder processes that report through pipes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every module but test_portable.py uses Linux facilities (/proc, flock(1),
# mounts, pid namespaces, seccomp): elsewhere only the portable module runs.
if not sys.platform.startswith("linux"):
    collect_ignore_glob = ["stress/*", "test_[!p]*.py", "test_process.py"]


def pytest_report_header() -> str:
    if sys.platform.startswith("linux"):
        return "pylock: the whole suite (Linux)"
    return f"pylock: {sys.platform}: tests/test_portable.py only (the rest needs Linux)"


# A child that takes a lock, prints "locked <pid>" and then holds it until its
# stdin closes (or it is killed).  Synchronisation is by pipe, never by sleep.
HOLDER_SCRIPT = textwrap.dedent(
    """
    import json, sys, pylock
    path, shared, info = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
    lock = pylock.Lock(path, shared=shared, info=info)
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.read()
    lock.release()
    """
)


class HolderProcess:
    """A real process holding a pylock lock until released or killed."""

    def __init__(self, path: os.PathLike[str] | str, shared: bool = False, info: object = None):
        import json

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                HOLDER_SCRIPT,
                os.fspath(path),
                str(int(shared)),
                json.dumps(info),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "locked", f"holder failed to lock: {line!r}"
        self.pid = self.proc.pid

    def release(self) -> None:
        """Ask the holder to release and exit; returns once it has exited."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def lock_path(tmp_path: Path) -> str:
    return str(tmp_path / "test.lock")


@pytest.fixture
def spawn_holder() -> Iterator[type[HolderProcess]]:
    started: list[HolderProcess] = []

    class Tracked(HolderProcess):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    yield Tracked
    for holder in started:
        holder.close()


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mounts, other users)"
)
