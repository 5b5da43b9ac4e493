"""The /proc readers: a process's command line, thread group, uids and
umask, pid_max, a descriptor's path and the sockets bound to a port, read
from real processes and real sockets (an empty stand-in /proc only where
the question is what happens without one)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from pylock._core import locktable, procfs
from tests.support import IS_ROOT
from tests.support.children import Child, Forked, Sleeper, wait_unreaped
from tests.support.procs import NOBODY


def test_the_command_line_is_split_at_nul_bytes_only() -> None:
    argv = [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"]
    child = Child([*argv, "two words", " padded ", "x"])
    try:
        child.expect("ready")
        assert procfs.cmdline(child.pid) == (*argv, "two words", " padded ", "x")
        assert procfs.command_of(child.pid) == (
            os.path.basename(sys.executable),
            procfs.cmdline(child.pid),
        )
    finally:
        child.close()
    if hasattr(sys, "orig_argv"):  # Python 3.10+
        assert procfs.cmdline("self") == tuple(sys.orig_argv)


def test_a_process_without_a_command_line_is_named_by_its_comm() -> None:
    child = Child(["sleep", "3600"], capture_stderr=False)
    try:
        child.signal(9)
        wait_unreaped(child.pid)  # a zombie: cmdline is empty
        assert procfs.cmdline(child.pid) == ()
        assert procfs.command_of(child.pid) == ("sleep", ())
    finally:
        child.close()


def test_a_thread_id_belongs_to_its_process() -> None:
    ids: list[int] = []
    started, release = threading.Event(), threading.Event()

    def run() -> None:
        ids.append(threading.get_native_id())
        started.set()
        release.wait()

    live = threading.Thread(target=run)
    live.start()
    try:
        started.wait()
        assert ids[0] != os.getpid()
        assert procfs.thread_group(ids[0]) == os.getpid()
    finally:
        release.set()
        live.join()
    assert procfs.thread_group(os.getpid()) == os.getpid()
    sleeper = Sleeper()
    sleeper.close()
    assert procfs.thread_group(sleeper.pid) is None


def test_uids_are_the_real_and_the_effective_one() -> None:
    assert procfs.uids(os.getpid()) == (os.getuid(), os.geteuid())
    sleeper = Sleeper()
    sleeper.close()
    assert procfs.uids(sleeper.pid) is None


@pytest.mark.root
def test_uids_of_another_users_process() -> None:
    assert IS_ROOT

    def wait_as_nobody(chan: Forked.Chan) -> None:
        chan.say("up")
        chan.until_closed()

    other = Forked(wait_as_nobody, user=NOBODY)
    try:
        assert other.line() == "up"
        assert procfs.uids(other.pid) == (NOBODY[0], NOBODY[0])
    finally:
        other.close_input()
        other.wait()


def test_own_umask_is_read_without_setting_it() -> None:
    old = os.umask(0o027)
    try:
        assert procfs.own_umask() == 0o027
    finally:
        os.umask(old)


def test_pid_max_is_the_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        assert procfs.pid_max() == int(f.read())
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))  # a system without /proc
    monkeypatch.setattr(locktable, "PROC", str(tmp_path))
    assert procfs.pid_max() == 2**31 - 1
    assert procfs.uids(os.getpid()) is None and procfs.thread_group(os.getpid()) is None
    assert locktable.agreed_flocks({(1, 1)}) is None and procfs.cmdline("self") == ()


def test_a_descriptor_names_its_file(tmp_path: Path) -> None:
    path = tmp_path / "named"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        assert procfs.fd_path(fd) == str(path)
    finally:
        os.close(fd)
    assert procfs.fd_path(fd) is None


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
def test_the_sockets_bound_to_a_port_and_who_holds_them(protocol: str) -> None:
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        inode = os.fstat(sock.fileno()).st_ino
        if protocol == "tcp":
            # Bound but not listening: in none of the tables /proc shows.
            assert procfs.port_sockets(port, protocol) == []
            sock.listen()
        (row,) = procfs.port_sockets(port, protocol)
        assert (row.inode, row.uid, row.local) == (inode, os.geteuid(), f"127.0.0.1:{port}")
        assert row.state == (10 if protocol == "tcp" else 7)  # TCP_LISTEN; UDP unconnected
        assert procfs.socket_pids({inode}) == {inode: [os.getpid()]}


def test_a_ports_connections_and_their_holder() -> None:
    with socket.socket(socket.AF_INET6) as server:
        server.bind(("::1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("::1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                rows = procfs.port_sockets(port, "tcp")
                inodes = {os.fstat(s.fileno()).st_ino for s in (server, accepted)}
                # One process holding both: credited for each.
                assert procfs.socket_pids(inodes) == {i: [os.getpid()] for i in inodes}
            peer = f"[::1]:{client.getsockname()[1]}"
    assert sorted((row.state, row.local, row.remote) for row in rows) == [
        (1, f"[::1]:{port}", peer),  # ESTABLISHED, the accepted connection
        (10, f"[::1]:{port}", "[::]:0"),  # LISTEN
    ]


def test_a_socket_held_by_a_child_names_the_child() -> None:
    code = (
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    child = Child([sys.executable, "-c", code])
    try:
        port = int(child.expect())
        (row,) = procfs.port_sockets(port, "tcp")
        assert procfs.socket_pids({row.inode}) == {row.inode: [child.pid]}
    finally:
        child.close()
