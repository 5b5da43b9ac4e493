"""Storms a host program can raise against pylock: forks from any thread while
other threads churn Lock objects, exceptions from signal handlers landing
anywhere in acquire and release, and hand-overs racing across threads and
loops.  Each runs in a child process of its own (forks and signal storms are
process-wide) and reports its counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support import env_with_repo
from tests.support.sizes import Figures, size

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, fork")


def run_child(code: str, *args: object, limit: float = 300.0) -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=limit,
            env=env_with_repo(),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the storm hung: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


FORK_STORM = """
    import json, os, sys, threading
    import pylock

    directory, forks = sys.argv[1], int(sys.argv[2])
    stop = threading.Event()

    def churn(n):
        # Open, take, release and close Lock objects as fast as possible: the
        # descriptor numbers they free are reused at once by the forker's pipes.
        i = 0
        while not stop.is_set():
            lock = pylock.Lock(os.path.join(directory, f"churn-{n}-{i % 4}.lock"))
            lock.acquire()
            lock.release()
            lock.close()
            i += 1

    def lock_files_open():
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(directory):
                    count += 1
            except OSError:
                pass
        return count

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    lost_pipe = kept_lock = other = 0
    for _ in range(forks):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if lock_files_open():
                    code = 4        # the child kept one of the parent's lock files
                os.write(w, b"x")   # the parent's pipe must still be open here
            except OSError:
                code = 3
            os._exit(code)
        os.close(w)
        got = os.read(r, 1)
        os.close(r)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status == 3 or (status == 0 and got != b"x"):
            lost_pipe += 1
        elif status == 4:
            kept_lock += 1
        elif status != 0:
            other += 1
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"forks": forks, "lost_pipe": lost_pipe, "kept_lock": kept_lock,
                      "other": other}))
"""


def test_fork_storm_against_churning_locks(tmp_path, figures: Figures) -> None:
    """A fork at any moment: the child holds no pylock descriptor and closes
    none that is not pylock's."""
    out = run_child(FORK_STORM, tmp_path, size(2000, 10000))
    figures(**out)
    assert out["lost_pipe"] == 0, "a child closed a descriptor of the program's"
    assert out["kept_lock"] == 0, "a child kept a lock file open"
    assert out["other"] == 0


SIGNAL_STORM = """
    import json, os, signal, subprocess, sys, time
    import pylock

    path, rounds = sys.argv[1], int(sys.argv[2])

    # Another process takes and releases the lock all the time.
    churner = subprocess.Popen([sys.executable, "-c",
        "import sys, pylock\\n"
        "l = pylock.Lock(sys.argv[1])\\n"
        "print('go', flush=True)\\n"
        "while True:\\n    l.acquire(); l.release()\\n", path],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    churner.stdout.readline()

    class Boom(Exception):
        pass

    storm = [False]

    def boom(signum, frame):
        # Only inside stormed(): the harness around it stays out of the storm
        # (a handler may run late, at any later call).
        if storm[0]:
            raise Boom

    lock = pylock.Lock(path)
    lock.acquire()
    lock.release()
    fd = lock._handle

    def kernel_holds():
        with open(f"/proc/self/fdinfo/{fd}") as f:
            return any(line.startswith("lock:") for line in f)

    ALRM = {signal.SIGALRM}

    def stormed(step):
        # step() with the storm let in; returns with SIGALRM blocked again.
        # A Boom that lands anywhere in here (even right after the mask
        # call) is caught by the outer try.
        try:
            try:
                storm[0] = True
                signal.pthread_sigmask(signal.SIG_UNBLOCK, ALRM)
                step()
            finally:
                storm[0] = False
                signal.pthread_sigmask(signal.SIG_BLOCK, ALRM)
        except Boom:
            return 1
        return 0

    def release_if_locked():
        if lock.locked:
            lock.release()

    signal.pthread_sigmask(signal.SIG_BLOCK, ALRM)
    signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    broken = interrupted = 0
    for _ in range(rounds):
        interrupted += stormed(lock.acquire)
        broken += lock.locked != kernel_holds()
        interrupted += stormed(release_if_locked)
        broken += lock.locked != kernel_holds()
        release_if_locked()
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ALRM)
    churner.kill()
    churner.wait()
    # No guard or kernel lock stranded by the storm: the lock still works.
    try:
        usable = lock.acquire(timeout=10)
        lock.release()
    except pylock.LockError as exc:
        usable = repr(exc)
    print(json.dumps({"rounds": rounds, "interrupted": interrupted, "broken": broken,
                      "usable_after": usable}))
"""


def test_exceptions_from_signal_handlers_never_split_locked_from_the_kernel(
    tmp_path, figures: Figures
) -> None:
    """KeyboardInterrupt-like exceptions land anywhere in acquire and release:
    `locked` and the kernel's lock always agree afterwards."""
    out = run_child(SIGNAL_STORM, tmp_path / "storm.lock", size(20000, 100000))
    figures(**out)
    assert out["interrupted"] > 0, "the storm never interrupted anything"
    assert out["broken"] == 0
    # Which attempt uses the object is kept by the C core (pl_own/pl_disown):
    # no exception can strand it, so the object still works afterwards.
    assert out["usable_after"] is True, f"the storm left the Lock unusable: {out['usable_after']}"


HANDOVER_RACE = """
    import asyncio, json, sys, threading
    import pylock

    path, rounds = sys.argv[1], int(sys.argv[2])
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race is in the switches
    lock = pylock.Lock(path)
    go, taken = threading.Semaphore(0), threading.Semaphore(0)

    def other_thread():
        while True:
            go.acquire()
            if stop:
                return
            lock.acquire()
            taken.release()
            lock.release()       # races the task's acquire_async below

    stop = False
    t = threading.Thread(target=other_thread)
    t.start()

    async def main():
        lost = 0
        for _ in range(rounds):
            go.release()
            taken.acquire()
            try:
                await asyncio.wait_for(lock.acquire_async(), 5)
            except asyncio.TimeoutError:
                lost += 1          # the release's wake-up went nowhere
                continue
            lock.release()
        return lost

    lost = asyncio.run(main())
    stop = True
    go.release()
    t.join()
    print(json.dumps({"rounds": rounds, "lost": lost}))
"""


def test_thread_release_racing_acquire_async_on_one_object(tmp_path, figures: Figures) -> None:
    out = run_child(HANDOVER_RACE, tmp_path / "race.lock", size(30000, 100000))
    figures(**out)
    assert out["lost"] == 0
