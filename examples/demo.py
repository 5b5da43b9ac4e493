"""pylock in one minute: a holder, a refused second instance, a kill, a takeover.

Run from a clone after `pip install .`:  python examples/demo.py

However it ends (done, an error, Ctrl-C, SIGTERM, or its output piped into a
reader that stops early, as `| head -2`), it stops the processes it started
and removes its directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PYLOCK = [sys.executable, "-m", "pylock"]

# Commands run from the demo's own directory, so "python -m pylock" finds the
# installed package rather than the source folder of a checkout.
WORKDIR = ""
# What the demo started, each with whether it leads a process group of its own.
STARTED: list[tuple[subprocess.Popen[str], bool]] = []


def start(argv: list[str], own_group: bool = False) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, text=True, cwd=WORKDIR, start_new_session=own_group
    )
    STARTED.append((child, own_group))
    return child


def show(title: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    print(f"\n$ pylock {' '.join(argv[3:])}    # {title}")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=WORKDIR)
    print((done.stdout + done.stderr).rstrip())
    print(f"(exit code {done.returncode})")
    return done


def main() -> None:
    path = os.path.join(WORKDIR, "daemon.lock")

    print(f"1. A 'daemon' takes {path} and keeps running.")
    holder = start(
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
        own_group=True,  # the daemon and its command, killed together below
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":  # the daemon runs: the lock is held
        raise SystemExit("the daemon did not start")

    print("\n2. A second instance is refused at once, and told who holds the lock.")
    show("second instance, -n: fail if held", [*PYLOCK, "run", "-n", path, "--", "echo", "never"])
    show("who holds it?", [*PYLOCK, "who", path])

    print("\n3. A waiter blocks in the kernel; the daemon is killed with SIGKILL.")
    waiter = start(
        [
            *PYLOCK,
            "run",
            path,
            "--",
            sys.executable,
            "-c",
            "import time; print(time.monotonic(), flush=True)",
        ],
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


def stop_started() -> None:
    """Kill what the demo started (the daemon with its command: its process
    group) and wait for it, so no process outlives the demo."""
    for child, own_group in STARTED:
        if own_group and child.returncode is None:
            # Not reaped yet, so its pid is still its group's id: the group
            # goes, the command it started too, even if the leader is gone.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        elif child.poll() is None:
            child.kill()
        child.wait()


def run() -> int:
    global WORKDIR
    # SIGTERM ends the demo as Ctrl-C does: through the clean-up below.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Line by line even into a pipe, so a reader sees each step as it happens.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    WORKDIR = tempfile.mkdtemp(prefix="pylock-demo-")
    try:
        main()
        sys.stdout.flush()
        return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`| head -2`): nothing more can
        # be said, and the interpreter must not fail flushing at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        stop_started()
        shutil.rmtree(WORKDIR, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run())
