"""The operator's commands: pylock who, wait, wait-exit and list (with --clean)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pylock
from tests.support.cli import FLOCK, PYLOCK, Holder, cli, cli_env
from tests.support.kernel_locks import free_now, wait_blocked

# -- who -----------------------------------------------------------------------------


def test_who_free_missing_and_bad_paths(lock_path: str, tmp_path: Path) -> None:
    out = cli("who", lock_path)
    assert (out.returncode, out.stdout) == (1, f"{lock_path}: free\n")
    Path(lock_path).touch()
    out = cli("who", "--json", lock_path)
    assert out.returncode == 1
    assert json.loads(out.stdout) == [
        {"path": lock_path, "held": False, "holders": [], "error": None}
    ]
    missing_dir = str(tmp_path / "no" / "x.lock")
    out = cli("who", missing_dir)
    assert out.returncode == 66
    assert f"the directory {tmp_path / 'no'} does not exist" in out.stderr
    link = tmp_path / "link"
    link.symlink_to(lock_path)
    out = cli("who", str(link))
    assert out.returncode == 66 and "symbolic link" in out.stderr


def test_who_names_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path, info={"port": 8080})
    out = cli("who", lock_path)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith(f"{lock_path}: held by pid {holder.pid} (")
    assert f" on {socket.gethostname()} since " in first
    assert ", for " in first and first.endswith("(verified by the kernel)")
    assert second == '  info: {"port": 8080}'


def test_who_json_parsed_back(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path, info={"port": 8080})
    out = cli("who", "--json", lock_path)
    assert out.returncode == 0, out.stderr
    (report,) = json.loads(out.stdout)
    assert report["path"] == lock_path and report["held"] is True
    (entry,) = report["holders"]
    assert entry["pid"] == holder.pid
    assert entry["verified"] is True and entry["shared"] is False
    assert entry["info"] == {"port": 8080}
    assert entry["hostname"] == socket.gethostname()
    assert entry["program"] == os.path.basename(sys.executable)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["acquired_at"])
    assert 0 <= entry["held_for"] < 600
    found = pylock.Lock(lock_path).holder()
    assert found is not None and entry["start_time"] == found.start_time


def test_who_lists_every_shared_holder(lock_path: str, spawn_holder) -> None:
    a = spawn_holder(lock_path, shared=True)
    b = spawn_holder(lock_path, shared=True)
    for args in ([], ["--all"]):
        out = cli("who", *args, "--json", lock_path)
        assert out.returncode == 0, out.stderr
        (report,) = json.loads(out.stdout)
        assert sorted(e["pid"] for e in report["holders"]) == sorted([a.pid, b.pid])
        assert all(e["shared"] and e["verified"] for e in report["holders"])
    text = cli("who", lock_path)
    lines = text.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{lock_path}: shared by pid") for line in lines)


def test_who_all_includes_inherited_descriptors(lock_path: str) -> None:
    holder = Holder([PYLOCK, "run"], lock_path)
    try:
        one = json.loads(cli("who", "--json", lock_path).stdout)[0]["holders"]
        assert [h["pid"] for h in one] == [holder.proc.pid]  # the recorded holder
        every = json.loads(cli("who", "--all", "--json", lock_path).stdout)[0]["holders"]
        assert sorted(h["pid"] for h in every) == sorted([holder.proc.pid, holder.shell_pid])
    finally:
        holder.release()


def test_who_several_paths_and_directories(tmp_path: Path, spawn_holder) -> None:
    held, free = str(tmp_path / "held"), str(tmp_path / "free")
    spawn_holder(held)
    directory = tmp_path / "d"
    directory.mkdir()
    assert cli("who", held, held).returncode == 0
    out = cli("who", held, free)
    assert out.returncode == 1 and out.stdout.splitlines()[-1] == f"{free}: free"
    assert cli("who", str(directory)).returncode == 1
    if FLOCK is not None:
        by_flock = Holder([FLOCK], str(directory))
        try:
            out = cli("who", str(directory))
            assert out.returncode == 0
            assert out.stdout.startswith(f"{directory}: held by pid {by_flock.proc.pid} (flock ")
        finally:
            by_flock.release()


# -- wait ------------------------------------------------------------------------------


def test_wait_returns_when_free_without_keeping_it(lock_path: str, spawn_holder) -> None:
    assert cli("wait", lock_path).returncode == 0  # no file: free
    holder = spawn_holder(lock_path)
    content = Path(lock_path).read_bytes()
    out = cli("wait", "-w", "0.05", lock_path)
    assert out.returncode == 1 and f"still held by pid {holder.pid}" in out.stderr
    assert cli("wait", "-q", "-w", "0", lock_path).stderr == ""
    waiter = subprocess.Popen([PYLOCK, "wait", lock_path], env=cli_env())
    try:
        wait_blocked(lock_path, waiter.pid)  # asleep in the kernel
        assert waiter.poll() is None
        holder.release()
        assert waiter.wait(timeout=30) == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert free_now(lock_path)
    assert Path(lock_path).read_bytes() == content  # wait wrote nothing


def test_wait_ctrl_c_is_a_sigint_death(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path)
    waiter = subprocess.Popen(
        [PYLOCK, "wait", lock_path], env=cli_env(), stderr=subprocess.PIPE, start_new_session=True
    )
    wait_blocked(lock_path, waiter.pid)
    os.killpg(waiter.pid, signal.SIGINT)
    _, err = waiter.communicate(timeout=30)
    assert (waiter.returncode, err) == (-signal.SIGINT, b"")


# -- wait-exit -------------------------------------------------------------------------


def _waiting_on_a_pidfd(pid: int) -> bool:
    """The process sleeps in poll with a pidfd open: it is waiting for an exit."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    with open(f"/proc/{pid}/wchan") as f:
        wchan = f.read()
    return any("pidfd" in link for link in links) and "poll" in wchan


