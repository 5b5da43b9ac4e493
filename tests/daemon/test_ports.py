"""Port locks and bind_port: host-wide, across processes and users, naming foreign listeners."""

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
from typing import Any

import pytest

import pylock
from pylock._daemon.dirs import UnsafeDirectory
from pylock._daemon.port_users import lists_bound_tcp
from pylock._daemon.ports import listeners
from tests.support import env_with_repo
from tests.support.children import Forked
from tests.support.pause import call_of, paused_at
from tests.support.procs import NOBODY, in_child


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


def test_listeners_names_the_listener_first_and_the_accepted_connections_after(port_dir):
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            # The accepted connection has the port as its local port too.
            accepted, _ = server.accept()
            with accepted:
                found = listeners(port)
            client_port = client.getsockname()[1]
    assert [(user.kind, user.pids) for user in found] == [
        ("listening", (os.getpid(),)),
        ("connected", (os.getpid(),)),
    ]
    assert found[0].local == f"127.0.0.1:{port}"
    assert found[1].remote == f"127.0.0.1:{client_port}" and found[1].state == "ESTABLISHED"


# A process holding port P in some other way than listening on it.
HOLDS = textwrap.dedent(
    """
    import socket, sys
    port, how = int(sys.argv[1]), sys.argv[2]
    if how == "udp-connected":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", port))
        s.connect(("127.0.0.1", 9))
        print("holding", "127.0.0.1:9", flush=True)
    elif how == "bound":
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        print("holding", "-", flush=True)
    else:  # "connected": an outgoing connection whose local port is P
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.connect(server.getsockname())
        print("holding", "127.0.0.1:%d" % server.getsockname()[1], flush=True)
    sys.stdin.read()
    """
)


