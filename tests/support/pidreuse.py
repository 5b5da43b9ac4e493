"""Recycled pids against holder(), holder_exit, wait_exit and verified.

Runs as pid 1 of a private pid namespace (see pidns.py), so it can hand a dead
holder's pid to an impostor at will. Two roles:

* the orchestrator (pid 1, never imports pylock, single-threaded so its forks
  are clean) starts each victim at pid N, kills and reaps it, and at once forks
  an impostor at the same pid N;
* the watcher (a separate process, so the victims are not its children, as a
  lock's holder usually is not) looks at the lock through pylock and reports.

Per trial, with the victim V holding the lock at pid N (record: pid N, V's
start identity, info {"trial": i}):

 1. the watcher snapshots ``h = lock.holder()`` (must be V, verified) and arms
    ``holder_exit(h)``, ``holder_exit(lock)`` and ``wait_exit(h)``;
 2. V is SIGKILLed and reaped; impostor A is forked at pid N and takes a plain
    flock on the same file (the kernel now shows pid N holding it, under a
    record that still names pid N);
 3. the watcher checks: every armed wait has returned (it followed V, not the
    pid); a new ``holder_exit(h)``/``wait_exit(h)`` returns at once and
    ``h.alive()`` is False; ``holder()``, ``holders()`` and ``LockHeld`` name A
    by A's own identity, never with V's record (info), never V's start time;
 4. A is killed; impostor B is forked at pid N without locking: ``holder()`` is
    None and the lock can be taken.

Prints one JSON object: counts of trials passing each check, and failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

VICTIM = (
    "import sys, pylock\n"
    "lock = pylock.Lock(sys.argv[1], info={'trial': int(sys.argv[2])})\n"
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)

CHECKS = (
    "snapshot",
    "holder_exit",
    "holder_exit_lock",
    "wait_exit",
    "late_holder_exit",
    "late_wait_exit",
    "alive_false",
    "holder_names_impostor",
    "holders_names_impostor",
    "lockheld_names_impostor",
    "holder_none_when_free",
)

WAIT = 10.0  # generous bound for "has returned"; the figures record the real times


# ---------------------------------------------------------------- the watcher


async def _watcher() -> None:
    import pylock
    from pylock._core import process as _process

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout
    path = sys.argv[2]
    lock = pylock.Lock(path)
    print(json.dumps({"pinning": _process.pinning_available()}), file=out, flush=True)
    armed: dict[str, Any] = {}
    while True:
        line = (await reader.readline()).decode().split()
        if not line or line[0] == "quit":
            return
        cmd, args = line[0], [int(x) for x in line[1:]]
        res: dict[str, Any] = {}
        if cmd == "snap":
            pid, trial = args
            h = lock.holder()
            res["snapshot"] = bool(
                h is not None and h.pid == pid and h.verified and h.info == {"trial": trial}
            )
            res["pidfs_ino"] = h.pidfs_ino if h is not None else -1
            armed = {"h": h, "trial": trial}
            if h is not None:
                armed["exit_h"] = asyncio.ensure_future(pylock.holder_exit(h))
                armed["exit_lock"] = asyncio.ensure_future(pylock.holder_exit(lock))
                box: list[Any] = []
                t = threading.Thread(target=_wait_exit_into, args=(pylock, h, box))
                t.start()
                armed["thread"], armed["box"] = t, box
                # Let both watches register before the victim dies.
                for _ in range(3):
                    await asyncio.sleep(0)
        elif cmd == "check":
            pid, victim_start, impostor_start = args
            res = await _check_after_reuse(pylock, lock, armed, pid, victim_start, impostor_start)
        elif cmd == "free":
            h2 = lock.holder()
            res["holder_none_when_free"] = h2 is None
            if h2 is None:
                try:
                    lock.acquire(blocking=False)
                    lock.release()
                except pylock.LockError as e:
                    res["holder_none_when_free"] = False
                    res["free_error"] = str(e)
            else:
                res["free_holder"] = repr(h2)
        print(json.dumps(res), file=out, flush=True)


def _wait_exit_into(pylock: Any, h: Any, box: list[Any]) -> None:
    box.append(pylock.wait_exit(h, WAIT))


async def _check_after_reuse(
    pylock: Any,
    lock: Any,
    armed: dict[str, Any],
    pid: int,
    victim_start: int,
    impostor_start: int,
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    h = armed.get("h")
    if h is None:
        return {"error": "no snapshot"}
    t0 = time.monotonic()
    for key, name in (("exit_h", "holder_exit"), ("exit_lock", "holder_exit_lock")):
        try:
            await asyncio.wait_for(armed[key], WAIT)
            res[name] = True
        except asyncio.TimeoutError:
            res[name] = False
        except Exception as e:
            res[name] = False
            res[name + "_error"] = repr(e)
    res["armed_wait_s"] = round(time.monotonic() - t0, 4)
    armed["thread"].join(WAIT)
    res["wait_exit"] = armed["box"] == [True]

    t1 = time.monotonic()
    try:
        await asyncio.wait_for(pylock.holder_exit(h), WAIT)
        res["late_holder_exit"] = True
    except (asyncio.TimeoutError, Exception) as e:
        res["late_holder_exit"] = False
        res["late_holder_exit_error"] = repr(e)
    res["late_holder_exit_s"] = round(time.monotonic() - t1, 4)
    res["late_wait_exit"] = pylock.wait_exit(h, WAIT) is True
    res["alive_false"] = h.alive() is False

    def is_impostor(x: Any) -> bool:
        return bool(
            x is not None
            and x.pid == pid
            and x.start_time == impostor_start
            and x.info is None
            and x.start_time != victim_start
        )

    h2 = lock.holder()
    res["holder_names_impostor"] = is_impostor(h2) and h2.verified
    if not res["holder_names_impostor"]:
        res["holder_seen"] = repr(h2)
    hs = pylock.holders(lock.path)
    res["holders_names_impostor"] = len(hs) == 1 and is_impostor(hs[0])
    if not res["holders_names_impostor"]:
        res["holders_seen"] = repr(hs)
    try:
        lock.acquire(blocking=False)
    except pylock.LockHeld as e:
        res["lockheld_names_impostor"] = is_impostor(e.holder)
        if not res["lockheld_names_impostor"]:
            res["lockheld_seen"] = repr(e.holder)
    else:
        lock.release()
        res["lockheld_names_impostor"] = False
        res["lockheld_seen"] = "acquired a lock the impostor holds"
    return res


# ---------------------------------------------------------------- the orchestrator


def _fork_impostor(pid: int, path: str, take_lock: bool) -> tuple[int, int]:
    """Fork a process at pid; returns (pid, start_time) once it is ready."""
    from tests.support.pidns import fork_at, start_time_of

    ready_r, ready_w = os.pipe()
    child = fork_at(pid)
    if child == 0:
        try:
            os.close(ready_r)
            if take_lock:
                fd = os.open(path, os.O_RDWR)
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(ready_w, b"r")
            while True:
                signal.pause()
        finally:
            os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    return child, start_time_of(child)


def _end(pid: int) -> None:
    from tests.support.pidns import reap

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
    reap(pid)


def orchestrate(path: str, trials: int, base_pid: int) -> dict[str, Any]:
    from tests.support.pidns import PidNotAvailable, in_private_pidns, spawn_at, start_time_of

    assert in_private_pidns(), "must run as pid 1 of a private pid namespace"
    open(path, "a").close()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pidreuse", "watcher", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdin is not None and watcher.stdout is not None

    def ask(line: str) -> dict[str, Any]:
        assert watcher.stdin is not None and watcher.stdout is not None
        watcher.stdin.write(line + "\n")
        watcher.stdin.flush()
        reply = watcher.stdout.readline()
        if not reply:
            raise RuntimeError(f"watcher died (exit {watcher.wait()}) after {line!r}")
        return dict(json.loads(reply))

    hello = json.loads(watcher.stdout.readline())
    passed = dict.fromkeys(CHECKS, 0)
    failures: list[dict[str, Any]] = []
    armed_wait: list[float] = []
    late_wait: list[float] = []
    pid_conflicts = 0
    pidfs_in_snapshots = 0
    done = 0
    next_pid = base_pid
    while done < trials:
        n = next_pid
        next_pid += 1
        try:
            victim = spawn_at(
                n,
                [sys.executable, "-c", VICTIM, path, str(done)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        except PidNotAvailable:
            pid_conflicts += 1
            continue
        assert victim.stdout is not None
        if victim.stdout.readline().strip() != "held":
            raise RuntimeError(f"victim at pid {n} did not take the lock: exit {victim.wait()}")
        victim_start = start_time_of(n)
        snap = ask(f"snap {n} {done}")
        if snap.get("pidfs_ino", 0) > 0:
            pidfs_in_snapshots += 1
        victim.kill()
        victim.wait()
        reaped_by_us = victim.returncode == -9
        try:
            imp, imp_start = _fork_impostor(n, path, take_lock=True)
        except PidNotAvailable:
            # Someone took the pid between reap and fork: the armed waits
            # still have to be drained before the next trial.
            pid_conflicts += 1
            ask(f"check {n} {victim_start} -1")
            continue
        res = ask(f"check {n} {victim_start} {imp_start}")
        _end(imp)
        try:
            free_imp, _ = _fork_impostor(n, path, take_lock=False)
        except PidNotAvailable:
            pid_conflicts += 1
            continue
        res.update(ask("free"))
        _end(free_imp)
        res["snapshot"] = snap.get("snapshot", False)
        ok = True
        for check in CHECKS:
            if res.get(check) is True:
                passed[check] += 1
            else:
                ok = False
        if not reaped_by_us:
            ok = False
            res["victim_returncode"] = victim.returncode
        if "armed_wait_s" in res:
            armed_wait.append(res["armed_wait_s"])
        if "late_holder_exit_s" in res:
            late_wait.append(res["late_holder_exit_s"])
        if not ok and len(failures) < 10:
            failures.append({"trial": done, "pid": n, **res})
        done += 1
    watcher.stdin.write("quit\n")
    watcher.stdin.close()
    watcher.wait()
    return {
        "trials": trials,
        "pinning": hello["pinning"],
        "pidfs_in_snapshots": pidfs_in_snapshots,
        "passed": passed,
        "failures": failures,
        "pid_conflicts": pid_conflicts,
        "armed_wait_max_s": max(armed_wait, default=0),
        "late_holder_exit_max_s": max(late_wait, default=0),
    }


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "watcher":
        asyncio.run(_watcher())
        return
    path, trials, base = args[0], int(args[1]), int(args[2])
    print(json.dumps(orchestrate(path, trials, base)))


if __name__ == "__main__":
    main()
