"""Port locks and bind_port: host-wide, across processes and users, naming foreign listeners."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import pylock
from pylock._daemon.dirs import UnsafeDirectory
from pylock._daemon.ports import listeners
from tests.support import env_with_repo
from tests.support.children import Forked
from tests.support.pause import call_of, paused_at
from tests.support.procs import NOBODY


@pytest.fixture
def port_dir(monkeypatch):
    """A fresh shared port directory, as pylock creates it (in /tmp, so every user reaches it)."""
    parent = tempfile.mkdtemp(prefix="pylock-ports-", dir="/tmp")
    os.chmod(parent, 0o1777)  # like /tmp: whichever user comes first creates it
    path = os.path.join(parent, "ports")
    monkeypatch.setenv("PYLOCK_PORT_DIR", path)
    yield Path(path)
    shutil.rmtree(parent, ignore_errors=True)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HOLDER = textwrap.dedent(
    """
    import sys, pylock
    lock = pylock.port_lock(int(sys.argv[1]), protocol=sys.argv[2], info={"app": "holder"})
    print("held", flush=True)
    sys.stdin.read()
    """
)


def test_port_lock_across_processes_names_the_holder(port_dir):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), "tcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert (port_dir / f"tcp-{port}.lock").exists()
        assert port_dir.stat().st_mode & 0o7777 == 0o1777
        with pytest.raises(pylock.LockHeld) as caught:
            pylock.port_lock(port)
        holder = caught.value.holder
        assert holder is not None and holder.pid == proc.pid
        assert holder.info == {"app": "holder", "port": port, "protocol": "tcp"}
        # Another protocol is another lock.
        pylock.port_lock(port, protocol="udp").close()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    pylock.port_lock(port).close()  # free once the holder has gone


@pytest.mark.root  # run a holder as another user
def test_port_lock_across_users(port_dir):
    port = free_port()

    def hold(chan: Forked.Chan) -> None:
        lock = pylock.port_lock(port, info={"u": "nobody"})
        chan.say("held")
        chan.until_closed()
        lock.close()

    other = Forked(hold, user=NOBODY)
    try:
        assert other.line() == "held"
        lock_file = port_dir / f"tcp-{port}.lock"
        assert lock_file.stat().st_uid == NOBODY[0]
        assert lock_file.stat().st_mode & 0o777 == 0o666
        with pytest.raises(pylock.LockHeld) as caught:
            pylock.port_lock(port)
        holder = caught.value.holder
        assert holder is not None and holder.pid == other.pid and holder.verified
        assert holder.info == {"u": "nobody", "port": port, "protocol": "tcp"}
        other.close_input()
        assert other.wait() == 0
        # Now root takes the lock in nobody's file, and nobody is refused, told who.
        mine = pylock.port_lock(port)
        try:

            def refused(chan: Forked.Chan) -> None:
                try:
                    pylock.port_lock(port)
                except pylock.LockHeld as exc:
                    chan.say(f"refused {exc.holder.pid if exc.holder else 0}")

            loser = Forked(refused, user=NOBODY)
            assert loser.line() == f"refused {os.getpid()}"
            assert loser.wait() == 0
        finally:
            mine.close()
    finally:
        other.kill()


def test_bind_port_holds_the_lock_with_the_socket(port_dir):
    port = free_port()
    sock = pylock.bind_port(port, "127.0.0.1")
    try:
        assert sock.getsockname()[1] == port
        with pytest.raises(pylock.LockHeld):
            pylock.bind_port(port, "127.0.0.1")
        with socket.create_connection(("127.0.0.1", port)):
            pass  # it listens
    finally:
        sock.close()
    again = pylock.bind_port(port, "127.0.0.1")
    again.close()


def test_bind_port_udp(port_dir):
    port = free_port(socket.SOCK_DGRAM)
    sock = pylock.bind_port(port, "127.0.0.1", protocol="udp")
    try:
        assert sock.type == socket.SOCK_DGRAM
        with pytest.raises(pylock.LockHeld):
            pylock.port_lock(port, protocol="udp")
    finally:
        sock.close()


FOREIGN = textwrap.dedent(
    """
    import socket, sys
    kind = socket.SOCK_STREAM if sys.argv[2] == "tcp" else socket.SOCK_DGRAM
    family = socket.AF_INET6 if sys.argv[3] == "6" else socket.AF_INET
    s = socket.socket(family, kind)
    s.bind(("::1" if sys.argv[3] == "6" else "127.0.0.1", int(sys.argv[1])))
    if kind == socket.SOCK_STREAM:
        s.listen()
    print("bound", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.parametrize(("protocol", "family"), [("tcp", "4"), ("tcp", "6"), ("udp", "4")])
def test_bind_port_names_a_foreign_listener(port_dir, tmp_path, protocol, family):
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    port = free_port(kind)
    script = tmp_path / "foreign_server.py"
    script.write_text(FOREIGN)
    foreign = subprocess.Popen(
        [sys.executable, script.name, str(port), protocol, family],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert foreign.stdout is not None and foreign.stdout.readline().strip() == "bound"
        host = "::" if family == "6" else ""
        with pytest.raises(pylock.PortInUse) as caught:
            pylock.bind_port(port, host, protocol=protocol)
        error = caught.value
        assert error.errno == 98  # EADDRINUSE
        assert [listener.pids for listener in error.listeners] == [(foreign.pid,)]
        assert f"pid {foreign.pid}" in str(error) and "foreign_server.py" in str(error)
        assert f"port {port}/{protocol}" in str(error)
        # The failed bind released the port lock.
        pylock.port_lock(port, protocol=protocol).close()
    finally:
        assert foreign.stdin is not None
        foreign.stdin.close()
        foreign.wait()


def test_listeners_ignores_a_connected_client_socket(port_dir):
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)):
            # The accepted connection has the port as its local port too.
            accepted, _ = server.accept()
            with accepted:
                found = listeners(port)
    assert len(found) == 1 and found[0].pids == (os.getpid(),)


