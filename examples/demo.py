"""pylock in one minute: a holder, a refused second instance, a kill, a takeover.

Run from a clone after `pip install .`:  python examples/demo.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

PYLOCK = [sys.executable, "-m", "pylock"]


# Commands run from the demo's own directory, so "python -m pylock" finds the
# installed package rather than the source folder of a checkout.
WORKDIR = tempfile.mkdtemp(prefix="pylock-demo-")


def show(title: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    print(f"\n$ pylock {' '.join(argv[3:])}    # {title}")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=WORKDIR)
    print((done.stdout + done.stderr).rstrip())
    print(f"(exit code {done.returncode})")
    return done


def main() -> None:
    path = os.path.join(WORKDIR, "daemon.lock")

    print(f"1. A 'daemon' takes {path} and keeps running.")
    holder = subprocess.Popen(
        [
            *PYLOCK,
            "run",
            "--info",
            '{"port": 8080}',
            path,
            "--",
            sys.executable,
            "-c",
            "import sys, time; print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=WORKDIR,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":  # the daemon runs: the lock is held
        raise SystemExit("the daemon did not start")

    print("\n2. A second instance is refused at once, and told who holds the lock.")
    show("second instance, -n: fail if held", [*PYLOCK, "run", "-n", path, "--", "echo", "never"])
    show("who holds it?", [*PYLOCK, "who", path])

    print("\n3. A waiter blocks in the kernel; the daemon is killed with SIGKILL.")
    waiter = subprocess.Popen(
        [
            *PYLOCK,
            "run",
            path,
            "--",
            sys.executable,
            "-c",
            "import time; print(time.monotonic(), flush=True)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=WORKDIR,
    )
    assert waiter.stdout is not None
    time.sleep(0.5)  # only so the waiter is really blocked before the kill
    killed_at = time.monotonic()
    os.killpg(holder.pid, signal.SIGKILL)  # the daemon and its command: no cleanup runs
    took_over_at = float(waiter.stdout.readline())
    holder.wait()
    waiter.wait()
    print(
        f"   the waiter held the lock {1000 * (took_over_at - killed_at):.2f} ms after the kill"
        " (this includes starting the waiter's command)"
    )
    show("and now", [*PYLOCK, "who", path])


if __name__ == "__main__":
    main()
