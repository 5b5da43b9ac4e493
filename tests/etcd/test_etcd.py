"""EtcdLock against real etcd processes: exclusion, hand-over, death, pauses, fencing.

Short TTLs (2 s, etcd's minimum) keep the suite fast; the few tests that must
let a TTL pass say so.  Speed figures live in bench/etcd.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pylock
from pylock import LockHeld, LockTimeout, NotHeld, ReentrantAcquire, SupportsLock
from tests.support import env_with_repo
from tests.support.etcd import EtcdCluster
from tests.support.etcd_locks import (
    contenders,
    expect_line,
    holder_process,
    require_etcd,
)


def make_lock(cluster: EtcdCluster, name: str, **kw: object) -> pylock.etcd.EtcdLock:
    from pylock.etcd import EtcdLock

    kw.setdefault("ttl", 2)
    return EtcdLock(name, endpoints=cluster.endpoint_list, **kw)  # type: ignore[arg-type]


# -- mutual exclusion and fencing across processes ---------------------------------

WORKER = textwrap.dedent(
    """
    import os, sys
    from pylock.etcd import EtcdLock
    endpoints, name, log, counter, rounds = sys.argv[1:6]
    lock = EtcdLock(name, endpoints=endpoints, ttl=5)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    for _ in range(int(rounds)):
        with lock:
            os.write(fd, f"in {os.getpid()} {lock.fencing_token}\\n".encode())
            # A read-modify-write that loses updates unless the lock excludes.
            with open(counter) as f:
                value = int(f.read())
            os.sched_yield()
            with open(counter, "w") as f:
                f.write(str(value + 1))
            os.write(fd, f"out {os.getpid()}\\n".encode())
    """
)


def test_mutual_exclusion_and_fencing_across_processes(etcd, lock_name, tmp_path):
    log, counter = tmp_path / "log", tmp_path / "counter"
    log.write_text("")
    counter.write_text("0")
    workers, rounds = 4, 10
    files = (str(log), str(counter))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, etcd.endpoint_list, lock_name, *files, str(rounds)],
            env=env_with_repo(),
        )
        for _ in range(workers)
    ]
    assert [p.wait(120) for p in procs] == [0] * workers
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * workers * rounds
    tokens = []
    for enter, leave in zip(lines[::2], lines[1::2]):
        word, pid, token = enter.split()
        assert word == "in" and leave == f"out {pid}", "two holders overlapped"
        tokens.append(int(token))
    assert tokens == sorted(set(tokens)), "fencing tokens must strictly increase"
    assert int(counter.read_text()) == workers * rounds


def test_fencing_tokens_strictly_increase_across_objects(etcd, lock_name):
    a, b = make_lock(etcd, lock_name), make_lock(etcd, lock_name)
    seen = []
    for lock in (a, b, a, a, b):
        assert lock.fencing_token is None
        with lock:
            seen.append(lock.fencing_token)
    assert seen == sorted(set(seen))


# -- waking waiters -------------------------------------------------------------


def test_release_wakes_exactly_the_next_waiter_in_queue_order(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name)
    waiters = []
    try:
        holder.send("acquire")
        first = int(expect_line(holder, "locked"))
        for n in range(3):
            waiter = holder_process(etcd.endpoint_list, lock_name)
            waiters.append(waiter)
            waiter.send("acquire")
            contenders(etcd.endpoint_list, lock_name, at_least=n + 2)  # queued, by watch
        holder.send("release")
        expect_line(holder, "released")
        tokens = [first]
        for waiter in waiters:
            # Only the next waiter in creation order may wake; had another
            # taken the lock, this read would find nothing (it holds until told).
            tokens.append(int(expect_line(waiter, "locked")))
            waiter.send("release")
            expect_line(waiter, "released")
        assert tokens == sorted(set(tokens))
    finally:
        for child in (holder, *waiters):
            child.close()


def test_sigkill_of_holder_frees_lock_at_lease_expiry_and_wakes_waiter(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name, ttl=2)
    try:
        holder.send("acquire")
        token = int(expect_line(holder, "locked"))
        waiter = make_lock(etcd, lock_name)
        seen = waiter.holder()
        assert seen is not None and seen.pid == holder.pid and seen.fencing_token == token
        got = threading.Event()
        thread = threading.Thread(target=lambda: (waiter.acquire(timeout=30), got.set()))
        thread.start()
        contenders(etcd.endpoint_list, lock_name, at_least=2)
        killed_at = time.monotonic()
        holder.kill()
        thread.join(60)
        assert got.is_set()
        # The dead holder's lease, not its death, freed the lock: a TTL of 2 s
        # renewed every 2/3 s outlives its holder by more than 1 s.
        assert time.monotonic() - killed_at > 1.0
        assert waiter.fencing_token > token
        assert not seen.alive()
        waiter.release()
    finally:
        holder.close()


def test_holder_exit_and_wait_exit_on_an_etcd_holder(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name, ttl=2)
    try:
        holder.send("acquire")
        expect_line(holder, "locked")
        seen = make_lock(etcd, lock_name).holder()
        assert seen is not None and seen.alive()
        assert pylock.wait_exit(seen, timeout=0.2) is False

        async def watch() -> object:
            task = asyncio.ensure_future(pylock.holder_exit(seen))
            await asyncio.sleep(0)
            assert not task.done()
            holder.send("release")
            return await asyncio.wait_for(task, 30)

        assert asyncio.run(watch()) is None
        expect_line(holder, "released")
        assert pylock.wait_exit(seen, timeout=5) is True
        holder.send("acquire")
        expect_line(holder, "locked")
        with pytest.raises(TimeoutError):
            asyncio.run(pylock.holder_exit(make_lock(etcd, lock_name).holder(), timeout=0.2))
    finally:
        holder.close()


def test_sigstop_past_ttl_moves_lock_on_and_holder_sees_lost(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name, ttl=2)
    try:
        holder.send("acquire")
        token = int(expect_line(holder, "locked"))
        holder.signal(signal.SIGSTOP)
        waiter = make_lock(etcd, lock_name)
        waiter.acquire(timeout=30)  # returns once etcd expired the paused holder's lease
        assert waiter.fencing_token > token
        holder.signal(signal.SIGCONT)
        holder.send("lost")
        said = {expect_line(holder, "") for _ in range(2)}
        assert said == {"lost True", "on_lost"}
        # The stale holder's release must not touch the new holder's key.
        holder.send("release")
        expect_line(holder, "released")
        now = waiter.holder()
        assert now is not None and now.pid == os.getpid()
        assert now.fencing_token == waiter.fencing_token and not waiter.lost
        waiter.release()
    finally:
        holder.close()


# -- the interface shared with Lock ------------------------------------------------


def test_lock_held_and_timeout_name_holder_and_host(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name)
    try:
        holder.send("acquire")
        expect_line(holder, "locked")
        lock = make_lock(etcd, lock_name)
        with pytest.raises(LockHeld) as held:
            lock.acquire(blocking=False)
        assert not isinstance(held.value, LockTimeout)
        with pytest.raises(LockTimeout) as timed_out:
            lock.acquire(timeout=1.0)
        for exc in (held.value, timed_out.value):
            assert exc.holder is not None and exc.holder.pid == holder.pid
            assert exc.holder.hostname == socket.gethostname()
            assert exc.holder.info == {"role": "holder"}
            assert f"pid {holder.pid}" in str(exc) and socket.gethostname() in str(exc)
            assert lock_name in str(exc)
        assert contenders(etcd.endpoint_list, lock_name, at_least=1) == 1  # nothing left behind
        assert not lock.locked and lock.fencing_token is None
    finally:
        holder.close()


def test_interface_matches_lock(etcd, lock_name, tmp_path):
    lock = make_lock(etcd, lock_name)
    assert isinstance(lock, SupportsLock)
    assert isinstance(pylock.Lock(tmp_path / "f"), SupportsLock)
    with pytest.raises(NotHeld):
        lock.release()
    with lock:
        assert lock.locked and not lock.lost
        with pytest.raises(ReentrantAcquire):
            lock.acquire()
        seen = lock.holder()
        assert seen is not None and seen.pid == os.getpid() and seen.verified
    assert not lock.locked and lock.holder() is None
    lock.close()


def test_acquire_async_wakes_and_cancel_leaves_nothing(etcd, lock_name):
    holder = make_lock(etcd, lock_name)
    holder.acquire()

    async def main() -> None:
        waiter = make_lock(etcd, lock_name)
        task = asyncio.ensure_future(waiter.acquire_async())
        await asyncio.get_running_loop().run_in_executor(
            None, contenders, etcd.endpoint_list, lock_name, 2
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert contenders(etcd.endpoint_list, lock_name, at_least=1) == 1
        task = asyncio.ensure_future(waiter.acquire_async(timeout=30))
        await asyncio.get_running_loop().run_in_executor(
            None, contenders, etcd.endpoint_list, lock_name, 2
        )
        holder.release()
        assert await task is True
        async with make_lock(etcd, f"{lock_name}-other") as other:
            assert other.locked
        await waiter.release_async()

    asyncio.run(main())


def test_an_acquire_cut_short_after_giving_the_object_back_strands_no_session(etcd, lock_name):
    """An exception from a signal handler may land right after the first call of
    a failing acquire's except clause, which gives the object back, and skip
    the rest (ending the session at once).  The object given back dooms the
    session: its keep-alive ends it, so another object gets the lock within
    a third of the TTL instead of waiting for it forever."""
    from pylock._native import lib

    lock = make_lock(etcd, lock_name)
    lock.acquire()
    # What such an exception leaves: the except clause's first call, no more.
    lib.pl_disown(lock._lf, id(lock._attempt), 0)
    assert not lock.locked
    other = make_lock(etcd, lock_name)
    assert other.acquire(timeout=10)
    other.release()
    assert lock.acquire(timeout=10)  # and the object itself still works
    lock.release()


def test_import_pylock_does_not_load_the_etcd_client():
    code = (
        "import sys, pylock; pylock.holder_exit; pylock.SupportsLock; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aetcd', 'grpc') "
        "or m == 'pylock.etcd'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env_with_repo(), capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


# -- etcd failures -----------------------------------------------------------------


def test_three_node_cluster_keeps_locking_with_one_member_killed(lock_name):
    require_etcd()
    with EtcdCluster(3) as cluster:
        a, b = make_lock(cluster, lock_name), make_lock(cluster, lock_name)
        a.acquire()
        first = a.fencing_token
        got = threading.Event()
        thread = threading.Thread(target=lambda: (b.acquire(timeout=60), got.set()))
        thread.start()
        contenders(cluster.endpoint_list, lock_name, at_least=2)
        # The first endpoint is the one the channel talks to: kill it.
        cluster.members[0].signal(signal.SIGKILL)
        # Time must pass beyond the TTL (the keep-alives must move to another
        # member) for this to mean anything.
        time.sleep(3 * a.ttl)
        assert a.locked and not a.lost and not got.is_set()
        a.release()
        thread.join(60)
        second = b.fencing_token
        assert got.is_set() and second > first
        b.release()
        with make_lock(cluster, lock_name) as c:
            assert c.fencing_token > second


def test_unreachable_etcd_is_a_clear_error_within_the_timeout(lock_name):
    require_etcd()
    from pylock.etcd import EtcdLock, EtcdUnavailable

    with socket.socket() as silent, socket.socket() as free:
        free.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts TCP, never answers: a hung or partitioned etcd
        for sock in (free, silent):
            endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
            lock = EtcdLock(lock_name, endpoints=endpoint, ttl=2)
            for timeout in (1.0, None):
                started = time.monotonic()
                with pytest.raises(EtcdUnavailable) as failed:
                    lock.acquire(timeout=timeout)
                limit = 5.0 if timeout is None else timeout  # pylock's request limit
                assert time.monotonic() - started < limit + 1.0
                assert endpoint in str(failed.value) and "unreachable" in str(failed.value)
            assert not lock.locked


def test_etcd_dying_under_a_waiter_is_an_error_not_a_hang(lock_name):
    require_etcd()
    from pylock.etcd import EtcdUnavailable

    with EtcdCluster(1) as cluster:
        holder, waiter = make_lock(cluster, lock_name), make_lock(cluster, lock_name)
        holder.acquire()
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire()
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        contenders(cluster.endpoint_list, lock_name, at_least=2)
        cluster.members[0].stop()
        thread.join(30)
        assert not thread.is_alive(), "the waiter hung"
        assert len(failed) == 1 and isinstance(failed[0], EtcdUnavailable)
        assert not waiter.locked


FORKER = textwrap.dedent(
    """
    import os, sys
    from pylock.etcd import EtcdLock, EtcdRefused
    lock = EtcdLock(sys.argv[2], endpoints=sys.argv[1], ttl=2)
    lock.acquire()
    token = lock.fencing_token
    pid = os.fork()
    if pid == 0:
        # The child holds nothing and cannot use etcd; it must say so, not crash.
        code = 3 if lock.locked else 0
        try:
            EtcdLock(sys.argv[2], endpoints=sys.argv[1]).holder()
            code = 4
        except EtcdRefused as exc:
            print("refused:", exc, flush=True)
        lock.close()  # a no-op there: never the parent's lease
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    print("still", lock.holder().fencing_token == token and not lock.lost, flush=True)
    lock.release()
    """
)


def test_forked_child_of_an_etcd_user_is_clean_and_says_why_it_cannot_lock(etcd, lock_name):
    done = subprocess.run(
        [sys.executable, "-c", FORKER, etcd.endpoint_list, lock_name],
        env=env_with_repo(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "fork" in lines[0]
    assert lines[1:] == ["child 0", "still True"]
    assert "grpc" not in done.stderr.lower() and "fork" not in done.stderr, done.stderr
