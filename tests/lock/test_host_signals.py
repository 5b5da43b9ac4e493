"""pylock's wake signal inside a program that does its own thing with signals.

pylock borrows one signal to end timed and cancelled waits.  Each test runs a
small program, as a host application would be written, in its own process
(signal dispositions are process-wide) and checks that the timed or
cancelled wait still ends, that the program's own handler is never called by
pylock, that nothing is killed and nothing hangs.  A hang shows as the
child's time limit, far above any deadline used here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support import env_with_repo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="real-time signals")

PRELUDE = textwrap.dedent(
    """
    import asyncio, errno, json, os, signal, sys, threading, time
    import pylock

    path = sys.argv[1]
    # Another thread's Lock object excludes us as another process would.
    holder = pylock.Lock(path)
    _taker = threading.Thread(target=holder.acquire)
    _taker.start()
    _taker.join()
    waiter = pylock.Lock(path)

    def timed_wait(timeout=0.05):
        t0 = time.monotonic()
        try:
            waiter.acquire(timeout=timeout)
        except pylock.LockTimeout:
            return time.monotonic() - t0 - timeout   # lateness past the deadline
        raise AssertionError("acquired a held lock")

    def pending_signals():
        # Signals waiting for delivery in any thread of this process.
        mask = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith(("SigPnd:", "ShdPnd:")):
                            mask |= int(line.split()[1], 16)
            except FileNotFoundError:
                pass  # a thread that ended meanwhile has nothing pending
        return mask

    def report(**fields):
        print(json.dumps(fields), flush=True)

    async def cancel_a_kernel_wait():
        # An acquire_async waiting in a pylock thread, cancelled: True once
        # the task has raised CancelledError.
        task = asyncio.ensure_future(waiter.acquire_async())
        while not any("pylock wait" in t.name for t in threading.enumerate()):
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False
    """
)


# For programs that take every real-time signal, so that a cancel cannot
# interrupt pylock's kernel waits: what they watch and steer.
SIGNALS_TAKEN = """
import fcntl, gc
for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
    signal.signal(sig, signal.SIG_IGN)

def lock_fds():
    # This process's descriptors on the lock file.
    return {int(n) for n in os.listdir("/proc/self/fd")
            if os.path.realpath(f"/proc/self/fd/{n}") == os.path.realpath(path)}

def wait_thread_in_flock():
    for t in threading.enumerate():
        if t.name.startswith("pylock wait"):
            try:
                with open(f"/proc/self/task/{t.native_id}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/self/task/{t.native_id}/wchan") as f:
                    return state == "S" and "lock" in f.read()
            except FileNotFoundError:
                return False
    return False

async def cancel_in_flock(coro):
    # Runs coro until its pylock thread sleeps in flock, then cancels it:
    # (cancelled, the descriptors on the lock file it opened meanwhile).
    before = lock_fds()
    task = asyncio.ensure_future(coro)
    while not wait_thread_in_flock():
        await asyncio.sleep(0.001)
    opened = lock_fds() - before
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True, opened
    return False, opened

def join_wait_threads():
    for t in [t for t in threading.enumerate() if t.name.startswith("pylock wait")]:
        t.join()

def lock_own_file_as(number):
    # The program opens and locks a file of its own; if pylock let go of
    # number, the kernel hands out that number now.  (the descriptor, whether
    # it got that number)
    mine_path = path + ".programs"
    spare = []
    for _ in range(1000):
        n = os.open(mine_path, os.O_RDWR | os.O_CREAT, 0o600)
        if n >= number:
            break
        spare.append(n)
    fcntl.flock(n, fcntl.LOCK_EX)
    return n, n == number

