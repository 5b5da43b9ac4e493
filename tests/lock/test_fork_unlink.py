"""Fork: a child neither keeps the parent's lock alive nor releases it.
Unlink: release(unlink=True) never splits waiters across two inodes."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest

import pylock
from pylock._lock import record as _record
from tests.support.children import Script
from tests.support.kernel_locks import free_from_elsewhere
from tests.support.procs import fds_on

# -- fork ----------------------------------------------------------------------

# The parent takes the lock, forks, and reports; the child reports what it
# sees, then either exits at once or keeps running until its stdin closes.
FORKER = textwrap.dedent(
    """
    import json, os, sys, pylock
    path, child_mode = sys.argv[1], sys.argv[2]
    lock = pylock.Lock(path)
    lock.acquire()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        seen = {"locked": lock.locked, "pid": os.getpid()}
        fds = [fd for fd in os.listdir("/proc/self/fd")
               if os.path.realpath("/proc/self/fd/" + fd) == path]
        seen["fds"] = len(fds)
        try:
            lock.release()
            seen["release"] = "released"
        except pylock.NotHeld:
            seen["release"] = "NotHeld"
        # Closed, not dropped: on PyPy a dropped Lock keeps its descriptor
        # until the collector runs.
        other = pylock.Lock(path)
        try:
            other.acquire(blocking=False)
            seen["acquire"] = "acquired"
        except pylock.LockHeld as exc:
            seen["acquire"] = "LockHeld %d" % exc.holder.pid
        finally:
            other.close()
        os.write(w, (json.dumps(seen) + "\\n").encode())
        if child_mode == "run":
            sys.stdin.read()
        os._exit(0)
    os.close(w)
    child = json.loads(os.fdopen(r).readline())
    if child_mode == "exit":
        os.waitpid(pid, 0)
    print(json.dumps({"parent": os.getpid(), "child": child}), flush=True)
    sys.stdin.read()
    lock.release()
    print("released", flush=True)
    """
)


def start_forker(path: str, child_mode: str) -> tuple[Script, dict]:
    proc = Script(FORKER, path, child_mode)
    return proc, json.loads(proc.expect())


def _child_saw(report: dict, parent: int) -> None:
    child = report["child"]
    assert child["locked"] is False  # the child does not hold the parent's lock
    assert child["fds"] == 0  # its copy of the descriptor was closed at fork
    assert child["release"] == "NotHeld"  # and it cannot release the parent's lock
    assert child["acquire"] == f"LockHeld {parent}"  # nor take it while the parent holds it


def test_child_exiting_does_not_release_the_parents_lock(lock_path: str) -> None:
    proc, report = start_forker(lock_path, "exit")
    try:
        parent = report["parent"]
        _child_saw(report, parent)
        # The child has exited: the lock is still the parent's.
        assert not free_from_elsewhere(lock_path)
        assert [h.pid for h in pylock.holders(lock_path)] == [parent]
        found = pylock.Lock(lock_path).holder()
        assert found is not None and found.pid == parent and found.verified
        proc.close_stdin()
        proc.expect("released")
        assert proc.wait() == 0
        assert free_from_elsewhere(lock_path)
    finally:
        proc.close()


def test_child_running_on_does_not_keep_the_lock_after_the_parent_dies(lock_path: str) -> None:
    proc, report = start_forker(lock_path, "run")
    child = report["child"]["pid"]
    try:
        parent = report["parent"]
        _child_saw(report, parent)
        assert [h.pid for h in pylock.holders(lock_path)] == [parent]
        assert fds_on(child, lock_path) == []
        os.kill(parent, signal.SIGKILL)
        proc.wait()
        # The child is still running, holding no descriptor: the lock is free.
        assert os.path.exists(f"/proc/{child}")
        assert free_from_elsewhere(lock_path)
        assert pylock.holders(lock_path) == []
        assert pylock.Lock(lock_path).holder() is None
        with pylock.Lock(lock_path) as lock:
            assert lock.locked
    finally:
        proc.close()  # closing the shared stdin ends the child too


def test_fork_from_this_process_while_holding(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            ok = not lock.locked and fds_on(os.getpid(), lock_path) == []
            try:
                lock.release()
                ok = False
            except pylock.NotHeld:
                pass
        finally:
            os.write(w, b"ok" if ok else b"bad")
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"ok"
    os.waitpid(pid, 0)
    assert lock.locked and not free_from_elsewhere(lock_path)
    assert [h.pid for h in pylock.holders(lock_path)] == [os.getpid()]
    lock.release()
    assert free_from_elsewhere(lock_path)


def test_child_can_take_the_lock_after_the_parent_releases(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.read(go_r, 1)
            lock.acquire(timeout=10)  # the child's own descriptor, its own lock
            found = lock.holder()  # named as itself, not as its parent
            with open(lock_path, "rb") as f:
                recorded = _record.parse(f.read())
            me = os.getpid()
            ok = found is not None and found.pid == me and found.verified
            ok = ok and recorded is not None and recorded["pid"] == me
            ok = ok and [h.pid for h in pylock.holders(lock_path)] == [me]
            os.write(out_w, b"ok" if ok else b"bad")
            lock.release()
            code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(out_w)
    lock.release()
    os.write(go_w, b"x")
    with os.fdopen(out_r, "rb") as f:
        assert f.read() == b"ok"
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    os.close(go_w)
    assert free_from_elsewhere(lock_path)


# -- unlink ----------------------------------------------------------------------


def test_release_with_unlink_removes_the_file(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    lock.release(unlink=True)
    assert not os.path.exists(lock_path)
    assert not lock.locked
    lock.acquire()  # a new file
    assert os.path.exists(lock_path)
    lock.release()
    assert os.path.exists(lock_path)  # never unlinks by default


def test_unlink_of_a_shared_lock_is_refused(lock_path: str) -> None:
    lock = pylock.Lock(lock_path, shared=True)
    lock.acquire()
    with pytest.raises(pylock.LockError):
        lock.release(unlink=True)
    assert os.path.exists(lock_path)
    lock.release()


def test_unlink_leaves_a_replaced_file_alone(lock_path: str, tmp_path: Path) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    other = tmp_path / "other"
    other.write_text("someone else's")
    os.replace(other, lock_path)
    lock.release(unlink=True)
    assert Path(lock_path).read_text() == "someone else's"


UNLINKER = textwrap.dedent(
    """
    import os, sys, pylock
    path, marker, rounds, unlink = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    token_path = marker + ".token"
    me = str(os.getpid()).encode()
    lock = pylock.Lock(path)
    print("ready", flush=True)
    sys.stdin.readline()
    overlaps = stale = 0
    for i in range(rounds):
        lock.acquire()
        # The path must name the very inode we hold.
        held = os.fstat(lock._handle)
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino) or held.st_nlink == 0:
                stale += 1
        except FileNotFoundError:
            stale += 1
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            overlaps += 1
        with open(token_path, "wb") as f:
            f.write(me)
        os.sched_yield()
        with open(token_path, "rb") as f:
            if f.read() != me:
                overlaps += 1
        try:
            os.unlink(marker)
        except FileNotFoundError:  # another holder was inside and left first
            overlaps += 1
        lock.release(unlink=(unlink == "always" or (unlink == "odd" and i % 2 == 1)))
    print("overlaps", overlaps, "stale", stale, flush=True)
    """
)


def test_unlink_with_concurrent_waiters_never_splits_them(tmp_path: Path, lock_path: str) -> None:
    marker = str(tmp_path / "inside")
    modes = ["always", "always", "always", "odd", "never"]
    rounds = 150
    procs = [Script(UNLINKER, lock_path, marker, str(rounds), mode) for mode in modes]
    try:
        for p in procs:
            p.expect("ready")
        for p in procs:
            p.send("go")
            p.close_stdin()
        reports = [p.expect() for p in procs]
        assert [p.wait() for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            p.close()
    assert reports == ["overlaps 0 stale 0"] * len(procs)


# -- the path, not a descriptor kept from earlier, names the lock ---------------------
#
# A Lock keeps its descriptor open between acquisitions.  Whatever happened to
# the path meanwhile (removed, renamed away, its directory replaced), the next
# acquisition must lock the file the path names now, or two processes would
# both hold "the" lock at that path.


def _reuse_after(lock_path: str, change) -> None:
    kept = pylock.Lock(lock_path)
    kept.acquire()
    kept.release()  # the descriptor stays open
    change()
    fresh = pylock.Lock(lock_path)
    fresh.acquire(blocking=False)  # creates and locks the file now at the path
    try:
        with pytest.raises(pylock.LockHeld):
            kept.acquire(blocking=False)
        assert not kept.locked
    finally:
        if kept.locked:
            kept.release()
        fresh.release()
    kept.acquire(blocking=False)
    st, held = os.stat(lock_path), os.fstat(kept._handle)
    assert (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
    kept.release()


def test_kept_descriptor_after_the_file_was_removed(lock_path: str) -> None:
    _reuse_after(lock_path, lambda: os.unlink(lock_path))


def test_kept_descriptor_after_the_file_was_renamed_away(lock_path: str) -> None:
    _reuse_after(lock_path, lambda: os.rename(lock_path, lock_path + ".old"))


def test_kept_descriptor_after_the_directory_was_replaced(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()

    def replace_directory() -> None:
        os.rename(run, tmp_path / "run.old")
        run.mkdir()

    _reuse_after(str(run / "x.lock"), replace_directory)