def test_wait_exit_every_pid() -> None:
    first = subprocess.Popen(["sleep", "1000"])
    second = subprocess.Popen(["sleep", "1000"])
    try:
        out = cli("wait-exit", "-w", "0.1", str(first.pid), str(second.pid))
        assert out.returncode == 1, out.stderr
        waiter = subprocess.Popen(
            [PYLOCK, "wait-exit", str(first.pid), str(second.pid)], env=cli_env()
        )
        try:
            deadline = time.monotonic() + 30
            while not _waiting_on_a_pidfd(waiter.pid):
                assert waiter.poll() is None, "wait-exit returned while its targets lived"
                assert time.monotonic() < deadline, "wait-exit never started waiting"
                time.sleep(0.005)  # re-reading kernel state, not standing in for a signal
            first.kill()
            first.wait()
            # Still waiting for the second one.
            deadline = time.monotonic() + 30
            while not _waiting_on_a_pidfd(waiter.pid):
                assert waiter.poll() is None, "wait-exit returned before the second exited"
                assert time.monotonic() < deadline
                time.sleep(0.005)  # re-reading kernel state, not standing in for a signal
            second.kill()
            assert waiter.wait(timeout=30) == 0
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert cli("wait-exit", str(first.pid)).returncode == 0  # gone already


