"""pylock who --system: every lock on the host, its holders and waiters, the
wait-for graph and its deadlocks, against the real kernel.

Real processes (tests.support.lockers) hold flock, POSIX and OFD locks and
block on them; each test waits until the kernel lists a request as blocked
(/proc/locks), then asks the installed `pylock` command.  Deadlocks are real:
processes blocked for good until the test kills them.  The listing is
compared with util-linux lslocks on the same state, and read as uid 65534.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pylock._lock import record
from tests.support.children import Child, Forked, HolderProcess
from tests.support.cli import FLOCK, PYLOCK, cli, cli_env, needs_flock
from tests.support.lockers import Locker, until_waiting
from tests.support.procs import NOBODY, boot_id, start_time

Doc = dict[str, Any]


@pytest.fixture
def lockers() -> Iterator[Callable[[], Locker]]:
    """Starts Lockers; every one (and its forked copies) is killed and reaped at the end."""
    started: list[Locker] = []

    def start() -> Locker:
        started.append(Locker())
        return started[-1]

    yield start
    for locker in started:
        locker.close()


def listing(*args: str) -> tuple[int, Doc]:
    out = cli("who", "--system", "--json", *args)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def entry(doc: Doc, path: str | bytes) -> Doc:
    """The file entry of doc for path (by its exact bytes)."""
    want = os.fsencode(path)
    for item in doc["files"]:
        if item["path"] is None:
            continue
        raw = base64.b64decode(item["path_base64"]) if "path_base64" in item else None
        if (raw or item["path"].encode()) == want:
            return item
    raise AssertionError(f"{path!r} not listed: {[f['path'] for f in doc['files']]}")


def holders(item: Doc) -> list[int]:
    return sorted(h["pid"] for lock in item["locks"] for h in lock["holders"])


def waits(item: Doc) -> dict[int, list[int]]:
    return {w["pid"]: w["waits_for"] for w in item["waiters"]}


def cycle(doc: Doc) -> set[tuple[int, str, str, int]]:
    """The one deadlock's steps: (waiter, lock kind, path, holder)."""
    (deadlock,) = doc["deadlocks"]
    return {
        (step["pid"], step["waits_for"]["kind"], step["waits_for"]["path"], step["held_by"])
        for step in deadlock["cycle"]
    }


# -- deadlocks ------------------------------------------------------------------------