def own_file_still_locked():
    other = os.open(path + ".programs", os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(other)
    return False
"""


def run_host(tmp_path, body: str, limit: float = 20.0, signals_taken: bool = False) -> dict:
    code = PRELUDE + (SIGNALS_TAKEN if signals_taken else "") + textwrap.dedent(body)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "host.lock")],
            capture_output=True,
            text=True,
            timeout=limit,
            env=env_with_repo(),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the host program hung (no exit within {limit} s): {exc.stderr!r}")
    assert proc.returncode == 0, (
        f"the host program died with {proc.returncode}: {proc.stderr[-2000:]}"
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_library_restoring_the_handler_it_saw_does_not_kill_the_next_wait(tmp_path) -> None:
    """signal.getsignal() cannot see pylock's C handler: a library that saves
    and restores SIGRTMAX puts SIG_DFL back, whose action is to terminate."""
    out = run_host(
        tmp_path,
        """
        first = timed_wait()
        saved = signal.getsignal(signal.SIGRTMAX)      # the library sees SIG_DFL
        signal.signal(signal.SIGRTMAX, signal.SIG_IGN)
        signal.signal(signal.SIGRTMAX, saved)          # ... and restores it
        late = [timed_wait() for _ in range(5)]
        report(first=first, late=late)
        """,
    )
    assert max(out["late"]) < 1.0


@pytest.mark.parametrize("restart", [False, True], ids=["handler", "handler-SA_RESTART"])
def test_a_handler_installed_after_the_claim_is_never_called_by_pylock(tmp_path, restart) -> None:
    out = run_host(
        tmp_path,
        f"""
        timed_wait()                                    # pylock claims its signal
        calls = []
        signal.signal(signal.SIGRTMAX, lambda *a: calls.append(1))
        if {restart}:
            signal.siginterrupt(signal.SIGRTMAX, False)  # SA_RESTART: flock would restart
        late = [timed_wait() for _ in range(5)]
        cancelled = asyncio.run(cancel_a_kernel_wait())
        report(late=late, calls=len(calls), cancelled=cancelled,
               still_theirs=signal.getsignal(signal.SIGRTMAX) is not signal.SIG_DFL)
        """,
    )
    assert out["calls"] == 0, "pylock woke its waits with the program's own handler"
    assert out["still_theirs"]
    assert out["cancelled"]
    assert max(out["late"]) < 1.0


def test_sig_ign_set_after_the_claim_does_not_hang_a_timed_wait(tmp_path) -> None:
    out = run_host(
        tmp_path,
        """
        timed_wait()
        signal.signal(signal.SIGRTMAX, signal.SIG_IGN)
        late = [timed_wait() for _ in range(5)]
        report(late=late, ignored=signal.getsignal(signal.SIGRTMAX) == signal.SIG_IGN)
        """,
    )
    assert out["ignored"], "pylock took back a signal the program set to SIG_IGN"
    assert max(out["late"]) < 1.0


def test_threads_that_block_every_signal_still_time_out_and_cancel(tmp_path) -> None:
    """Worker and loop threads often block all signals; pylock's wake signal
    must still reach a wait there, and a cancel must not re-send forever."""
    out = run_host(
        tmp_path,
        """
        result = {}
        def worker():
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            result["late"] = [timed_wait(0.2) for _ in range(3)]
            mask_after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            result["mask_kept"] = signal.SIGRTMAX in mask_after

            async def cancel_in_masked_loop():
                await cancel_a_kernel_wait()
                t0 = time.monotonic()
                try:
                    await asyncio.wait_for(waiter.acquire_async(), 0.2)
                except asyncio.TimeoutError:
                    pass
                return time.monotonic() - t0
            result["wait_for_took"] = asyncio.run(cancel_in_masked_loop())
            result["pending"] = pending_signals()
        def guarded():
            try:
                worker()
            except BaseException as exc:
                import traceback
                result["error"] = traceback.format_exc()
        t = threading.Thread(target=guarded)
        t.start()
        t.join()
        report(**result)
        """,
    )
    assert "error" not in out, out.get("error")
    assert max(out["late"]) < 1.0
    assert out["mask_kept"], "pylock left its signal unblocked in the program's thread"
    assert out["wait_for_took"] < 2.0
    assert out["pending"] == 0, "signals left queued after the waits ended"


def test_with_every_signal_taken_timed_waits_fail_at_once_and_cancels_never_block_the_loop(
    tmp_path,
) -> None:
    out = run_host(
        tmp_path,
        """
        for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
            signal.signal(sig, signal.SIG_IGN)
        try:
            waiter.acquire(timeout=0.05)
            error = None
        except pylock.LockError as exc:
            error = (type(exc).__name__, getattr(exc, "errno", None), str(exc))

        order = []
        def release_later():
            # The holder lets go only after the cancel has been seen, or
            # after 5 s if it never is (the cancel blocked the loop).
            seen.wait(5)
            order.append("released")
            holder.release()
        seen = threading.Event()

        async def main():
            task = asyncio.ensure_future(waiter.acquire_async())
            while not any("pylock wait" in t.name for t in threading.enumerate()):
                await asyncio.sleep(0.001)
            releaser = threading.Thread(target=release_later)
            releaser.start()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                order.append("cancelled")
            seen.set()
            releaser.join()
            # The abandoned wait gives back the grant from its own thread.
            for t in [t for t in threading.enumerate() if t.name.startswith("pylock wait")]:
                t.join()
            return not waiter.locked
        not_locked = asyncio.run(main())
        probe = pylock.Lock(path)
        free = probe.acquire(blocking=False)
        report(error=error, order=order, not_locked=not_locked, free=free)
        """,
    )
    _, code, message = out["error"]
    assert code == 95 and "real-time signal" in message, out["error"]  # ENOTSUP
    assert out["order"] == ["cancelled", "released"], "the cancel waited for the holder"
    assert out["not_locked"] and out["free"]


def test_an_abandoned_waits_late_grant_is_never_taken_for_a_newer_attempts(tmp_path) -> None:
    """With every signal taken, a cancelled acquire_async cannot interrupt its
    kernel wait: the task leaves, its thread keeps waiting and gives back the
    grant when it comes.  The attempts that follow on the same object (whose
    tokens may reuse the departed attempt's memory) must neither be taken for
    that owner nor strip it of the object: once the holder lets go, the lock
    must go to the newer attempt, with the kernel lock and not without."""
    out = run_host(
        tmp_path,
        """
        # The newer attempt runs in a thread of the program's, made before the
        # wait is abandoned: a thread's first acquisition also allocates its
        # owner token, which would take the freed block instead.
        got, warmed, go = [], threading.Event(), threading.Event()
        def newer_attempt():
            warm = pylock.Lock(path + ".warm")
            warm.acquire()
            warm.release()
            warmed.set()
            go.wait()
            got.append(waiter.acquire())
        newer = threading.Thread(target=newer_attempt)
        newer.start()
        warmed.wait()
        cancelled, _ = asyncio.run(cancel_in_flock(waiter.acquire_async()))
        gc.collect()   # the task, its error and its frame are gone
        # Deterministic memory reuse: the next object() takes the most recently
        # freed block of its size, so if the departed attempt's token (read
        # from the C core's owner word) names a freed block, free exactly that
        # one last and the newer attempt's token equals it.
        owner_token = waiter._lf.owner & ~1
        ballast, reused = [], False
        for _ in range(200000):
            o = object()
            if id(o) == owner_token:
                reused = True
                del o
                break
            ballast.append(o)
        # It must wait for the object; its kernel wait must not be confused
        # with the abandoned one (same descriptor), whose late grant is
        # given back.  The holder lets go once it sleeps (on the object, or
        # in the kernel): in any order the newer attempt must end up holding
        # both the object and the kernel lock.
        go.set()
        while True:
            with open(f"/proc/self/task/{newer.native_id}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    break
        holder.release()
        newer.join()
        join_wait_threads()
        probe = pylock.Lock(path)
        try:
            probe.acquire(blocking=False)
            excluded = False
            probe.release()
        except pylock.LockHeld:
            excluded = True
        waiter.release()
        try:
            free = probe.acquire(blocking=False)
        except pylock.LockHeld:
            free = False   # held by a descriptor nobody owns
        report(cancelled=cancelled, reused=reused, got=got, excluded=excluded, free=free)
        """,
        signals_taken=True,
    )
    assert out["cancelled"]
    assert not out["reused"], "the token naming the owner was freed while it still owned"
    assert out["got"] == [True]
    assert out["excluded"], "the newer attempt held the Lock object but not the kernel lock"
    assert out["free"], "released, the lock stayed held by a descriptor nobody owns"


def test_a_cancelled_lock_watch_never_unlocks_a_descriptor_the_program_reopened(tmp_path) -> None:
    """holder_exit() of an unidentified holder waits on the lock itself, in a
    pylock thread.  With every signal taken, a cancel cannot interrupt that
    wait: the descriptor it waits on must stay pylock's until the wait ends,
    or its late unlock lands on whatever file the program opened next under
    the same number, and drops the program's own lock."""
    out = run_host(
        tmp_path,
        """
        import socket
        holder.release()
        # Held by an open file description in flight in a unix socket: no
        # process can be named, so holder_exit waits on the lock.
        sender, receiver = socket.socketpair(socket.AF_UNIX)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX)
        socket.send_fds(sender, [b"x"], [fd])
        os.close(fd)
        _, (watched,) = asyncio.run(cancel_in_flock(pylock.holder_exit(pylock.Lock(path))))
        mine, reused = lock_own_file_as(watched)
        receiver.close(); sender.close()          # the holder goes: the wait ends
        join_wait_threads()
        report(programs_lock_kept=own_file_still_locked(), reused=reused)
        """,
        signals_taken=True,
    )
    assert out["programs_lock_kept"], "pylock's late unlock dropped the program's own lock"


def test_closing_a_lock_whose_abandoned_wait_still_runs_never_unlocks_the_programs_file(
    tmp_path,
) -> None:
    """With every signal taken, a cancelled acquire_async leaves its kernel wait
    running on the Lock's descriptor.  Lock.close() then must not free that
    number under the wait: the wait's late unlock would land on the file the
    program opens next and drop the program's own lock.  The descriptor is
    closed when the wait ends."""
    out = run_host(
        tmp_path,
        """
        _, (used,) = asyncio.run(cancel_in_flock(waiter.acquire_async()))
        waiter.close()
        mine, reused = lock_own_file_as(used)
        holder.release()
        join_wait_threads()
        programs_lock_kept = own_file_still_locked()
        still_open = lock_fds() - {holder._handle}
        probe = pylock.Lock(path)
        free = probe.acquire(blocking=False)
        report(programs_lock_kept=programs_lock_kept, still_open=sorted(still_open), free=free,
               reused=reused)
        """,
        signals_taken=True,
    )
    assert out["programs_lock_kept"], "pylock's late unlock dropped the program's own lock"
    assert out["still_open"] == [], "the closed Lock's descriptor outlived its wait"
    assert out["free"]