@pytest.mark.parametrize("bad", [0, 65536, -1, "80", True])
def test_bad_ports_are_refused(port_dir, bad):
    with pytest.raises(ValueError):
        pylock.port_lock(bad)


def test_bad_protocol_is_refused(port_dir):
    with pytest.raises(ValueError):
        pylock.port_lock(8080, protocol="sctp")


def test_a_world_writable_port_dir_without_sticky_bit_is_refused(port_dir):
    port_dir.mkdir(mode=0o777)
    port_dir.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="sticky"):
        pylock.port_lock(free_port())


def test_a_symlinked_port_dir_is_refused(port_dir, tmp_path):
    port_dir.symlink_to(tmp_path)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        pylock.port_lock(free_port())
    assert list(tmp_path.iterdir()) == []


# -- the shared directory under attack -------------------------------------------


@pytest.fixture
def nobodys_parent(public_dir, monkeypatch):
    """A port directory whose parent another user (uid 65534) owns, as when
    PYLOCK_PORT_DIR points into a directory of theirs: they may rename the
    port directory and put something else at its name.  Also a directory
    of root's that they cannot write to, where they would like root to
    create a world-writable file."""
    parent = public_dir / "shared"
    parent.mkdir(mode=0o755)
    os.chown(parent, *NOBODY)
    elsewhere = public_dir / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    monkeypatch.setenv("PYLOCK_PORT_DIR", str(parent / "ports"))
    return parent, elsewhere


def swapper(parent: Path, elsewhere: Path, how: str) -> Forked:
    """Another user who, told "go", renames the port directory to
    ports.checked and puts a link to `elsewhere` (or a directory of its own)
    in its place, then says "swapped"."""

    def swap(chan: Forked.Chan) -> None:
        assert chan.hear() == "go"
        os.rename(parent / "ports", parent / "ports.checked")
        if how == "symlink":
            os.symlink(elsewhere, parent / "ports")
        else:
            os.mkdir(parent / "ports", 0o777)
            os.chmod(parent / "ports", 0o777)
        chan.say("swapped")
        chan.until_closed()

    return Forked(swap, user=NOBODY)


def swapped(parent: Path, elsewhere: Path, how: str) -> bool:
    """The control: the other user's swap happened and is still in place."""
    ports = parent / "ports"
    if how == "symlink":
        return ports.is_symlink() and os.readlink(ports) == str(elsewhere)
    return not ports.is_symlink() and ports.stat().st_uid == NOBODY[0]


@pytest.mark.root  # another user swaps root's port directory
@pytest.mark.parametrize("how", ["symlink", "directory"])
def test_a_port_dir_swapped_between_its_check_and_the_open_never_gets_the_lock_file(
    nobodys_parent, how
):
    parent, elsewhere = nobodys_parent
    port = free_port()
    attacker = swapper(parent, elsewhere, how)

    def move() -> None:
        attacker.tell("go")
        assert attacker.line() == "swapped"

    try:
        # Paused after the directory was checked, just before the lock file is opened.
        with paused_at(call_of("pl_open", "pl_open_at"), move) as paused:
            lock = pylock.port_lock(port)
        try:
            assert paused, "the victim never reached the lock file's open"
            assert swapped(parent, elsewhere, how)
            assert list(elsewhere.iterdir()) == [], "root created its lock file elsewhere"
            if how == "directory":
                assert list((parent / "ports").iterdir()) == []
            lock_file = parent / "ports.checked" / f"tcp-{port}.lock"
            assert lock_file.stat().st_mode & 0o777 == 0o666
            assert (lock_file.stat().st_dev, lock_file.stat().st_ino) == lock._key
        finally:
            lock.close()
    finally:
        attacker.close_input()
        assert attacker.wait() == 0


@pytest.mark.root  # another user swaps root's port directory
def test_a_port_dir_swapped_between_two_acquisitions_never_gets_the_lock_file(nobodys_parent):
    parent, elsewhere = nobodys_parent
    port = free_port()
    lock = pylock.port_lock(port)
    attacker = swapper(parent, elsewhere, "symlink")
    try:
        lock.release()
        attacker.tell("go")
        assert attacker.line() == "swapped"
        assert swapped(parent, elsewhere, "symlink")
        # The check after locking looks the file up in the directory it was
        # opened in: still there, so nothing is reopened through the link.
        lock.acquire()
        assert list(elsewhere.iterdir()) == [], "root reopened its lock file elsewhere"
        assert lock.locked
    finally:
        lock.close()
        attacker.close_input()
        assert attacker.wait() == 0
