"""holder() and holders(): the kernel decides who holds a lock, the record only
explains.  A forged record naming another live process, or a record naming a
dead one, is never reported as the holder."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pylock
from pylock._core.process import ProcessIdentity, identity_of, self_identity
from pylock._lock import record as _record
from tests.support import pidfd_open
from tests.support.children import Script, Sleeper
from tests.support.kernel_locks import granted_pids
from tests.support.procs import NOBODY, boot_id, cmdline, in_child, start_time

# -- helpers ---------------------------------------------------------------

# A holder that is not pylock: a bare flock, optionally forking a child that
# inherits the descriptor (so both processes hold the same lock).  Each line
# is one write(2): the two processes' lines must not interleave.
RAW_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "sh" else fcntl.LOCK_EX)
    if sys.argv[3] == "fork" and os.fork() == 0:
        os.write(1, b"child %d\\n" % os.getpid())
        sys.stdin.read()
        os._exit(0)
    os.write(1, b"parent %d\\n" % os.getpid())
    sys.stdin.read()
    """
)


class RawHolder(Script):
    def __init__(self, path: str, kind: str = "ex", fork: bool = False) -> None:
        super().__init__(RAW_HOLDER, path, kind, "fork" if fork else "-")
        self.pids: dict[str, int] = {}
        for _ in range(2 if fork else 1):
            role, pid = self.expect().split()
            self.pids[role] = int(pid)


@pytest.fixture
def raw_holder() -> Iterator[Any]:
    started: list[RawHolder] = []

    def start(path: str, kind: str = "ex", fork: bool = False) -> RawHolder:
        started.append(RawHolder(path, kind, fork))
        return started[-1]

    yield start
    for holder in started:
        holder.close()


def forge(path: str, ident: ProcessIdentity, **fields: Any) -> bytes:
    """Write a record in pylock's v1 format naming ident, as another program could."""
    body = {
        "pid": ident.pid,
        "start_time": ident.start_time,
        "boot_id": ident.boot_id,
        "pidfs_ino": ident.pidfs_ino,
        "host": socket.gethostname(),
        "program": "impostor",
        "argv": ["impostor", "--forged"],
        "acquired_at": time.time(),
        **fields,
    }
    payload = json.dumps(body).encode()
    data = b"pylock-record v1 %d %08x\n" % (len(payload), zlib.crc32(payload)) + payload
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    # The forgery is a well-formed record: pylock would believe it, were it not
    # for the kernel.
    parsed = _record.parse(data)
    assert parsed is not None and parsed["pid"] == ident.pid
    return data


# -- a live holder -----------------------------------------------------------------


def test_holder_fields_of_a_live_holder(lock_path: str, spawn_holder) -> None:
    before = dt.datetime.now(dt.timezone.utc)
    holder = spawn_holder(lock_path, info={"port": 8080, "proto": 3})
    after = dt.datetime.now(dt.timezone.utc)
    found = pylock.Lock(lock_path).holder()
    assert isinstance(found, pylock.Holder)
    assert found.pid == holder.pid
    assert found.verified is True
    assert found.shared is False
    assert found.start_time == start_time(holder.pid)
    assert found.boot_id == boot_id()
    if self_identity().pidfs_ino:
        pidfd = pidfd_open(holder.pid)
        try:
            assert found.pidfs_ino == os.fstat(pidfd).st_ino
        finally:
            os.close(pidfd)
    assert found.hostname == socket.gethostname()
    assert found.program == os.path.basename(sys.executable)
    assert tuple(found.argv) == cmdline(holder.pid)
    assert found.acquired_at is not None and found.acquired_at.tzinfo is not None
    assert found.acquired_at.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(seconds=1) <= found.acquired_at <= after
    assert found.info == {"port": 8080, "proto": 3}
    assert found.alive()
    assert pylock.holders(lock_path) == [found]

    holder.kill()
    assert not found.alive()
    assert pylock.Lock(lock_path).holder() is None
    assert pylock.holders(lock_path) == []


