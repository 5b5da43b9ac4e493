"""Small process and /proc helpers (the child-process harness itself is
tests.support.children)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from tests.support.children import Script

__all__ = ["Script"]  # the harness, re-exported for the scenarios


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def stat_fields(pid: int | str = "self") -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state first)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()


def start_time(pid: int | str = "self") -> int:
    """The kernel's start time of pid, in clock ticks since boot (stat field 22)."""
    return int(stat_fields(pid)[19])


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def cmdline(pid: int | str = "self") -> tuple[str, ...]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return tuple(a.decode() for a in f.read().split(b"\0") if a)


def wakeups(pid: int | str = "self") -> int:
    """Context switches of every thread of pid so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def fds_on(pid: int, path: str) -> list[int]:
    """The descriptors of pid that are open on the file at path (same dev and inode)."""
    st = os.stat(path)
    found = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return []
    for name in names:
        try:
            fst = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
            found.append(int(name))
    return found


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        return stat_fields(pid)[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_for(condition: Any, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a kernel-visible condition that has no event to wait on (a test
    observing another process's state), failing after timeout."""
    import time

    deadline = time.monotonic() + timeout
    delay = 0.0005
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


NOBODY = (65534, 65534)


def become(user: tuple[int, int]) -> None:
    """Drop to (uid, gid) for good, like a process started by that user.

    A process that changed its credentials is made non-dumpable, which hides
    its own /proc/self/fd* from itself; a user's ordinary processes are
    dumpable, so restore that.
    """
    import ctypes

    os.setgroups([])
    os.setgid(user[1])
    os.setuid(user[0])
    pr_set_dumpable = 4
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 1, 0, 0, 0)


def describe_exception(e: BaseException) -> dict[str, Any]:
    return {
        "exc": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "errno": getattr(e, "errno", None),
        "code": getattr(e, "code", None),
        "filename": getattr(e, "filename", None),
        "msg": str(e),
    }


def in_child(fn: Any, timeout: float = 30.0, user: tuple[int, int] | None = None) -> dict[str, Any]:
    """Run fn() in a forked child (as user (uid, gid) if given) and return
    {"value": ..., "elapsed": s} or an exception description, or {"hang": True}
    when it did not finish within timeout (the child is then killed).

    A hang in pylock must fail a test, not stall the suite: that is what the
    separate process is for.
    """
    import json
    import select
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if user is not None:
                become(user)
            t0 = time.monotonic()
            try:
                res: dict[str, Any] = {"value": fn()}
            except BaseException as e:
                res = describe_exception(e)
            res["elapsed"] = time.monotonic() - t0
            data = json.dumps(res, default=repr).encode()
            while data:
                data = data[os.write(w, data) :]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([r], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return {"hang": True}
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return dict(json.loads(b"".join(chunks)))


def wait_threads_end(timeout: float = 10.0) -> None:
    """pylock's wait threads end by themselves just after handing over their
    result, and nobody joins them: wait for them, then for the kernel to drop
    their tasks from /proc, a moment after a thread's Python part is over
    (nothing notifies the exit of a detached thread: a bounded poll)."""
    for thread in threading.enumerate():
        if thread.name.startswith("pylock wait"):
            thread.join(timeout)
            assert not thread.is_alive(), f"{thread.name} goes on after its wait ended"
    deadline = time.monotonic() + timeout
    while len(os.listdir("/proc/self/task")) > threading.active_count():
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
