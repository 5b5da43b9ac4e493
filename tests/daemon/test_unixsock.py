"""claim_unix_socket against a live listener, a stale socket file and files that are not sockets;
and the per-user runtime directory's checks."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import pylock
from pylock._daemon import unixsock
from pylock._daemon.dirs import UnsafeDirectory
from tests.support.children import Forked
from tests.support.pause import call_of, paused_at
from tests.support.procs import NOBODY

LISTENER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sys.argv[1])
    s.listen(int(sys.argv[2]))
    print("listening", flush=True)
    sys.stdin.read()
    """
)


def start_listener(path: Path, backlog: int = 8) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(path), str(backlog)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()


def test_a_live_listener_is_refused_and_named(tmp_path):
    path = tmp_path / "d.sock"
    live = start_listener(path)
    try:
        before = path.lstat()
        with pytest.raises(pylock.SocketInUse) as caught:
            pylock.claim_unix_socket(path)
        assert caught.value.peer is not None
        assert caught.value.peer.pid == live.pid and caught.value.peer.uid == os.getuid()
        assert f"pid {live.pid}" in str(caught.value) and str(path) in str(caught.value)
        assert path.lstat().st_ino == before.st_ino  # left in place
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))  # and still serving
    finally:
        stop(live)


def test_a_listener_with_a_full_backlog_is_live_and_the_probe_does_not_hang(tmp_path):
    path = tmp_path / "d.sock"
    live = start_listener(path, backlog=0)
    clients = []
    full = False
    try:
        # Fill the backlog (the listener never accepts).
        for _ in range(64):
            client = socket.socket(socket.AF_UNIX)
            client.setblocking(False)
            try:
                client.connect(str(path))
            except BlockingIOError:
                client.close()
                full = True
                break
            clients.append(client)
        assert full
        with pytest.raises(pylock.SocketInUse):
            pylock.claim_unix_socket(path)
        assert path.exists()
    finally:
        for client in clients:
            client.close()
        stop(live)


def test_a_stale_socket_file_is_replaced(tmp_path, caplog):
    path = tmp_path / "d.sock"
    dead = start_listener(path)
    dead.kill()
    dead.wait()
    assert stat.S_ISSOCK(path.lstat().st_mode)
    sock = pylock.claim_unix_socket(path, mode=0o660)
    try:
        assert path.lstat().st_mode & 0o777 == 0o660
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            conn, _ = sock.accept()
            conn.close()
        assert "dead socket file" in caplog.text
    finally:
        sock.close()


def test_a_stale_datagram_socket_file_is_replaced(tmp_path):
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram:
        dgram.bind(str(path))
    pylock.claim_unix_socket(path).close()


def test_a_live_datagram_socket_is_refused(tmp_path):
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram:
        dgram.bind(str(path))
        with pytest.raises(pylock.SocketInUse):
            pylock.claim_unix_socket(path)
        assert path.exists()


def test_a_regular_file_is_left_intact(tmp_path):
    path = tmp_path / "d.sock"
    path.write_bytes(b"precious data")
    with pytest.raises(pylock.SocketInUse, match="regular file"):
        pylock.claim_unix_socket(path)
    assert path.read_bytes() == b"precious data"


def test_a_symlink_and_a_directory_are_left_intact(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"x")
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    with pytest.raises(pylock.SocketInUse, match="symbolic link"):
        pylock.claim_unix_socket(link)
    assert link.is_symlink() and target.read_bytes() == b"x"
    directory = tmp_path / "dir.sock"
    directory.mkdir()
    with pytest.raises(pylock.SocketInUse, match="directory"):
        pylock.claim_unix_socket(directory)
    assert directory.is_dir()


def test_a_fresh_path_is_bound(tmp_path):
    sock = pylock.claim_unix_socket(tmp_path / "new.sock")
    try:
        assert sock.getsockname() == str(tmp_path / "new.sock")
    finally:
        sock.close()


# -- the per-user runtime directory ----------------------------------------------


