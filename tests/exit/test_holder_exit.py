"""holder_exit, wait_exit and ExitWatcher with real processes.

CI runs this module twice: as is (pidfd on this kernel) and under the seccomp
launcher that makes pidfd_open, pidfd_send_signal and pidfd_getfd fail with
ENOSYS, where the SIGCHLD / lock / identity fallback does the work.  The
fallback-only cases (SIGCHLD blocked, chained handlers, ignored SIGCHLD) also
run here in subprocesses under that launcher, so both paths are covered in one
run; tests/exit/test_exit_signals.py has the hostile host programs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import gc
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import pylock
from pylock import ExitWatcher, Holder, Lock, holder_exit, wait_exit
from pylock._core import process as _process
from pylock._exit.api import ProcessExit
from tests.support import env_with_repo, pidns
from tests.support.children import HolderProcess, NonChild, Sleeper, sleep_processes
from tests.support.kernel_locks import open_fds
from tests.support.procs import wait_threads_end

PINNING = _process.pinning_available()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECCOMP = [sys.executable, "-m", "tests.support.seccomp", "--"]

LOCK_HOLDER = textwrap.dedent(
    """
    import sys, pylock
    lock = pylock.Lock(sys.argv[1])
    lock.acquire()
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "release":
        lock.release()
        print("released", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def child(sleeper: Sleeper) -> Sleeper:
    """A child of ours that runs until its stdin closes."""
    return sleeper


# Every event-loop test marked any_loop runs on asyncio's default loop and on
# uvloop (when installed; .ci/run installs it).
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
_loop_kind = ["asyncio"]


@pytest.fixture(
    params=[
        "asyncio",
        pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop")),
    ]
)
def any_loop(request: pytest.FixtureRequest) -> Iterator[str]:
    _loop_kind[0] = request.param
    yield request.param
    _loop_kind[0] = "asyncio"


def run(coro: Any) -> Any:
    # asyncio.Runner is Python 3.11+; these two are the same on every version.
    if _loop_kind[0] == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


async def started(coro: Any) -> asyncio.Task[Any]:
    """A task that has run up to its first wait: the watch is in place."""
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)
    assert not task.done(), task
    return task


# -- a process that is not our child -------------------------------------------


@pytest.mark.usefixtures("any_loop")
def test_sigkill_of_a_non_child_wakes_holder_exit(non_child: type[NonChild]) -> None:
    nc = non_child()

    async def main() -> int | None:
        task = await started(holder_exit(nc.pid))
        nc.kill()
        return await asyncio.wait_for(task, 60)

    # Not ours, not reaped yet by its parent: the kernel cannot tell a status.
    assert run(main()) is None
    assert nc.reap() == -signal.SIGKILL


def test_sigkill_of_a_non_child_wakes_wait_exit(non_child: type[NonChild]) -> None:
    nc = non_child()
    # The kill may land before or after wait_exit pins the process; both
    # must end the wait.
    killer = threading.Timer(0.05, nc.kill)
    killer.start()
    try:
        assert wait_exit(nc.pid, timeout=60) is True
    finally:
        killer.join()


def test_exit_status_after_reap_on_kernels_with_pidfd_info_exit(
    non_child: type[NonChild],
) -> None:
    if not PINNING:
        pytest.skip("pinning (pidfd_open) is refused here")
    nc = non_child()
    pinned = _process.pin(nc.pid)
    assert pinned is not None
    try:
        nc.kill()
        nc.zombify()
        assert pinned.exited()
        assert pinned.returncode() is None  # not ours and not reaped
        assert nc.reap() == -signal.SIGKILL
        release = tuple(int(x) for x in os.uname().release.split(".")[:2])
        expected = -signal.SIGKILL if release >= (6, 15) else None
        assert pinned.returncode() == expected
    finally:
        pinned.close()


@pytest.mark.usefixtures("any_loop")
def test_a_non_child_zombie_reads_as_exited(non_child: type[NonChild]) -> None:
    nc = non_child()
    nc.kill()
    nc.zombify()
    assert wait_exit(nc.pid, timeout=0) is True
    assert run(holder_exit(nc.pid, timeout=0)) is None
    assert not _process.is_alive(_process.ProcessIdentity(nc.pid, 0, ""))