def test_wait_exit_ctrl_c_is_a_sigint_death() -> None:
    target = subprocess.Popen(["sleep", "1000"])
    waiter = subprocess.Popen(
        [PYLOCK, "wait-exit", str(target.pid)],
        env=cli_env(),
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _waiting_on_a_pidfd(waiter.pid):
            assert time.monotonic() < deadline, "wait-exit never started waiting"
            time.sleep(0.005)  # re-reading kernel state, not standing in for a signal
        os.killpg(waiter.pid, signal.SIGINT)
        _, err = waiter.communicate(timeout=30)
        assert (waiter.returncode, err) == (-signal.SIGINT, b"")
    finally:
        target.kill()
        target.wait()


def test_wait_exit_refuses_a_thread_id() -> None:
    code = "import threading,os;e=threading.Event();threading.Thread(target=lambda:(print(threading.get_native_id(),flush=True),e.wait())).start();input()"  # noqa: E501
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        tid = int(proc.stdout.readline())
        out = cli("wait-exit", str(tid))
        assert out.returncode == 64
        assert f"{tid} is a thread of process {proc.pid}, not a process" in out.stderr
    finally:
        proc.kill()
        proc.wait()


# -- list ------------------------------------------------------------------------------


def _stale(path: str) -> None:
    """A lock file whose recorded holder has exited."""
    code = "import sys, pylock; pylock.Lock(sys.argv[1]).acquire()"
    subprocess.run([sys.executable, "-c", code, path], check=True, env=cli_env())


def test_list_shows_held_free_and_stale(tmp_path: Path, spawn_holder) -> None:
    held = str(tmp_path / "held.lock")
    stale = str(tmp_path / "stale.lock")
    empty = tmp_path / "empty.lock"
    holder = spawn_holder(held)
    _stale(stale)
    empty.touch()
    (tmp_path / "notes.txt").write_text("not a lock file")
    (tmp_path / "sub").mkdir()
    out = cli("list", "--json", str(tmp_path))
    assert out.returncode == 0, out.stderr
    entries = {Path(e["path"]).name: e for e in json.loads(out.stdout)}
    assert sorted(entries) == ["empty.lock", "held.lock", "stale.lock"]
    assert entries["held.lock"]["held"] and entries["held.lock"]["holders"][0]["pid"] == holder.pid
    assert not entries["held.lock"]["stale"]
    assert entries["stale.lock"]["stale"] and entries["stale.lock"]["record"]["alive"] is False
    assert not entries["empty.lock"]["held"] and not entries["empty.lock"]["stale"]
    text = cli("list", str(tmp_path)).stdout
    assert f"{held}: held by pid {holder.pid}" in text
    assert f"{stale}: free (last held by pid " in text and ", gone)" in text
    only = json.loads(cli("list", "--stale", "--json", str(tmp_path)).stdout)
    assert [Path(e["path"]).name for e in only] == ["stale.lock"]
    assert cli("list", str(tmp_path / "nope")).returncode == 66


def test_list_clean_removes_only_stale_files(tmp_path: Path, spawn_holder) -> None:
    held = str(tmp_path / "held.lock")
    stale = str(tmp_path / "stale.lock")
    spawn_holder(held)
    _stale(stale)
    released_alive = str(tmp_path / "released.lock")  # its holder released but still runs
    lock = pylock.Lock(released_alive)
    lock.acquire()
    lock.release()
    (tmp_path / "notes.txt").write_text("not a lock file")
    out = cli("list", "--clean", "--json", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (entry,) = json.loads(out.stdout)
    assert (entry["path"], entry["removed"]) == (stale, True)
    assert sorted(os.listdir(tmp_path)) == ["held.lock", "notes.txt", "released.lock"]
    lock.close()


def test_clean_never_removes_a_held_or_awaited_lock(tmp_path: Path) -> None:
    """A stale record, but someone holds the file now (and another waits for it)."""
    path = str(tmp_path / "job.lock")
    _stale(path)
    assert FLOCK is not None
    holder = Holder([FLOCK], path)  # flock(1) writes no record: the stale one stays
    waiter = subprocess.Popen([PYLOCK, "run", path, "true"], env=cli_env())
    try:
        wait_blocked(path, waiter.pid)
        out = cli("list", "--clean", "--json", str(tmp_path))
        assert out.returncode == 0
        assert json.loads(out.stdout) == []  # held: not stale
        assert os.path.exists(path)
    finally:
        holder.release()
        assert waiter.wait(timeout=30) == 0
    assert os.path.exists(path)


def test_clean_racing_a_taker_never_leaves_it_holding_a_removed_file(tmp_path: Path) -> None:
    """--clean and a taker started together: whoever wins, once the taker says it
    holds the lock, the file at the path is the one it holds (locked)."""
    path = str(tmp_path / "job.lock")
    outcomes = set()
    for _ in range(20):
        _stale(path)
        cleaner = subprocess.Popen(
            [PYLOCK, "list", "--clean", "--json", str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        taker = Holder([PYLOCK, "run"], path)
        try:
            report, _ = cleaner.communicate(timeout=30)
            assert cleaner.returncode == 0
            outcomes.add(bool(json.loads(report) and json.loads(report)[0]["removed"]))
            assert os.path.exists(path) and not free_now(path)
        finally:
            taker.release()
    assert outcomes  # which side won varies; the invariant held every time


def test_clean_unlinks_only_while_it_holds_the_lock(tmp_path: Path, monkeypatch) -> None:
    """The instant --clean unlinks a stale file, that file is locked (by the cleaner).

    Run in-process so the check can sit exactly at the unlink; the lock, the
    file and the kernel are real, only os.unlink is wrapped to look first.
    """
    from pylock._cli import list as _cli_list

    path = str(tmp_path / "job.lock")
    _stale(path)
    locked_at_unlink = []
    real_unlink = os.unlink

    def unlink(target, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.fspath(target) == path:
            locked_at_unlink.append(not free_now(path))
        return real_unlink(target, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    entry = _cli_list.inspect(path)
    assert entry is not None and entry.stale
    _cli_list.clean(entry)
    assert locked_at_unlink == [True] and entry.removed
    assert not os.path.exists(path)


def test_list_without_a_lock_table_asks_the_lock_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel shows no lock table (/proc unreadable, as on macOS), a
    lock file is seen held by a shared lock taken and given back at once."""
    from pylock._cli import list as _cli_list
    from pylock._core import locktable, procfs

    held, free = str(tmp_path / "held.lock"), str(tmp_path / "free.lock")
    Path(free).touch()
    assert FLOCK is not None
    holder = Holder([FLOCK], held)
    try:
        monkeypatch.setattr(procfs, "PROC", str(tmp_path / "no-proc"))
        monkeypatch.setattr(locktable, "PROC", str(tmp_path / "no-proc"))
        entry = _cli_list.inspect(held)
        assert entry is not None and entry.held
        assert [h.note for h in entry.holders] == ["/proc/locks is unreadable"]
        entry = _cli_list.inspect(free)
        assert entry is not None and not entry.held
        assert not free_now(held)  # still its holder's
    finally:
        holder.release()
