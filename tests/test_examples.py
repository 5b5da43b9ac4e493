"""examples/demo.py ends clean however it ends: finished, its output cut short
by a reader that stops (`| head -2`), Ctrl-C, or an error in its own code.
Each time no process it started outlives it and its directory is gone.

(examples/daemon.py: tests/daemon/test_example_daemon.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import pylock
from tests.support import REPO_ROOT, env_with_repo

DEMO = os.path.join(REPO_ROOT, "examples", "demo.py")
pytestmark = pytest.mark.checkout  # runs examples/demo.py


def demo_env(tmp_path: Path) -> dict[str, str]:
    # The demo makes its directory under TMPDIR: here, one of the test's own.
    return env_with_repo({**os.environ, "TMPDIR": str(tmp_path)})


def survivors(tmp_path: Path) -> list[int]:
    """Processes still running whose command line names the test's directory
    (the demo's daemon and waiter name their lock file in it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # exited meanwhile
        if str(tmp_path).encode() in cmdline:
            found.append(int(entry))
    return found


def assert_nothing_left(tmp_path: Path) -> None:
    # A process killed an instant ago may still be on its way out: each one
    # found must end within the wait, and none may still run after it.
    lingering = [pid for pid in survivors(tmp_path) if not pylock.wait_exit(pid, timeout=30)]
    assert lingering == [], f"processes the demo started still run: {lingering}"
    assert list(tmp_path.glob("pylock-demo-*")) == []


def test_the_demo_runs_to_the_end_and_leaves_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, DEMO], capture_output=True, text=True, env=demo_env(tmp_path), timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "is held by pid" in done.stdout and "Traceback" not in done.stderr
    assert done.stdout.rstrip().endswith("(exit code 1)")  # "and now": free
    assert_nothing_left(tmp_path)


def test_piped_into_head_the_demo_ends_quietly_and_leaves_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" "{DEMO}" | head -2'],
        capture_output=True,
        text=True,
        env=demo_env(tmp_path),
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 2
    assert done.stdout.startswith("1. A 'daemon' takes ")
    assert_nothing_left(tmp_path)


def test_ctrl_c_ends_the_demo_quietly_and_leaves_nothing(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, DEMO],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(tmp_path),
        start_new_session=True,
    )
    assert demo.stdout is not None
    seen = []
    for line in demo.stdout:  # the daemon holds the lock from step 2 on
        seen.append(line)
        if line.startswith("2. "):
            break
    assert survivors(tmp_path), f"no daemon running: {seen}"
    os.killpg(demo.pid, signal.SIGINT)  # as Ctrl-C: the terminal's foreground group
    _, err = demo.communicate(timeout=60)
    assert (demo.returncode, err) == (130, "")
    assert_nothing_left(tmp_path)


def test_an_error_in_the_demo_still_leaves_nothing(tmp_path: Path) -> None:
    # The demo's own step fails once its daemon runs.
    failing = (
        "import runpy, sys\n"
        f"demo = runpy.run_path({DEMO!r}, run_name='demo')\n"
        "def broken(title, argv):\n"
        "    raise RuntimeError('the step failed')\n"
        "demo['main'].__globals__['show'] = broken\n"
        "sys.exit(demo['run']())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", failing],
        capture_output=True,
        text=True,
        env=demo_env(tmp_path),
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.rstrip().endswith("RuntimeError: the step failed")
    assert "takes " in done.stdout  # the daemon had started
    assert_nothing_left(tmp_path)