# -- children of the caller ----------------------------------------------------


@pytest.mark.usefixtures("any_loop")
@pytest.mark.parametrize(("code", "expected"), [("pass", 0), ("raise SystemExit(3)", 3)])
def test_a_childs_status_is_reported_and_popen_still_reaps_it(code: str, expected: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", code])
    assert run(holder_exit(proc.pid, timeout=60)) == expected
    assert proc.wait(timeout=60) == expected
    assert proc.returncode == expected


@pytest.mark.usefixtures("any_loop")
def test_a_killed_childs_status_is_minus_the_signal(child: Sleeper) -> None:
    async def main() -> int | None:
        task = await started(holder_exit(child.pid))
        child.proc.send_signal(signal.SIGKILL)
        return await asyncio.wait_for(task, 60)

    assert run(main()) == -signal.SIGKILL
    assert child.proc.wait() == -signal.SIGKILL


def test_wait_exit_on_a_child_does_not_reap_it(child: Sleeper) -> None:
    threading.Timer(0.05, child.proc.terminate).start()
    assert wait_exit(child.pid, timeout=60) is True
    assert child.proc.wait(timeout=60) == -signal.SIGTERM


def test_a_child_zombie_reads_as_exited(child: Sleeper) -> None:
    child.zombify()
    assert wait_exit(child.pid, timeout=0) is True
    assert run(holder_exit(child.pid, timeout=0)) == 0
    assert child.proc.wait() == 0


def test_a_pid_that_is_gone_has_exited() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert wait_exit(proc.pid, timeout=0) is True
    assert run(holder_exit(proc.pid)) is None


# -- timeouts, cancellation, errors ----------------------------------------------


def test_timeouts(child: Sleeper) -> None:
    with pytest.raises(TimeoutError, match=f"pid {child.pid} did not exit within"):
        run(holder_exit(child.pid, timeout=0.05))
    with pytest.raises(TimeoutError):
        run(holder_exit(child.pid, timeout=0))
    assert wait_exit(child.pid, timeout=0.05) is False
    assert wait_exit(child.pid, timeout=0) is False
    for bad in (-2, -0.5, -1e300, float("-inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            wait_exit(child.pid, timeout=bad)
        with pytest.raises(ValueError, match="timeout"):
            run(holder_exit(child.pid, timeout=bad))
    for wrong in ("1", b"1", [1]):
        with pytest.raises(TypeError, match="timeout"):
            wait_exit(child.pid, timeout=wrong)  # type: ignore[arg-type]


# threading.Lock's rule: None and -1 wait forever, and so do inf and any
# huge number; none of them may overflow on the way to the kernel.
FOREVER = [None, -1, -1.0, float("inf"), 1e12, 1e300, 2**70]


@pytest.mark.parametrize("timeout", FOREVER, ids=repr)
def test_timeouts_that_mean_forever_wait_until_the_exit(child: Sleeper, timeout: Any) -> None:
    assert child.proc.stdin is not None
    child.proc.stdin.close()  # it exits now, and the wait must see it
    assert wait_exit(child.pid, timeout=timeout) is True


@pytest.mark.usefixtures("any_loop")
@pytest.mark.parametrize("timeout", FOREVER, ids=repr)
def test_holder_exit_timeouts_that_mean_forever(child: Sleeper, timeout: Any) -> None:
    async def main() -> Any:
        task = await started(holder_exit(child.pid, timeout=timeout))
        assert child.proc.stdin is not None
        child.proc.stdin.close()
        return await task

    assert run(main()) == 0


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_thread_id_is_refused(where: str) -> None:
    # Linux gives threads ids from the pid space; a thread id is not a
    # process that wait_exit could watch (it used to read as "exited").
    if where == "this process":
        stop = threading.Event()
        ready: list[int] = []
        ready_event = threading.Event()

        def body() -> None:
            ready.append(threading.get_native_id())
            ready_event.set()
            stop.wait()

        thread = threading.Thread(target=body)
        thread.start()
        ready_event.wait()
        tid, owner = ready[0], os.getpid()
        proc = None
    else:
        code = (
            "import threading, sys\n"
            "t = threading.Thread(target=sys.stdin.read)\n"
            "t.start()\n"
            "print(t.native_id, flush=True)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        tid, owner = int(proc.stdout.readline()), proc.pid
    try:
        assert tid != owner
        with pytest.raises(ValueError, match=f"{tid} is the id of a thread of .*pass {owner}"):
            wait_exit(tid, timeout=5)
        with pytest.raises(ValueError, match=f"{tid} is the id of a thread"):
            run(holder_exit(tid, timeout=5))
        with pytest.raises(ValueError, match=f"{tid} is the id of a thread"):

            async def watch() -> None:
                async with ExitWatcher() as watcher:
                    watcher.watch(tid)

            run(watch())
    finally:
        if proc is None:
            stop.set()
            thread.join()
        else:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("kind", ["child", "non-child"])
def test_wait_exit_runs_signal_handlers(kind: str, non_child: type[NonChild]) -> None:
    # A handler that raises (like Ctrl-C's KeyboardInterrupt) ends the wait.
    target = Sleeper() if kind == "child" else non_child()

    def on_alarm(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            wait_exit(target.pid, timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if isinstance(target, Sleeper):
            target.close()


# pylock's shared helper threads (the SIGCHLD fan-out, the identity
# schedule) serve every watch and run only while there is one.
HELPERS = ("pylock SIGCHLD", "pylock identity checks")


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name not in HELPERS)


def _helpers_end() -> None:
    """Nothing is watched: pylock's helper threads end by themselves."""
    for thread in threading.enumerate():
        if thread.name in HELPERS:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} still runs with nothing watched"


def _selector_size(loop: asyncio.AbstractEventLoop) -> int:
    """Readers registered with the loop (uvloop does not show them: -1)."""
    selector = getattr(loop, "_selector", None)
    return -1 if selector is None else len(selector.get_map())


@pytest.mark.usefixtures("any_loop")
@pytest.mark.parametrize("kind", ["child", "non-child", "lock holder"])
def test_cancellation_and_timeouts_leak_nothing(
    kind: str, non_child: type[NonChild], lock_path: str
) -> None:
    target: Sleeper | NonChild | Lock
    if kind == "child":
        child = target = Sleeper()
    elif kind == "non-child":
        target = non_child()
    else:  # the fallback waits on the lock in a thread: cancelled 500 times too
        non_child(LOCK_HOLDER, lock_path)
        target = Lock(lock_path)

    def watched() -> int | Lock:
        return target if isinstance(target, Lock) else target.pid

    rounds = 500

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        # Warm up whatever is created once per process (the SIGCHLD wakeup).
        with pytest.raises(TimeoutError):
            await holder_exit(watched(), timeout=0.001)
        # Objects left by earlier tests must not close their descriptors
        # mid-count (that would read as "closed someone else's descriptor"),
        # nor the warm-up's wait thread, which closes its own as it ends.
        gc.collect()
        wait_threads_end()
        fds, readers, threads = open_fds(), _selector_size(loop), _threads()
        for _ in range(rounds):
            task = await started(holder_exit(watched()))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(rounds):
            with pytest.raises(TimeoutError):
                await holder_exit(watched(), timeout=0.0005)
        for _ in range(rounds):
            assert wait_exit(watched(), timeout=0) is False
        wait_threads_end()
        assert _threads() == threads
        assert _selector_size(loop) == readers
        _helpers_end()
        return len(open_fds() - fds), len(fds - open_fds())

    try:
        assert run(main()) == (0, 0)
    finally:
        if kind == "child":
            child.close()


def test_invalid_targets() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    for pid in (0, -1, pid_max + 1):
        with pytest.raises(ValueError, match="not a process id"):
            wait_exit(pid)
        with pytest.raises(ValueError, match="not a process id"):
            run(holder_exit(pid))
    with pytest.raises(ValueError, match="calling process"):
        wait_exit(os.getpid())
    with pytest.raises(ValueError, match="calling process"):
        run(holder_exit(os.getpid()))
    with pytest.raises(TypeError):
        wait_exit("123")  # type: ignore[arg-type]


# -- Lock and Holder targets -----------------------------------------------------


def test_a_free_lock_has_no_holder_to_wait_for(lock_path: str) -> None:
    assert wait_exit(Lock(lock_path), timeout=0) is True
    assert run(holder_exit(Lock(lock_path))) is None


@pytest.mark.usefixtures("any_loop")
def test_holder_exit_of_a_lock_held_by_a_child(lock_path: str) -> None:
    holder = HolderProcess(lock_path)
    try:

        async def main() -> int | None:
            task = await started(holder_exit(Lock(lock_path)))
            holder.proc.kill()
            return await asyncio.wait_for(task, 60)

        assert run(main()) == -signal.SIGKILL
        assert holder.proc.wait() == -signal.SIGKILL
    finally:
        holder.close()


@pytest.mark.usefixtures("any_loop")
@pytest.mark.parametrize("form", ["async", "sync"])
def test_the_exit_of_a_lock_holder_that_is_not_our_child(
    form: str, lock_path: str, non_child: type[NonChild]
) -> None:
    nc = non_child(LOCK_HOLDER, lock_path)
    found = Lock(lock_path).holder()
    assert found is not None and found.pid == nc.pid

    async def main() -> int | None:
        task = await started(holder_exit(Lock(lock_path)))
        nc.kill()
        return await asyncio.wait_for(task, 60)

    if form == "async":
        assert run(main()) is None
    else:
        killer = threading.Timer(0.05, nc.kill)
        killer.start()
        try:
            assert wait_exit(Lock(lock_path), timeout=60) is True
        finally:
            killer.join()
    assert wait_exit(found, timeout=0) is True
    assert Lock(lock_path).holder() is None


def test_a_holder_that_releases_but_lives_on_has_not_exited(
    lock_path: str, non_child: type[NonChild]
) -> None:
    nc = non_child(LOCK_HOLDER, lock_path)
    lock = Lock(lock_path)
    found = lock.holder()
    assert found is not None

    async def main() -> None:
        task = await started(holder_exit(lock, timeout=0.5))
        assert nc.tell("release") == "released"
        with pytest.raises(TimeoutError):
            await task
        assert wait_exit(found, timeout=0.1) is False
        task = await started(holder_exit(found))
        nc.kill()
        assert await asyncio.wait_for(task, 60) is None

    run(main())


@pytest.mark.usefixtures("any_loop")
@pytest.mark.parametrize("form", ["async", "sync"])
def test_a_lock_whose_holder_cannot_be_identified(form: str, lock_path: str) -> None:
    # The lock is held by an open file description that no process has in
    # its table (it is in flight in a unix socket) and there is no record:
    # nobody can be named, so the wait is on the lock itself.
    sender, receiver = socket.socketpair(socket.AF_UNIX)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    socket.send_fds(sender, [b"x"], [fd])
    os.close(fd)

    def drop() -> None:  # closing the receiver frees the description
        receiver.close()
        sender.close()

    try:
        holder = Lock(lock_path).holder()
        assert holder is not None and holder.pid == 0
        assert wait_exit(Lock(lock_path), timeout=0.05) is False
        if form == "async":

            async def main() -> int | None:
                task = await started(holder_exit(Lock(lock_path)))
                drop()
                return await asyncio.wait_for(task, 60)

            assert run(main()) is None
        else:
            dropper = threading.Timer(0.05, drop)
            dropper.start()
            try:
                assert wait_exit(Lock(lock_path), timeout=60) is True
            finally:
                dropper.join()
        assert Lock(lock_path).holder() is None
    finally:
        drop()


@pytest.mark.usefixtures("any_loop")
def test_holder_targets(child: Sleeper) -> None:
    ident = _process.identity_of(child.pid)
    assert ident is not None
    holder = Holder(
        pid=ident.pid,
        start_time=ident.start_time,
        boot_id=ident.boot_id,
        pidfs_ino=ident.pidfs_ino,
        hostname=socket.gethostname(),
    )
    assert wait_exit(holder, timeout=0) is False
    # The pid is alive but it is another process than the record names.
    impostor = dataclasses.replace(holder, start_time=ident.start_time + 1, pidfs_ino=0)
    assert wait_exit(impostor, timeout=0) is True
    assert run(holder_exit(impostor)) is None
    if ident.pidfs_ino:
        other = dataclasses.replace(holder, pidfs_ino=ident.pidfs_ino + 1)
        assert wait_exit(other, timeout=0) is True
    # Recorded during an earlier boot of this machine: long gone.
    earlier = dataclasses.replace(holder, boot_id="00000000-0000-0000-0000-000000000000")
    assert wait_exit(earlier, timeout=0) is True
    # On another machine: nothing here can tell.
    remote = dataclasses.replace(earlier, hostname="elsewhere.invalid")
    with pytest.raises(ValueError, match="another machine"):
        wait_exit(remote)
    with pytest.raises(ValueError, match="no process id"):
        wait_exit(Holder(pid=0))
    # A Holder with a pid alone: whichever process has that pid now.
    bare = Holder(pid=child.pid)
    assert wait_exit(bare, timeout=0) is False
    assert bare.alive()
    me = _process.self_identity()
    with pytest.raises(ValueError, match="calling process"):
        wait_exit(Holder(pid=me.pid, start_time=me.start_time, boot_id=me.boot_id))

    async def main() -> int | None:
        task = await started(holder_exit(holder))
        child.proc.kill()
        return await asyncio.wait_for(task, 60)

    assert run(main()) == -signal.SIGKILL
    assert not holder.alive()


# -- many processes from one loop -------------------------------------------------


@pytest.mark.usefixtures("any_loop")
def test_exit_watcher_delivers_each_exit_as_it_happens() -> None:
    procs = sleep_processes(100)
    try:

        async def main() -> None:
            fds = open_fds()
            watcher = ExitWatcher()
            futures = {p.pid: watcher.watch(p.pid) for p in procs}
            assert len(watcher) == len(procs)
            order = list(procs)
            random.shuffle(order)
            for p in order:
                p.kill()
                ended = await asyncio.wait_for(watcher.next_exit(), 60)
                assert ended == ProcessExit(p.pid, -signal.SIGKILL, p.pid)
                assert futures[p.pid].result() == -signal.SIGKILL
            assert len(watcher) == 0
            assert [e async for e in watcher] == []
            with pytest.raises(LookupError):
                await watcher.next_exit()
            watcher.close()
            assert open_fds() <= fds

        run(main())
        for p in procs:
            assert p.wait() == -signal.SIGKILL  # still theirs to reap
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.usefixtures("any_loop")
def test_exit_watcher_sees_simultaneous_exits_callbacks_and_unwatch() -> None:
    procs = sleep_processes(60)
    try:

        async def main() -> None:
            fds = open_fds()
            seen: list[ProcessExit] = []
            everything = asyncio.get_running_loop().create_future()

            def on_exit(ended: ProcessExit) -> None:
                seen.append(ended)
                if len(seen) == 50:
                    everything.set_result(None)

            async with ExitWatcher(on_exit=on_exit) as watcher:
                for p in procs:
                    watcher.watch(p.pid)
                kept = procs[:50]
                assert sum(watcher.unwatch(p.pid) for p in procs[50:]) == 10
                assert len(watcher) == 50
                for p in kept:  # all at once: SIGCHLD coalesces in the fallback
                    p.kill()
                await asyncio.wait_for(everything, 60)
                assert sorted(e.pid for e in seen) == sorted(p.pid for p in kept)
                assert {e.returncode for e in seen} == {-signal.SIGKILL}
                watcher.watch(procs[-1].pid)
            assert len(watcher) == 0  # closed: its watches ended
            assert open_fds() <= fds
            with pytest.raises(RuntimeError, match="closed"):
                watcher.watch(procs[-1].pid)

        run(main())
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.usefixtures("any_loop")
def test_exit_watcher_futures_cancel_cleanly() -> None:
    procs = sleep_processes(20)
    try:

        async def main() -> None:
            loop = asyncio.get_running_loop()
            fds, readers = open_fds(), _selector_size(loop)
            watcher = ExitWatcher()
            futures = [watcher.watch(p.pid) for p in procs]
            for f in futures:
                f.cancel()
            await asyncio.sleep(0)
            assert len(watcher) == 0
            assert open_fds() <= fds
            assert _selector_size(loop) == readers

        run(main())
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- pid reuse in a private pid namespace -------------------------------------------

PID_REUSE = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys, time
    import pylock
    from pylock._core import process as _process
    from tests.support.pidns import reap, spawn_at, start_time_of

    launcher = json.loads(sys.argv[1])
    PID = 500
    out = {"pinning": _process.pinning_available()}

    def sleeper(pid):
        return spawn_at(pid, [sys.executable, "-c", "import signal; signal.pause()"])

    def past_start_tick(pid):
        # Without pidfs only the start time (10 ms ticks) tells a recycled pid
        # apart: let the victim's tick pass so the impostor starts in another.
        tick = start_time_of(pid)
        hz = os.sysconf("SC_CLK_TCK")
        while int(time.clock_gettime(time.CLOCK_BOOTTIME) * hz) <= tick + 1:
            time.sleep(0.002)

    # 1. A child of ours is watched; it dies, its owner reaps it and an
    #    unrelated process gets its pid before the loop looks again.
    async def attached_then_recycled():
        victim = sleeper(PID)
        before = start_time_of(PID)
        task = asyncio.ensure_future(pylock.holder_exit(PID))
        await asyncio.sleep(0)
        past_start_tick(PID)
        victim.kill()
        victim.wait()
        impostor = sleeper(PID)
        assert start_time_of(PID) != before, "victim and impostor share a start tick"
        rc = await asyncio.wait_for(task, 30)
        alive = impostor.poll() is None
        impostor.kill()
        impostor.wait()
        return {"rc": rc, "impostor_alive": alive}
    out["attached"] = asyncio.run(attached_then_recycled())

    # 2. A record is read, the process dies and its pid is recycled before
    #    anyone watches: the watch must report the recorded process exited.
    victim = sleeper(PID)
    record = _process.identity_of(PID)
    holder = pylock.Holder(pid=PID, start_time=record.start_time, boot_id=record.boot_id,
                           pidfs_ino=record.pidfs_ino)
    past_start_tick(PID)
    victim.kill()
    victim.wait()
    impostor = sleeper(PID)
    assert start_time_of(PID) != record.start_time
    out["recycled_before"] = {
        "wait_exit": pylock.wait_exit(holder, timeout=30),
        "holder_exit": asyncio.run(pylock.holder_exit(holder, timeout=30)),
        "alive": holder.alive(),
        "impostor_alive": impostor.poll() is None,
    }
    impostor.kill()
    impostor.wait()

    # 3. A process that is not the watcher's child: the watcher runs in its
    #    own process (under the launcher), the victim is a sibling.
    victim = sleeper(PID)
    record = _process.identity_of(PID)
    watcher = subprocess.Popen(
        launcher + [sys.executable, "-c", sys.argv[2],
                    json.dumps([PID, record.start_time, record.boot_id, record.pidfs_ino])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline().strip() == "watching"
    past_start_tick(PID)
    victim.kill()
    victim.wait()
    impostor = sleeper(PID)
    assert start_time_of(PID) != record.start_time
    watcher.stdin.write("go\\n")
    watcher.stdin.flush()
    result = json.loads(watcher.stdout.readline())
    watcher.wait()
    result["impostor_alive"] = impostor.poll() is None
    out["non_child"] = result
    impostor.kill()
    impostor.wait()
    print(json.dumps(out))
    """
)


# The watcher of case 3, a sibling of the victim.
PID_REUSE_WATCHER = textwrap.dedent(
    """
    import asyncio, json, sys, pylock
    from pylock._core import process as _process
    pid, start, boot, ino = json.loads(sys.argv[1])
    holder = pylock.Holder(pid=pid, start_time=start, boot_id=boot, pidfs_ino=ino)
    async def main():
        task = asyncio.ensure_future(pylock.holder_exit(holder))
        await asyncio.sleep(0)
        print("watching", flush=True)
        sys.stdin.readline()
        rc = await asyncio.wait_for(task, 30)
        return {"rc": rc, "sync": pylock.wait_exit(holder, timeout=30),
                "pinning": _process.pinning_available()}
    print(json.dumps(asyncio.run(main())), flush=True)
    """
)


def _pid_reuse(launcher: list[str]) -> Any:
    reason = pidns.available()
    if reason is not None:
        pytest.skip(reason)
    argv = pidns.pidns_command(
        [sys.executable, "-c", PID_REUSE, json.dumps(launcher), PID_REUSE_WATCHER]
    )
    proc = subprocess.run(
        launcher + argv,
        capture_output=True,
        text=True,
        timeout=180,
        env=env_with_repo(),
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("path", ["as-is", "fallback"])
def test_a_recycled_pid_never_captures_the_watch(path: str) -> None:
    launcher = SECCOMP if path == "fallback" else []
    out = _pid_reuse(launcher)
    if path == "fallback":
        assert out["pinning"] is False
        assert out["non_child"]["pinning"] is False
    # 1. Reaped by its owner before the watcher looked: no status to tell,
    #    or (pidfd, 6.15+) the victim's own status; never the impostor's.
    assert out["attached"]["rc"] in (None, -signal.SIGKILL)
    assert out["attached"]["impostor_alive"] is True
    assert out["recycled_before"] == {
        "wait_exit": True,
        "holder_exit": None,
        "alive": False,
        "impostor_alive": True,
    }
    assert out["non_child"]["rc"] in (None, -signal.SIGKILL)
    assert out["non_child"]["sync"] is True
    assert out["non_child"]["impostor_alive"] is True


# -- the fallback's own cases, under the seccomp launcher ----------------------------

FALLBACK_CASES = textwrap.dedent(
    """
    import asyncio, json, os, signal, subprocess, sys, threading
    import pylock
    from pylock._core import process as _process
    case = sys.argv[1]
    out = {"pinning": _process.pinning_available()}
    if case == "signalfd":
        # Blocked before any thread exists: blocked in every thread.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    elif case == "chained":
        calls = []
        signal.signal(signal.SIGCHLD, lambda *a: calls.append(1))
    elif case == "ignored":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    def child(code):
        return subprocess.Popen([sys.executable, "-c", code])

    p = child("raise SystemExit(4)")
    out["async"] = asyncio.run(pylock.holder_exit(p.pid, timeout=30))
    out["popen"] = p.wait()
    p = child("raise SystemExit(5)")
    out["sync"] = pylock.wait_exit(p.pid, timeout=30)
    out["popen2"] = p.wait()

    async def many():
        procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(40)]
        async with pylock.ExitWatcher() as w:
            for q in procs:
                w.watch(q.pid)
            for q in procs:
                q.kill()
            codes = [e.returncode async for e in w]
        for q in procs:
            q.wait()
        return codes
    out["many"] = asyncio.run(many())
    if case == "chained":
        out["chained_calls"] = len(calls)
    kinds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds.add(os.readlink(f"/proc/self/fd/{fd}").split(":")[0])
        except OSError:
            pass
    out["fd_kinds"] = sorted(kinds)
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("case", ["plain", "signalfd", "chained", "ignored"])
def test_fallback_children(case: str) -> None:
    proc = subprocess.run(
        [*SECCOMP, sys.executable, "-c", FALLBACK_CASES, case],
        capture_output=True,
        text=True,
        timeout=180,
        env=env_with_repo(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["pinning"] is False
    if case == "ignored":
        # The kernel reaps children itself: no status exists, exits still seen.
        assert (out["async"], out["sync"]) == (None, True)
        assert out["many"] == [None] * 40
    else:
        assert (out["async"], out["popen"]) == (4, 4)  # read, not reaped
        assert (out["sync"], out["popen2"]) == (True, 5)
        assert out["many"] == [-signal.SIGKILL] * 40
    if case == "signalfd":
        # SIGCHLD blocked everywhere is the program's to take: pylock reads
        # no signal (no signalfd) and sees the exits on its backstop.
        assert "anon_inode" not in out["fd_kinds"]
    if case == "chained":
        assert out["chained_calls"] >= 1


def test_pylock_exports() -> None:
    assert pylock.holder_exit is holder_exit
    assert pylock.wait_exit is wait_exit
    assert pylock.ExitWatcher is ExitWatcher