def test_holder_is_none_when_free_or_missing(lock_path: str, tmp_path) -> None:
    assert pylock.Lock(lock_path).holder() is None  # no file at all
    assert pylock.holders(lock_path) == []
    lock = pylock.Lock(lock_path)
    lock.acquire()
    lock.release()
    assert lock.holder() is None  # the old record names us, but we hold nothing
    assert pylock.holders(lock_path) == []


def test_holder_is_this_process_while_it_holds(lock_path: str) -> None:
    with pylock.Lock(lock_path, info={"me": True}) as lock:
        found = lock.holder()
        assert found is not None
        assert found.pid == os.getpid() and found.verified and found.info == {"me": True}
        assert found.identity == self_identity()
        assert pylock.holders(lock_path) == [found]


# -- records that lie ------------------------------------------------------------------


@pytest.mark.parametrize("who", ["sleep process", "parent process", "this process"])
def test_forged_record_naming_another_live_process_is_not_the_holder(
    lock_path: str, sleeper: Sleeper, raw_holder, who: str
) -> None:
    pids = {"sleep process": sleeper.pid, "parent process": os.getppid()}
    pid = pids.get(who, os.getpid())
    ident = identity_of(pid)
    assert ident is not None
    forge(lock_path, ident)

    # Free: the record's process is alive but holds nothing.
    assert pylock.Lock(lock_path).holder() is None
    assert pylock.holders(lock_path) == []

    # Held by someone else: the kernel's holder is named, never the forgery.
    real = raw_holder(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None
    assert found.pid == real.pid != pid
    assert found.verified
    assert found.program != "impostor" and "--forged" not in found.argv
    assert [h.pid for h in pylock.holders(lock_path)] == [real.pid]
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert info.value.holder is not None and info.value.holder.pid == real.pid
    assert f"pid {real.pid}" in str(info.value)
    assert f"pid {pid} " not in str(info.value) and "impostor" not in str(info.value)


def test_record_naming_a_dead_process_is_never_the_holder(lock_path: str, raw_holder) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    ident = identity_of(gone.pid)
    assert ident is not None
    gone.communicate(b"\n")
    assert identity_of(gone.pid) is None
    forge(lock_path, ident)

    assert pylock.Lock(lock_path).holder() is None
    real = raw_holder(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == real.pid and found.verified
    with pytest.raises(pylock.LockTimeout) as info:
        pylock.Lock(lock_path).acquire(timeout=0.05)
    assert info.value.holder is not None and info.value.holder.pid == real.pid
    assert f"pid {gone.pid} " not in str(info.value)


def test_record_with_a_recycled_pid_is_not_the_holder(
    lock_path: str, sleeper: Sleeper, raw_holder
) -> None:
    """Same pid, other start identity: a later process that reused the pid."""
    ident = identity_of(sleeper.pid)
    assert ident is not None
    earlier = ProcessIdentity(
        ident.pid, max(ident.start_time - 100, 0), ident.boot_id, ident.pidfs_ino - 1
    )
    forge(lock_path, earlier)
    assert pylock.Lock(lock_path).holder() is None
    real = raw_holder(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == real.pid


def test_record_of_a_previous_holder_does_not_name_it(
    lock_path: str, spawn_holder, raw_holder
) -> None:
    previous = spawn_holder(lock_path)
    previous.release()  # its record stays in the file
    with open(lock_path, "rb") as f:
        record = _record.parse(f.read())
    assert record is not None and record["pid"] == previous.pid
    real = raw_holder(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == real.pid and found.verified


# -- every holder the kernel shows ----------------------------------------------------


def test_holders_lists_every_shared_holder(lock_path: str, spawn_holder) -> None:
    a = spawn_holder(lock_path, shared=True)
    b = spawn_holder(lock_path, shared=True)
    listed = pylock.holders(lock_path)
    assert sorted(h.pid for h in listed) == sorted([a.pid, b.pid])
    assert all(h.shared and h.verified for h in listed)
    assert all(h.start_time == start_time(h.pid) for h in listed)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid in (a.pid, b.pid) and found.shared
    a.kill()
    assert [h.pid for h in pylock.holders(lock_path)] == [b.pid]


def test_holders_lists_a_forked_child_sharing_the_descriptor(lock_path: str, raw_holder) -> None:
    raw = raw_holder(lock_path, fork=True)
    parent, child = raw.pids["parent"], raw.pids["child"]
    listed = pylock.holders(lock_path)
    assert sorted(h.pid for h in listed) == sorted([parent, child])
    assert all(h.verified and not h.shared for h in listed)

    # The taker dies; its child still holds the lock through the inherited
    # description.  /proc/locks keeps naming the dead taker: fdinfo is the truth.
    os.kill(parent, signal.SIGKILL)
    raw.proc.wait()
    assert granted_pids(lock_path) == [parent]
    assert [h.pid for h in pylock.holders(lock_path)] == [child]
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == child and found.verified
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert f"pid {child}" in str(info.value) and f"pid {parent} " not in str(info.value)


def test_holder_without_a_record_is_named_from_the_kernel(lock_path: str, raw_holder) -> None:
    real = raw_holder(lock_path)
    found = pylock.Lock(lock_path).holder()
    assert found is not None
    assert found.pid == real.pid and found.verified
    assert found.start_time == start_time(real.pid)
    assert tuple(found.argv) == cmdline(real.pid)
    assert found.acquired_at is None and found.info is None
    assert found.alive()


# -- seen by a user who may not look at the holder's descriptors ------------------


@pytest.fixture
def public_lock(public_dir: Path) -> str:
    """A lock path every user may open (tmp_path is private to root)."""
    path = str(public_dir / "x.lock")
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    return path


def holder_seen_by_nobody(path: str) -> dict[str, Any] | None:
    """holder() as computed by a forked child running as uid/gid 65534."""

    def look() -> dict[str, Any] | None:
        found = pylock.Lock(path).holder()
        if found is None:
            return None
        return {
            "pid": found.pid,
            "verified": found.verified,
            "note": found.note,
            "text": found.describe(),
        }

    result = in_child(look, user=NOBODY)
    assert "value" in result, result
    return result["value"]  # type: ignore[no-any-return]


@pytest.mark.root
def test_unprovable_record_is_reported_unverified(
    public_lock: str, sleeper: Sleeper, raw_holder
) -> None:
    """The record names a live process, the kernel's lock table another one
    whose descriptors this user may not inspect: the table's process is
    named, unverified, and the record's never."""
    ident = identity_of(sleeper.pid)
    assert ident is not None
    forge(public_lock, ident)
    assert holder_seen_by_nobody(public_lock) is None  # free: nothing to report
    raw = raw_holder(public_lock)
    seen = holder_seen_by_nobody(public_lock)
    assert seen is not None
    assert seen["pid"] == raw.pid and seen["verified"] is False
    assert "unverified" in seen["note"] and "lock table" in seen["note"]
    # root can look: the kernel's holder, verified.
    found = pylock.Lock(public_lock).holder()
    assert found is not None and found.pid == raw.pid and found.verified


@pytest.mark.root
def test_record_of_a_dead_process_is_not_the_holder(public_lock: str, raw_holder) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    ident = identity_of(gone.pid)
    assert ident is not None
    gone.communicate(b"\n")
    forge(public_lock, ident)
    raw = raw_holder(public_lock)
    seen = holder_seen_by_nobody(public_lock)
    assert seen is not None
    assert seen["pid"] == raw.pid != gone.pid and seen["verified"] is False
    assert f"pid {gone.pid}" not in seen["text"]


# -- reading the kernel's lock lines ----------------------------------------------
#
# A device with a major number above 255 (NVMe partitions are 259 = 0x103)
# holding a file with the same inode number as ours cannot be set up here;
# the parser is fed the kernel's exact line format from a stand-in /proc.


def test_lock_lines_of_another_device_are_not_ours(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pylock._core import locktable
    from pylock._core import procfs as _procfs

    fdinfo = tmp_path / "4242" / "fdinfo"
    fdinfo.mkdir(parents=True)
    # 103:01 is major 0x103 minor 1; ours is major 3 minor 1, same inode.
    (fdinfo / "5").write_text(
        "pos:\t0\nflags:\t02100002\nmnt_id:\t30\nino:\t5000\n"
        "lock:\t1: FLOCK  ADVISORY  WRITE 4242 103:01:5000 0 EOF\n"
    )
    (tmp_path / "locks").write_text("1: FLOCK  ADVISORY  WRITE 4242 103:01:5000 0 EOF\n")
    monkeypatch.setattr(_procfs, "PROC", str(tmp_path))
    monkeypatch.setattr(locktable, "PROC", str(tmp_path))
    ours = os.makedev(3, 1)
    assert _procfs.pid_lock_mode(4242, ours, 5000) == ""
    assert list(_procfs.holders_of(ours, 5000)) == []
    assert locktable.agreed_flocks({(ours, 5000)}) == {}
    # The device that does hold it is recognised.
    theirs = os.makedev(0x103, 1)
    assert _procfs.pid_lock_mode(4242, theirs, 5000) == "exclusive"
    assert [h.pid for h in _procfs.holders_of(theirs, 5000)] == [4242]
    assert locktable.agreed_flocks({(theirs, 5000)}) == {
        (theirs, 5000): [_procfs.TableLock(4242, False)]
    }


# -- a holder inside a pid namespace (a container) ---------------------------------

NS_HOLDER = textwrap.dedent(
    """
    import json, subprocess, sys, pylock
    path = sys.argv[1]
    lock = pylock.Lock(path, info={"in": "container"})
    lock.acquire()
    look = subprocess.run(
        [sys.executable, "-c",
         "import json, sys, pylock; h = pylock.Lock(sys.argv[1]).holder(); "
         "print(json.dumps([h.pid, h.verified, [x.pid for x in pylock.holders(sys.argv[1])]]))",
         path],
        capture_output=True, text=True, check=True)
    print(json.dumps({"me": __import__("os").getpid(), "seen_inside": json.loads(look.stdout)}),
          flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def ns_holder(lock_path: str) -> Iterator[tuple[dict[str, Any], int]]:
    """A pylock holder running as pid 1 of its own pid namespace: (its report, host pid)."""
    from tests.support import env_with_repo, pidns

    reason = pidns.available()
    if reason:
        pytest.skip(reason)
    proc = subprocess.Popen(
        pidns.pidns_command([sys.executable, "-c", NS_HOLDER, lock_path]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        report = json.loads(proc.stdout.readline())
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            (host_pid,) = [int(p) for p in f.read().split()]
        yield report, host_pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_holder_inside_a_pid_namespace(lock_path: str, ns_holder) -> None:
    report, host_pid = ns_holder
    # Inside, the holder is pid 1 and the kernel shows it holding.
    assert report == {"me": 1, "seen_inside": [1, True, [1]]}
    # Outside, the same process has another pid; pylock names that one.
    found = pylock.Lock(lock_path).holder()
    assert found is not None
    assert found.pid == host_pid and found.verified
    assert [h.pid for h in pylock.holders(lock_path)] == [host_pid]
    with pytest.raises(pylock.LockHeld) as info:
        pylock.Lock(lock_path).acquire(blocking=False)
    assert f"pid {host_pid} " in str(info.value) and "pid 1 " not in str(info.value)


def test_record_of_a_holder_inside_a_pid_namespace_is_used_outside(
    lock_path: str, ns_holder
) -> None:
    """The record says pid 1 (the namespace's view), but its pidfs inode is the
    same everywhere: the host's holder() can still give the record's details."""
    _, host_pid = ns_holder
    with open(lock_path, "rb") as f:
        record = _record.parse(f.read())
    assert record is not None and record["pid"] == 1
    if not record.get("pidfs_ino"):
        pytest.skip("no pidfs on this kernel: nothing ties the record to the host pid")
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.pid == host_pid and found.verified
    assert found.info == {"in": "container"}
    assert found.acquired_at is not None
