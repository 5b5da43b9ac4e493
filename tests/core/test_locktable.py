"""The kernel's lock table read whole (pylock._core.lockscan.read_table): the
"->" tree of blocked requests, files named without any process's lock
descriptor, leases, and the wait-for graph (pylock._core.waitgraph) over
them; every state built with real processes and real kernel objects."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pylock._core.lockscan import read_table
from pylock._core.locktable import (
    FileKey,
    LockTable,
    agreed_flocks,
    parse_line,
    read_proc_locks,
)
from pylock._core.waitgraph import deadlocks, edges, graph
from tests.support.children import Forked
from tests.support.lockers import Locker, until_waiting
from tests.support.procs import fds_on


@pytest.fixture
def lockers() -> Iterator[Callable[[], Locker]]:
    started: list[Locker] = []

    def start() -> Locker:
        started.append(Locker())
        return started[-1]

    yield start
    for locker in started:
        locker.close()


def key_of(path: str) -> FileKey:
    """The file as /proc/locks names it (the device of its filesystem)."""
    st = os.stat(path)
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)


def _on(table: LockTable, path: str) -> tuple[list, list]:  # type: ignore[type-arg]
    key = key_of(path)
    return [lk for lk in table.locks if lk.file == key], [w for w in table.waiters if w.file == key]


def test_a_line_of_the_table_as_the_kernel_prints_it() -> None:
    line = parse_line(b"4:  -> POSIX  ADVISORY  READ 16095 fe:103:2155778 12 EOF")
    assert line is not None
    assert (line.kind, line.mode, line.pid, line.file) == (
        "POSIX",
        "READ",
        16095,
        (254, 259, 2155778),
    )
    assert (line.start, line.end, line.level, line.id) == (12, None, 2, 4)
    assert parse_line(b"1: FLOCK  ADVISORY  WRITE -1 <none>:0 0 EOF") is not None
    assert parse_line(b"garbage") is None


def test_requests_queued_behind_blocked_requests_keep_the_kernels_tree(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """A request that conflicts with a blocked one is queued under it ("->"
    one level deeper); each still waits for the holder."""
    path = str(tmp_path / "tree.lock")
    holder, w1, w2, w3 = lockers(), lockers(), lockers(), lockers()
    holder.take("flock", "ex", path)
    for locker, mode in ((w1, "ex"), (w2, "sh"), (w3, "ex")):
        locker.ask("flock", mode, path)
        until_waiting(path, locker.pid)
    table = read_table()
    (lock,), waiters = _on(table, path)
    assert [w.pid for w in lock.waiters] == [w.pid for w in waiters]
    behind = {w.pid: w.behind for w in waiters}
    assert behind == {w1.pid: None, w2.pid: w1.pid, w3.pid: w2.pid}
    assert all(w.blocker is lock for w in waiters)
    waiting = {e.waiter.pid: e.holder for e in edges(table) if e.waiter.file == key_of(path)}
    assert waiting == {w1.pid: holder.pid, w2.pid: holder.pid, w3.pid: holder.pid}


def _hand_away(path: str, chan: Forked.Chan) -> None:
    """Lock path, then keep the open file only in a unix socket's queue: no
    process has a descriptor on it, and the lock lives on."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ours, _theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    socket.send_fds(ours, [b"x"], [fd])
    os.close(fd)
    chan.say("sent")
    chan.until_closed()


def test_a_file_locked_through_a_descriptor_in_flight_is_named_by_its_waiters_descriptor(
    tmp_path: Path,
    lockers: Callable[[], Locker],
    forked: Callable[[Callable[[Forked.Chan], None]], Forked],
) -> None:
    path = str(tmp_path / "in-flight.lock")
    taker = forked(lambda chan: _hand_away(path, chan))
    assert taker.line() == "sent"
    waiter = lockers()
    waiter.ask("flock", "ex", path)
    until_waiting(path, waiter.pid)
    table = read_table()
    (lock,), (want,) = _on(table, path)
    assert (lock.taker, lock.holders, table.holding_pids(lock)) == (taker.pid, [], [])
    assert table.paths[key_of(path)] == path  # from the waiter's own descriptor
    assert want.pid == waiter.pid
    assert [e for e in edges(table) if e.waiter is want] == []  # nobody to wait for