def test_two_processes_crossing_two_flock_files_are_a_deadlock(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    p, q = lockers(), lockers()
    p.take("flock", "ex", a)
    q.take("flock", "ex", b)
    p.ask("flock", "ex", b)
    until_waiting(b, p.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 0 and doc["deadlocks"] == []  # one waiter: no cycle yet
    assert waits(entry(doc, b)) == {p.pid: [q.pid]}
    q.ask("flock", "ex", a)
    until_waiting(a, q.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 1
    assert holders(entry(doc, a)) == [p.pid] and holders(entry(doc, b)) == [q.pid]
    assert all(h["verified"] for f in doc["files"] for lock in f["locks"] for h in lock["holders"])
    assert waits(entry(doc, a)) == {q.pid: [p.pid]}
    assert doc["deadlocks"][0]["processes"] == sorted([p.pid, q.pid])
    assert cycle(doc) == {(p.pid, "FLOCK", b, q.pid), (q.pid, "FLOCK", a, p.pid)}
    text = cli("who", "--system", "--path", str(tmp_path))
    assert text.returncode == 1
    assert "DEADLOCK: 2 processes wait for each other" in text.stdout
    assert f"pid {p.pid} (python" in text.stdout
    assert f"waits for FLOCK WRITE on {b}, held by pid {q.pid}" in text.stdout
    assert f"waits for FLOCK WRITE on {a}, held by pid {p.pid}" in text.stdout


def test_three_processes_in_a_ring_of_flock_files_are_one_deadlock(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    files = [str(tmp_path / f"{n}.lock") for n in "abc"]
    ring = [lockers() for _ in files]
    for locker, path in zip(ring, files):
        locker.take("flock", "ex", path)
    for n, locker in enumerate(ring):
        wanted = files[(n + 1) % 3]
        locker.ask("flock", "ex", wanted)
        until_waiting(wanted, locker.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 1
    pids = [locker.pid for locker in ring]
    assert doc["deadlocks"][0]["processes"] == sorted(pids)
    assert cycle(doc) == {
        (pids[n], "FLOCK", files[(n + 1) % 3], pids[(n + 1) % 3]) for n in range(3)
    }
    for n, path in enumerate(files):
        assert holders(entry(doc, path)) == [pids[n]]
        assert waits(entry(doc, path)) == {pids[n - 1]: [pids[n]]}


def test_a_cycle_mixing_flock_and_posix_locks_is_a_deadlock_the_kernel_never_refused(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """The kernel's fcntl check follows POSIX waiters only: both requests block."""
    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    p, q = lockers(), lockers()
    p.take("flock", "ex", a)
    q.take("posix", "ex", b)
    p.ask("posix", "ex", b)
    until_waiting(b, p.pid)
    q.ask("flock", "ex", a)
    until_waiting(a, q.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 1
    assert cycle(doc) == {(p.pid, "POSIX", b, q.pid), (q.pid, "FLOCK", a, p.pid)}
    lock = entry(doc, b)["locks"][0]
    assert (lock["kind"], lock["taker"], lock["start"], lock["end"]) == ("POSIX", q.pid, 0, None)


def test_a_cycle_through_an_ofd_request_names_its_process(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """/proc/locks shows a blocked OFD request with pid -1; its blocked thread names it."""
    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    p, q = lockers(), lockers()
    p.take("ofd", "ex", a)
    q.take("flock", "ex", b)
    p.ask("flock", "ex", b)
    until_waiting(b, p.pid)
    q.ask("ofd", "ex", a)
    until_waiting(a, -1)
    status, doc = listing("--path", str(tmp_path))
    assert status == 1
    (waiter,) = entry(doc, a)["waiters"]
    assert (waiter["pid"], waiter["pid_from"], waiter["kind"]) == (q.pid, "syscall", "OFDLCK")
    assert entry(doc, a)["locks"][0]["taker"] is None  # the kernel does not say
    assert holders(entry(doc, a)) == [p.pid]
    assert cycle(doc) == {(p.pid, "FLOCK", b, q.pid), (q.pid, "OFDLCK", a, p.pid)}


def test_a_process_waiting_for_its_own_flock_on_another_descriptor_is_a_deadlock(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    a = str(tmp_path / "a.lock")
    p = lockers()
    p.take("flock", "ex", a)
    p.ask("flock", "ex", a)  # a second open file of the same file
    until_waiting(a, p.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 1
    assert doc["deadlocks"][0]["processes"] == [p.pid]
    assert cycle(doc) == {(p.pid, "FLOCK", a, p.pid)}
    text = cli("who", "--system", "--path", str(tmp_path)).stdout
    assert "DEADLOCK: a process waits for a lock it holds itself (another descriptor)" in text


# -- holders and waiters ----------------------------------------------------------------


def test_every_waiter_waits_for_every_holder_in_its_way(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """Shared holders: a writer waits for each (the kernel lists it under one);
    a reader queued behind a blocked writer (a deeper "->" line) waits for the
    holder, not for the writer."""
    shared, single = str(tmp_path / "shared.lock"), str(tmp_path / "single.lock")
    r1, r2, writer = lockers(), lockers(), lockers()
    r1.take("flock", "sh", shared)
    r2.take("flock", "sh", shared)
    writer.ask("flock", "ex", shared)
    until_waiting(shared, writer.pid)
    holder, w1, w2 = lockers(), lockers(), lockers()
    holder.take("flock", "ex", single)
    w1.ask("flock", "ex", single)
    until_waiting(single, w1.pid)
    w2.ask("flock", "sh", single)
    until_waiting(single, w2.pid)
    status, doc = listing("--path", str(tmp_path))
    assert status == 0 and doc["deadlocks"] == []
    assert holders(entry(doc, shared)) == sorted([r1.pid, r2.pid])
    assert {lock["mode"] for lock in entry(doc, shared)["locks"]} == {"READ"}
    assert waits(entry(doc, shared)) == {writer.pid: sorted([r1.pid, r2.pid])}
    assert waits(entry(doc, single)) == {w1.pid: [holder.pid], w2.pid: [holder.pid]}
    behind = {w["pid"]: w["queued_behind"] for w in entry(doc, single)["waiters"]}
    assert behind == {w1.pid: None, w2.pid: w1.pid}
    text = cli("who", "--system", "--path", str(tmp_path)).stdout
    for pid in (r1.pid, r2.pid, writer.pid, holder.pid, w1.pid, w2.pid):
        assert f" pid {pid} " in text
    assert f"waits for pid {holder.pid}, queued behind pid {w1.pid}" in text


def test_processes_sharing_an_inherited_descriptor_all_hold_its_flock(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """A flock belongs to the open file: the forked copy holds it too (the
    kernel's table names only the taker); a POSIX lock is the taker's alone."""
    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    p = lockers()
    p.take("flock", "ex", a)
    p.take("posix", "ex", b)
    copy = p.fork()
    _, doc = listing("--path", str(tmp_path))
    (lock,) = entry(doc, a)["locks"]
    assert lock["taker"] == p.pid
    assert sorted(h["pid"] for h in lock["holders"]) == sorted([p.pid, copy])
    assert all(h["verified"] and h["fds"] for h in lock["holders"])
    assert holders(entry(doc, b)) == [p.pid]
    _, only_copy = listing("--path", str(tmp_path), "--pid", str(copy))
    assert [f["path"] for f in only_copy["files"]] == [a]


def test_posix_waiters_wait_only_for_the_ranges_they_overlap(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    b = str(tmp_path / "ranges.lock")
    low, high, reader, writer = lockers(), lockers(), lockers(), lockers()
    low.take("posix", "ex", b, 0, 10)  # bytes 0-9
    high.take("posix", "ex", b, 20, 10)  # bytes 20-29
    reader.take("posix", "sh", b, 40, 10)  # 40-49
    writer.ask("posix", "ex", b, 5, 10)  # 5-14: in low's way only
    until_waiting(b, writer.pid)
    _, doc = listing("--path", str(tmp_path))
    ranges = {
        (lock["taker"], lock["mode"], lock["start"], lock["end"]) for lock in entry(doc, b)["locks"]
    }
    assert ranges == {
        (low.pid, "WRITE", 0, 9),
        (high.pid, "WRITE", 20, 29),
        (reader.pid, "READ", 40, 49),
    }
    (waiter,) = entry(doc, b)["waiters"]
    assert (waiter["start"], waiter["end"], waiter["waits_for"]) == (5, 14, [low.pid])
    # 5-EOF overlaps low's own 0-9, which is never in its way (POSIX locks of
    # one process merge), and the others' 20-29 and 40-49.
    low.ask("posix", "ex", b, 5, 0)
    until_waiting(b, low.pid)
    status, doc = listing("--path", str(tmp_path))
    assert waits(entry(doc, b))[low.pid] == sorted([high.pid, reader.pid])
    assert (status, doc["deadlocks"]) == (0, [])


def test_a_pylock_record_says_since_when_only_for_the_holder_it_names(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    path = str(tmp_path / "job.lock")
    holder = HolderProcess(path, info={"job": 7})
    try:
        _, doc = listing("--path", str(tmp_path))
        (lock,) = entry(doc, path)["locks"]
        (seen,) = lock["holders"]
        assert (seen["pid"], seen["verified"], seen["info"]) == (holder.pid, True, {"job": 7})
        assert seen["acquired_at"] is not None and seen["acquired_at"].endswith("Z")
        assert seen["held_for"] >= 0
    finally:
        holder.release()
    # The record stays in the file; a flock(2) user that writes none holds it now.
    other = lockers()
    other.take("flock", "ex", path)
    _, doc = listing("--path", str(tmp_path))
    (seen,) = entry(doc, path)["locks"][0]["holders"]
    assert (seen["pid"], seen["acquired_at"], seen["info"]) == (other.pid, None, None)
    # A record naming the holder's pid with another start (a reused pid) says nothing.
    forged = {"pid": other.pid, "start_time": start_time(other.pid) + 1, "boot_id": boot_id()}
    forged.update(acquired_at=1.0, info={"forged": True})
    Path(path).write_bytes(record.encode(json.dumps(forged).encode()))
    _, doc = listing("--path", str(tmp_path))
    (seen,) = entry(doc, path)["locks"][0]["holders"]
    assert (seen["pid"], seen["acquired_at"], seen["info"]) == (other.pid, None, None)


def test_hostile_file_names_are_escaped_in_text_and_exact_in_json(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    names = [b"title\x1b]0;owned\x07.lock", b"two\nlines.lock", b"bad-\xff\xfe.lock"]
    paths = [os.fsencode(tmp_path) + b"/" + name for name in names]
    p = lockers()
    for path in paths:
        p.take("flock", "ex", path)
    out = subprocess.run(
        [PYLOCK, "who", "--system", "--path", str(tmp_path)], capture_output=True, env=cli_env()
    )
    assert out.returncode == 0, out.stderr
    assert not {c for c in out.stdout if c < 0x20 and c != 0x0A}, out.stdout
    assert b"title\\x1b]0;owned\\x07.lock" in out.stdout and b"two\\x0alines.lock" in out.stdout
    assert b"bad-\\xff\\xfe.lock" in out.stdout
    _, doc = listing("--path", str(tmp_path))
    assert entry(doc, paths[0])["path"] == os.fsdecode(paths[0])  # the exact string
    assert "path_base64" not in entry(doc, paths[1])
    odd = entry(doc, paths[2])
    assert base64.b64decode(odd["path_base64"]) == paths[2]
    assert odd["path"].endswith("bad-\ufffd\ufffd.lock")


# -- filters and exit status -------------------------------------------------------------


def test_filters_pick_files_and_the_exit_status_follows_the_deadlocks_shown(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    stuck, calm = tmp_path / "stuck", tmp_path / "calm"
    stuck.mkdir()
    calm.mkdir()
    a, b, c = str(stuck / "a"), str(stuck / "b"), str(calm / "c")
    p, q, r = lockers(), lockers(), lockers()
    p.take("flock", "ex", a)
    q.take("flock", "ex", b)
    r.take("flock", "ex", c)
    p.ask("flock", "ex", b)
    until_waiting(b, p.pid)
    q.ask("flock", "ex", a)
    until_waiting(a, q.pid)
    status, doc = listing("--path", str(calm))
    assert (status, [f["path"] for f in doc["files"]], doc["deadlocks"]) == (0, [c], [])
    assert listing("--path", str(stuck))[0] == 1
    assert listing("--path", str(stuck) + "/")[0] == 1
    assert listing("--path", str(tmp_path / "stu"))[1]["files"] == []  # a component, not a prefix
    status, doc = listing("--path", str(tmp_path), "--pid", str(r.pid))
    assert (status, [f["path"] for f in doc["files"]]) == (0, [c])
    status, doc = listing("--path", str(tmp_path), "--pid", f"{q.pid},{r.pid}")
    assert status == 1 and sorted(f["path"] for f in doc["files"]) == sorted([a, b, c])
    assert listing("--path", str(tmp_path), "--user", "root")[1]["files"] != []
    status, doc = listing("--path", str(tmp_path), "--user", str(NOBODY[0]))
    assert (status, doc["files"]) == (0, [])


def test_usage_mistakes_exit_64() -> None:
    for words in (["PATH"], ["--interval", "1"], ["--pid", "x"], ["--user", "no-such-user-x"]):
        out = cli("who", "--system", *words)
        assert out.returncode == 64, (words, out.stderr)
        assert out.stderr.startswith("pylock who: ") and out.stdout == ""
    assert cli("who", "--sys", "-h").stdout.startswith("Usage:\n pylock who --system")


# -- beside lslocks, and as another user ------------------------------------------------


def _lslocks(inodes: set[int]) -> list[Doc]:
    """lslocks' rows for these inodes, once two runs in a row agree: lslocks
    reads /proc/locks once, and a page of it can repeat or skip records
    while other processes on the host lock and unlock."""
    runs: list[list[Doc]] = []
    while len(runs) < 2 or runs[-1] != runs[-2]:
        assert len(runs) < 20, "lslocks never showed the same locks twice in a row"
        try:
            out = subprocess.run(
                ["lslocks", "--json", "--output-all", "--notruncate", "--bytes"],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            # Seen here: lslocks stats every locked file, and another test's
            # FUSE server had stopped answering (pylock opens nothing there).
            pytest.skip("lslocks did not finish: a locked file's filesystem does not answer")
        rows = [lock for lock in json.loads(out.stdout)["locks"] if lock["inode"] in inodes]
        runs.append(sorted(rows, key=json.dumps))
    return runs[-1]


@pytest.mark.skipif(
    not os.path.exists("/usr/bin/lslocks"), reason="util-linux lslocks is not installed"
)
def test_the_listing_matches_lslocks_for_every_lock_both_show(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    files = {name: str(tmp_path / name) for name in ("f", "p", "o", "s")}
    h, w1, w2, w3, w4 = (lockers() for _ in range(5))
    h.take("flock", "ex", files["f"])
    h.take("posix", "ex", files["p"], 5, 10)
    h.take("ofd", "sh", files["o"])
    h.take("flock", "sh", files["s"])
    w1.take("flock", "sh", files["s"])
    w1.ask("flock", "ex", files["f"])
    until_waiting(files["f"], w1.pid)
    w2.ask("posix", "ex", files["p"], 12, 3)
    until_waiting(files["p"], w2.pid)
    w3.ask("ofd", "ex", files["o"])
    until_waiting(files["o"], -1)
    w4.ask("flock", "sh", files["f"])
    until_waiting(files["f"], w4.pid)
    inodes = {os.stat(path).st_ino: path for path in files.values()}
    theirs = _lslocks(set(inodes))
    _, doc = listing("--path", str(tmp_path))
    ours = []
    for item in doc["files"]:
        major, minor, ino = item["file"].split(":")
        for lock in item["locks"]:
            for _ in range(lock["count"]):
                row = [
                    lock["taker"] or -1,
                    lock["kind"],
                    lock["mode"],
                    lock["start"],
                    lock["end"] or 0,
                ]
                ours.append((*row, f"{int(major, 16)}:{int(minor, 16)}", int(ino), item["path"]))
        for want in item["waiters"]:
            pid = -1 if want["pid_from"] == "syscall" else want["pid"]
            row = [pid, want["kind"], want["mode"] + "*", want["start"], want["end"] or 0]
            ours.append((*row, f"{int(major, 16)}:{int(minor, 16)}", int(ino), item["path"]))
    assert len(theirs) == len(ours) == 9
    rows = []
    for lock in theirs:
        # lslocks 2.38 names no path for OFD locks ("/..."): compare what it does show.
        path = lock["path"] if not lock["path"].endswith("...") else inodes[lock["inode"]]
        row = [lock["pid"], lock["type"], lock["mode"], lock["start"], lock["end"]]
        rows.append((*row, lock["maj:min"], lock["inode"], path))
    assert sorted(rows) == sorted(ours)


@pytest.mark.root
@needs_flock
def test_another_user_sees_what_the_kernel_shows_it_and_nothing_invented(
    public_dir: Path, lockers: Callable[[], Locker]
) -> None:
    """As uid 65534: root's flock keeps the table's pid, unverified, and the
    file's MAJ:MIN:INODE (no path: root's descriptors are hidden); its own
    lock is verified and named; a root waiter on its file is listed."""
    root_lock, own_lock = public_dir / "root.lock", public_dir / "own.lock"
    root_holder = lockers()
    root_holder.take("flock", "ex", str(root_lock))
    own_lock.touch()
    os.chown(own_lock, *NOBODY)

    def hold(chan: Forked.Chan) -> None:
        import fcntl

        fd = os.open(own_lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        chan.say("held")
        chan.until_closed()

    def look(chan: Forked.Chan) -> None:
        from pylock._cli.main import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(["who", "--system", "--json"])
        chan.say(json.dumps({"status": status, "doc": json.loads(out.getvalue())}))

    holder = Forked(hold, user=NOBODY)
    waiter = None
    try:
        assert holder.line() == "held"
        waiter = subprocess.Popen([FLOCK, str(own_lock), "true"])
        until_waiting(own_lock, waiter.pid)
        viewer = Forked(look, user=NOBODY)
        try:
            seen = json.loads(viewer.line(timeout=60))
        finally:
            viewer.kill()
    finally:
        if waiter is not None:
            waiter.kill()
            waiter.wait()
        holder.kill()
    doc = seen["doc"]
    st = os.stat(root_lock)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    (hidden,) = [f for f in doc["files"] if f["file"] == key]
    assert hidden["path"] is None
    (lock,) = hidden["locks"]
    (who,) = lock["holders"]
    assert (who["pid"], who["verified"], who["fds"], who["user"]) == (
        root_holder.pid,
        False,
        [],
        "root",
    )
    assert "may not inspect" in who["note"]
    assert root_holder.pid in doc["hidden_pids"]
    own = entry(doc, own_lock)
    (who,) = own["locks"][0]["holders"]
    assert (who["pid"], who["verified"], who["user"]) == (holder.pid, True, "nobody")
    (queued,) = own["waiters"]
    assert (queued["pid"], queued["user"], queued["waits_for"]) == (
        waiter.pid,
        "root",
        [holder.pid],
    )


# -- the live view -------------------------------------------------------------------------


# Where the view's time.sleep sleeps: CPython's is clock_nanosleep, PyPy's a select.
SLEEPING = "hrtimer_nanosleep" if sys.implementation.name == "cpython" else "poll_schedule_timeout"


def _until_looked_again(pid: int, times: int = 3) -> None:
    """Return once the live view has gone to sleep between two looks `times`
    more times (its wchan, as the kernel shows it): it looked again, and a
    stream that repeated itself would have said so by now."""
    deadline = time.monotonic() + 60
    was, seen = True, 0
    while seen < times:
        with open(f"/proc/{pid}/wchan") as f:
            asleep = f.read().partition(".")[0] == SLEEPING
        seen += asleep and not was
        was = asleep
        assert time.monotonic() < deadline, "the live view stopped looking"
        time.sleep(0.0005)  # re-reading kernel state, not standing in for a signal


def test_the_piped_live_view_is_a_stream_of_changes(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    """One snapshot per change, and none while nothing changes (a pylock
    holder's held_for grows with every look: it is not a change); plain lines."""
    recorded = HolderProcess(tmp_path / "0-recorded.lock")
    args = ["who", "--system", "--watch", "--interval", "0.05", "--path", str(tmp_path)]
    stream = Child([PYLOCK, *args, "--json"], env=cli_env())
    text = Child([PYLOCK, *args], env=cli_env())
    try:
        seen = [json.loads(stream.expect(within=30))]
        assert [f["path"] for f in seen[0]["files"]] == [str(tmp_path / "0-recorded.lock")]
        assert seen[0]["files"][0]["locks"][0]["holders"][0]["held_for"] is not None
        first = text.expect(within=30)
        assert first.endswith("1 lock on 1 file, 0 waiting, 0 deadlocks")
        p = lockers()
        for name in ("a", "b", "c"):
            _until_looked_again(stream.pid)
            p.take("flock", "ex", str(tmp_path / name))
            seen.append(json.loads(stream.expect(within=30)))
            assert [f["path"] for f in seen[-1]["files"]][-1] == str(tmp_path / name), seen
        shown = [[f["path"] for f in doc["files"]][1:] for doc in seen]
        assert shown[-1] == [str(tmp_path / n) for n in "abc"]
        while True:
            line = text.expect(within=30)
            assert "\x1b" not in line and "\r" not in line
            if line.endswith("4 locks on 4 files, 0 waiting, 0 deadlocks"):
                break
        assert text.expect(within=30) == str(tmp_path / "0-recorded.lock")
    finally:
        stream.close()
        text.close()
        recorded.close()


def test_the_live_view_redraws_in_place_on_a_terminal_and_gives_it_back(
    tmp_path: Path, lockers: Callable[[], Locker]
) -> None:
    import fcntl
    import signal
    import struct
    import termios

    paths = [str(tmp_path / f"file-{n}-with-a-long-name.lock") for n in range(6)]
    p = lockers()
    for path in paths:
        p.take("flock", "ex", path)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 5, 40, 0, 0))
    args = ["who", "--system", "--watch", "--interval", "0.05", "--path", str(tmp_path)]
    view = subprocess.Popen([PYLOCK, *args], stdin=slave, stdout=slave, stderr=slave, env=cli_env())
    os.close(slave)
    got = b""
    try:
        while got.count(b"\x1b[H") < 2:  # two frames, the second over the first
            got += _read_pty(master)
        view.send_signal(signal.SIGINT)
        assert view.wait(timeout=30) == -signal.SIGINT
        while True:
            more = _read_pty(master)
            if not more:
                break
            got += more
    finally:
        if view.poll() is None:
            view.kill()
            view.wait()
        os.close(master)
    assert got.startswith(b"\x1b[?1049h\x1b[?25l")
    frame = got.split(b"\x1b[H")[2].split(b"\x1b[J")[0]
    lines = frame.replace(b"\x1b[K", b"").split(b"\r\n")
    assert len(lines) == 5 and all(len(line) <= 39 for line in lines), lines
    assert lines[-1].startswith(b"... ") and b"more lines" in lines[-1]
    restored = got.rsplit(b"\x1b[?25h\x1b[?1049l", 1)[1]
    assert b"file-5-with-a-long-name.lock" in restored  # the last frame, whole, in the scrollback


def _read_pty(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], 30)
    assert ready, "the live view drew nothing in 30 s"
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other side closed
        return b""