@pytest.fixture
def no_runtime_env(monkeypatch, tmp_path):
    monkeypatch.delenv("PYLOCK_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    (tmp_path / "xdg").mkdir(mode=0o700)


def test_runtime_dir_under_xdg_is_created_private(no_runtime_env, tmp_path):
    path = pylock.runtime_dir()
    assert path == str(tmp_path / "xdg" / "pylock")
    st = os.lstat(path)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()


def test_runtime_dir_without_xdg_is_private_in_tmp(monkeypatch, tmp_path):
    monkeypatch.delenv("PYLOCK_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # gettempdir() caches its answer
    try:
        path = pylock.runtime_dir()
    finally:
        tempfile.tempdir = None
    assert path == str(tmp_path / f"pylock-{os.geteuid()}")
    assert os.lstat(path).st_mode & 0o777 == 0o700


def test_a_group_writable_runtime_dir_is_refused(no_runtime_env, tmp_path):
    (tmp_path / "xdg" / "pylock").mkdir(mode=0o700)
    (tmp_path / "xdg" / "pylock").chmod(0o770)
    with pytest.raises(UnsafeDirectory, match="group- or world-writable"):
        pylock.singleton("agent")


def test_a_symlinked_runtime_dir_is_refused(no_runtime_env, tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "xdg" / "pylock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        pylock.singleton("agent")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.root  # make a directory of another user
def test_a_runtime_dir_of_another_user_is_refused(monkeypatch, tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, *NOBODY)
    monkeypatch.setenv("PYLOCK_RUNTIME_DIR", str(planted))
    with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
        pylock.singleton("agent")
    assert list(planted.iterdir()) == []


def test_pylock_runtime_dir_overrides_xdg(no_runtime_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PYLOCK_RUNTIME_DIR", str(tmp_path / "mine"))
    assert pylock.runtime_dir() == str(tmp_path / "mine")
    assert not (tmp_path / "xdg" / "pylock").exists()
    shutil.rmtree(tmp_path / "mine")


# -- a socket directory other users may write to -----------------------------------


def dead_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # closed without unlinking: a dead socket file


def attacker(move: Callable[[], None]) -> Forked:
    """uid 65534, who makes its move when told "go" and then says "swapped"."""

    def run(chan: Forked.Chan) -> None:
        assert chan.hear() == "go"
        move()
        chan.say("swapped")
        chan.until_closed()

    return Forked(run, user=NOBODY)


def go(other: Forked) -> Callable[[], None]:
    def move() -> None:
        other.tell("go")
        assert other.line() == "swapped"

    return move


def finish(other: Forked) -> None:
    other.close_input()
    assert other.wait() == 0


@pytest.mark.root  # another user swaps root's fresh socket
def test_the_mode_never_reaches_a_file_swapped_in_for_the_fresh_socket(public_dir):
    run = public_dir / "run"  # another user's directory: they may rename its entries
    run.mkdir(mode=0o755)
    os.chown(run, *NOBODY)
    secret = public_dir / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    path = run / "d.sock"

    def swap() -> None:
        os.rename(path, run / "d.sock.moved")
        os.symlink(secret, path)

    other = attacker(swap)
    try:
        # Paused at the first step after the socket file appeared (before
        # anything could set its mode by name).
        with paused_at(lambda event, name: os.path.lexists(path), go(other)) as paused:
            sock = pylock.claim_unix_socket(path, mode=0o660)
        try:
            assert paused, "the socket file never appeared"
            assert os.readlink(path) == str(secret)  # the control: the swap happened
            assert stat.S_IMODE(secret.stat().st_mode) == 0o600, "root's claim changed its mode"
            moved = (run / "d.sock.moved").lstat()
            assert stat.S_ISSOCK(moved.st_mode) and stat.S_IMODE(moved.st_mode) == 0o660
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(run / "d.sock.moved"))
        finally:
            sock.close()
    finally:
        finish(other)


@pytest.mark.root  # another user swaps the directory of root's dead socket
def test_removing_a_dead_socket_never_follows_a_directory_swapped_in_after_the_check(public_dir):
    shared = public_dir / "shared"  # another user's: they may rename the socket's directory
    shared.mkdir(mode=0o755)
    os.chown(shared, *NOBODY)
    (shared / "run").mkdir(mode=0o755)
    dead_socket(shared / "run" / "d.sock")
    elsewhere = public_dir / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    precious = elsewhere / "d.sock"
    precious.write_bytes(b"precious data")

    def swap() -> None:
        os.rename(shared / "run", shared / "run.checked")
        os.symlink(elsewhere, shared / "run")

    other = attacker(swap)
    try:
        # Paused after the dead socket was checked twice, just before its removal.
        with paused_at(call_of("unlink"), go(other)) as paused:
            sock = pylock.claim_unix_socket(shared / "run" / "d.sock")
        try:
            assert paused
            assert os.readlink(shared / "run") == str(elsewhere)  # the control
            assert stat.S_ISREG(precious.lstat().st_mode), "root replaced a file elsewhere"
            assert precious.read_bytes() == b"precious data"
            claimed = shared / "run.checked" / "d.sock"
            assert stat.S_ISSOCK(claimed.lstat().st_mode)
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(claimed))  # the new socket, where the dead one was
        finally:
            sock.close()
    finally:
        finish(other)


@pytest.mark.root  # another user swaps the dead socket itself
def test_a_dead_socket_swapped_for_a_file_while_dialled_is_left_intact(public_dir):
    run = public_dir / "run"
    run.mkdir(mode=0o755)
    os.chown(run, *NOBODY)
    path = run / "d.sock"
    dead_socket(path)

    def swap() -> None:
        os.rename(path, run / "d.sock.old")
        path.write_bytes(b"their data")

    other = attacker(swap)
    try:
        dialling = call_of("connect", "pl_unix_at")
        refused = pytest.raises(pylock.SocketInUse, match="changed while pylock checked it")
        with paused_at(dialling, go(other)) as paused, refused:
            pylock.claim_unix_socket(path)
        assert paused
        assert path.read_bytes() == b"their data"
    finally:
        finish(other)


@pytest.mark.root  # links of root and of another user
def test_a_socket_directory_behind_a_link_is_followed_only_for_root_or_the_caller(public_dir):
    real = public_dir / "real"
    real.mkdir()
    link = public_dir / "link"
    link.symlink_to(real)
    sock = pylock.claim_unix_socket(link / "d.sock")  # root's link: followed (like /var/run)
    sock.close()
    assert stat.S_ISSOCK((real / "d.sock").lstat().st_mode)
    theirs = public_dir / "theirs"
    theirs.symlink_to(real)
    os.lchown(theirs, *NOBODY)
    with pytest.raises(UnsafeDirectory, match="symbolic link of uid 65534"):
        pylock.claim_unix_socket(theirs / "e.sock")
    assert not (real / "e.sock").exists()


def test_claiming_leaves_the_programs_umask_and_working_directory_alone(tmp_path):
    cwd = os.getcwd()
    old = os.umask(0o077)
    try:
        sock = pylock.claim_unix_socket(tmp_path / "d.sock", mode=0o666)
        sock.close()
        assert os.umask(0o077) == 0o077 and os.getcwd() == cwd
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "d.sock").lstat().st_mode) == 0o666


@pytest.fixture
def by_path(monkeypatch):
    """Where threads cannot have their own working directory (macOS, a
    seccomp policy refusing unshare): pylock binds by path."""
    monkeypatch.setattr(unixsock, "_per_thread_cwd", False)


@pytest.mark.parametrize("dir_mode", [0o700, 0o1777])
def test_by_path_the_mode_is_set_where_nobody_else_renames_entries(by_path, tmp_path, dir_mode):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(dir_mode)
    sock = pylock.claim_unix_socket(run / "d.sock", mode=0o660)
    sock.close()
    assert stat.S_IMODE((run / "d.sock").lstat().st_mode) == 0o660


def test_by_path_a_mode_in_a_directory_others_may_rename_in_is_refused(by_path, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    with pytest.raises(pylock.LockError, match="other users may rename entries"):
        pylock.claim_unix_socket(run / "d.sock", mode=0o660)
    assert not (run / "d.sock").exists()
    pylock.claim_unix_socket(run / "d.sock").close()  # without a mode: nothing to set by name