def _map_and_close(path: str, chan: Forked.Chan) -> None:
    """Lock path, map it, close the descriptor: the mapping keeps the open file
    (and its flock).  ctypes' mmap: Python's keeps a descriptor of its own."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 4096)
    fcntl.flock(fd, fcntl.LOCK_EX)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert address not in (None, ctypes.c_void_p(-1).value)
    os.close(fd)
    chan.say("mapped")
    chan.until_closed()


def test_a_file_locked_only_through_a_mapping_is_named_from_the_mapping(
    tmp_path: Path, forked: Callable[[Callable[[Forked.Chan], None]], Forked]
) -> None:
    path = str(tmp_path / "mapped.lock")
    taker = forked(lambda chan: _map_and_close(path, chan))
    assert taker.line() == "mapped"
    assert fds_on(taker.pid, path) == []
    table = read_table()
    (lock,), _ = _on(table, path)
    assert (lock.taker, lock.holders) == (taker.pid, [])
    assert table.paths[key_of(path)] == path


@pytest.mark.root
def test_a_lease_is_listed_and_waits_for_nobody(tmp_path: Path) -> None:
    path = tmp_path / "leased"
    path.write_text("x")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        table = read_table()
        (lock,), waiters = _on(table, str(path))
        assert (lock.kind, lock.mode, waiters) == ("LEASE", "READ", [])
        assert table.paths[key_of(str(path))] == str(path)
    finally:
        os.close(fd)


def test_the_graph_holds_a_cycle_of_processes_and_only_that(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """Two processes crossing two files, and a third waiting on one of them
    from outside the cycle: one deadlock of the two."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    p, q, outsider = lockers(), lockers(), lockers()
    p.take("flock", "ex", a)
    q.take("posix", "ex", b)
    p.ask("posix", "ex", b)
    until_waiting(b, p.pid)
    q.ask("flock", "ex", a)
    until_waiting(a, q.pid)
    outsider.ask("flock", "sh", a)
    until_waiting(a, outsider.pid)
    mine = {p.pid, q.pid, outsider.pid}
    table = read_table()
    ours = [e for e in edges(table) if e.waiter.pid in mine]
    (deadlock,) = [d for d in deadlocks(graph(ours))]
    assert deadlock.processes == tuple(sorted([p.pid, q.pid]))
    assert {(e.waiter.pid, e.lock.kind, e.holder) for e in deadlock.cycle} == {
        (p.pid, "POSIX", q.pid),
        (q.pid, "FLOCK", p.pid),
    }


def _hold_many(
    directory: Path, count: int, chan: Forked.Chan, cpus: list[int] | None = None
) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)  # the kernel lists a lock on the CPU it was taken on
    for n in range(count):
        fd = os.open(directory / f"stable-{n}", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    chan.say("held")
    chan.until_closed()


def _churn(path: Path, chan: Forked.Chan, cpus: list[int] | None = None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    chan.say("churning")
    while True:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)


def test_a_table_read_while_another_process_locks_and_unlocks_lists_each_lock_once(
    tmp_path: Path, forked: Callable[[Callable[[Forked.Chan], None]], Forked]
) -> None:
    """The kernel hands /proc/locks out a page at a time, walking its list
    again for each page: with one process locking and unlocking in a loop,
    most plain reads of the file repeat or skip some of the locks that stay."""
    holder = forked(lambda chan: _hold_many(tmp_path, 300, chan))
    assert holder.line() == "held"
    stable = {os.stat(tmp_path / f"stable-{n}").st_ino for n in range(300)}
    churner = forked(lambda chan: _churn(tmp_path / "churn", chan))
    assert churner.line() == "churning"
    for _ in range(200):
        seen = Counter(line.file[2] for line in read_proc_locks() if line.level == 0 and line.file)
        wrong = {ino: seen[ino] for ino in stable if seen[ino] != 1}
        assert not wrong, f"locks listed other than once: {wrong}"


def test_who_holds_answers_while_another_process_locks_and_unlocks_name_every_lock_once(
    tmp_path: Path, forked: Callable[[Callable[[Forked.Chan], None]], Forked]
) -> None:
    """holder(), LockHeld, `who` and `list` ask the table who holds given files:
    with one process locking and unlocking in a loop, one reading leaves out
    or repeats some of the locks that stay (a held file reported free), so
    the answer comes from readings that agree."""
    holder = forked(lambda chan: _hold_many(tmp_path, 300, chan))
    assert holder.line() == "held"
    stats = [os.stat(tmp_path / f"stable-{n}") for n in range(300)]
    stable = {(st.st_dev, st.st_ino) for st in stats}
    churner = forked(lambda chan: _churn(tmp_path / "churn", chan))
    assert churner.line() == "churning"
    for _ in range(200):
        found = agreed_flocks(stable)
        assert found is not None
        wrong = {key[1]: found.get(key, []) for key in stable if len(found.get(key, [])) != 1}
        assert not wrong, f"locks listed other than once: {wrong}"
        assert all(found[key][0].pid == holder.pid and not found[key][0].shared for key in stable)


def test_the_tables_last_lock_is_not_listed_twice_while_locks_come_and_go(
    tmp_path: Path, forked: Callable[[Callable[[Forked.Chan], None]], Forked]
) -> None:
    """The read that finds the table's end walks the kernel's list again: a lock
    taken meanwhile makes it repeat the last records, at the same place in
    every reading, so two readings that agree can both list the last lock
    twice.  The last record is the oldest lock on the last CPU's list: the
    stable locks are taken there, and every exclusive flock on the host is
    watched, whichever is last."""
    # PyPy has no sched_getaffinity: the locks are then taken wherever they run.
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    holder = forked(lambda chan: _hold_many(tmp_path, 20, chan, cpus[-1:]))
    assert holder.line() == "held"
    stable = {
        (st.st_dev, st.st_ino) for st in (os.stat(tmp_path / f"stable-{n}") for n in range(20))
    }
    exclusive = {
        (os.makedev(line.file[0], line.file[1]), line.file[2])
        for line in read_proc_locks()
        if line.level == 0 and line.kind == "FLOCK" and line.mode == "WRITE" and line.file
    }
    churner = forked(lambda chan: _churn(tmp_path / "churn", chan, cpus[:1]))
    assert churner.line() == "churning"
    for _ in range(3000):
        found = agreed_flocks(exclusive | stable)
        assert found is not None
        wrong = {key[1]: found.get(key, []) for key in stable if len(found.get(key, [])) != 1}
        assert not wrong, f"locks listed other than once: {wrong}"
        twice = {key[1]: held for key, held in found.items() if len(held) > 1}
        assert not twice, f"an exclusive flock listed twice: {twice}"