def holding(tmp_path: Path, port: int, how: str) -> tuple[subprocess.Popen[str], str]:
    script = tmp_path / "port_holder.py"
    script.write_text(HOLDS)
    proc = subprocess.Popen(
        [sys.executable, script.name, str(port), how],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    word, peer = proc.stdout.readline().split()
    assert word == "holding"
    return proc, peer


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()


def test_bind_port_names_a_connection_whose_local_port_it_is(port_dir, tmp_path):
    port = free_port()  # from the ephemeral range, as an outgoing connection's would be
    proc, peer = holding(tmp_path, port, "connected")
    try:
        with pytest.raises(pylock.PortInUse) as caught:
            pylock.bind_port(port)
        error = caught.value
        assert [(user.kind, user.pids) for user in error.listeners] == [("connected", (proc.pid,))]
        assert f"pid {proc.pid} (" in str(error) and "port_holder.py" in str(error)
        assert f"connected from 127.0.0.1:{port} to {peer} (ESTABLISHED)" in str(error)
        assert "ip_local_port_range" in str(error)  # why a server port was taken
        assert "cannot" not in str(error)
    finally:
        release(proc)


@pytest.mark.skipif(
    not lists_bound_tcp(), reason="Linux lists TCP sockets that are only bound from 6.8 on"
)
def test_bind_port_names_a_tcp_socket_bound_but_not_listening(port_dir, tmp_path):
    port = free_port()
    proc, _ = holding(tmp_path, port, "bound")
    try:
        with pytest.raises(pylock.PortInUse) as caught:
            pylock.bind_port(port)
        error = caught.value
        assert [(user.kind, user.pids) for user in error.listeners] == [("bound", (proc.pid,))]
        assert f"pid {proc.pid} (" in str(error)
        assert f"bound to 127.0.0.1:{port}, neither listening nor connected" in str(error)
    finally:
        release(proc)


def test_bind_port_names_a_connected_udp_socket(port_dir, tmp_path):
    port = free_port(socket.SOCK_DGRAM)
    proc, peer = holding(tmp_path, port, "udp-connected")
    try:
        with pytest.raises(pylock.PortInUse) as caught:
            pylock.bind_port(port, protocol="udp")
        assert f"pid {proc.pid} (" in str(caught.value)
        assert f"connected from 127.0.0.1:{port} to {peer}" in str(caught.value)
    finally:
        release(proc)


@pytest.mark.root  # a user who may not look at root's descriptors
def test_another_users_connection_on_the_port_is_named_by_its_user(port_dir, tmp_path):
    port = free_port()
    proc, peer = holding(tmp_path, port, "connected")

    def bind(chan: Forked.Chan) -> None:
        try:
            pylock.bind_port(port)
        except pylock.PortInUse as exc:
            chan.say(str(exc))

    try:
        other = Forked(bind, user=NOBODY)
        message = other.line()
        assert other.wait() == 0
        assert "a process of user root (uid 0; pylock may not see its descriptors" in message
        assert f"connected from 127.0.0.1:{port} to {peer}" in message
    finally:
        release(proc)


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


def as_victim(fn: Callable[[], Any]) -> Any:
    """fn() in a forked child of this root process: a victim that never
    finishes (a reopen loop) fails the test instead of stalling the suite."""
    result = in_child(fn, timeout=30)
    assert not result.get("hang"), "the victim never finished"
    assert "value" in result, result
    return result["value"]


@pytest.mark.root  # another user swaps root's port directory
@pytest.mark.parametrize("how", ["symlink", "directory"])
def test_a_port_dir_swapped_between_its_check_and_the_open_never_gets_the_lock_file(
    nobodys_parent, how
):
    # Paused after the directory was checked, just before the lock file is opened.
    opening = call_of("pl_open", "pl_open_at")
    parent, elsewhere = nobodys_parent
    port = free_port()
    attacker = swapper(parent, elsewhere, how)
    lock_file = parent / "ports.checked" / f"tcp-{port}.lock"

    def move() -> None:
        attacker.tell("go")
        assert attacker.line() == "swapped"

    def victim() -> dict[str, Any]:
        with paused_at(opening, move) as paused:
            lock = pylock.port_lock(port)
        st = lock_file.stat() if lock_file.exists() else None
        return {
            "paused": paused,
            "swapped": swapped(parent, elsewhere, how),
            "elsewhere": [p.name for p in elsewhere.iterdir()],
            "in_new": [p.name for p in (parent / "ports").iterdir()] if how == "directory" else [],
            "mode": st and stat.S_IMODE(st.st_mode),
            "ours": st is not None and (st.st_dev, st.st_ino) == lock._key,
        }

    try:
        seen = as_victim(victim)
        assert seen["paused"], "the victim never reached the lock file's open"
        assert seen["swapped"]  # the control: the other user's swap happened
        assert seen["elsewhere"] == [], "root created its lock file elsewhere"
        assert seen["in_new"] == [], "root created its lock file in the other user's directory"
        assert seen["mode"] == 0o666 and seen["ours"]  # in the checked directory
    finally:
        attacker.close_input()
        assert attacker.wait() == 0


@pytest.mark.root  # another user swaps root's port directory
def test_a_port_dir_swapped_between_two_acquisitions_never_gets_the_lock_file(nobodys_parent):
    parent, elsewhere = nobodys_parent
    port = free_port()
    attacker = swapper(parent, elsewhere, "symlink")

    def victim() -> dict[str, Any]:
        lock = pylock.port_lock(port)
        lock.release()
        attacker.tell("go")
        assert attacker.line() == "swapped"
        # The check after locking looks the file up in the directory it was
        # opened in: still there, so nothing is reopened through the link.
        lock.acquire()
        return {
            "swapped": swapped(parent, elsewhere, "symlink"),
            "elsewhere": [p.name for p in elsewhere.iterdir()],
            "locked": lock.locked,
        }

    try:
        seen = as_victim(victim)
        assert seen["swapped"]
        assert seen["elsewhere"] == [], "root reopened its lock file elsewhere"
        assert seen["locked"]
    finally:
        attacker.close_input()
        assert attacker.wait() == 0
