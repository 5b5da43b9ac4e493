"""Port locks: one host-wide lock per port and protocol, taken before binding.

Ports belong to the host, so their locks live in one directory shared by
every user (see dirs.port_dir).  When the bind fails while pylock's lock is
held, the port is taken by a process outside pylock; it is named from the
kernel's socket tables (/proc/net/{tcp,tcp6,udp,udp6}: the socket's inode
and owner) and the processes' descriptors (/proc/PID/fd -> socket:[inode]).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any, NamedTuple

from .._core.errors import LockError
from .._core.procfs import bound_sockets, cmdline, socket_pids
from .._lock.lock import Lock
from .._lock.lock_at import LockAt
from .dirs import open_port_dir, port_dir

PROTOCOLS = ("tcp", "udp")


class Listener(NamedTuple):
    """A socket bound to a port, as the kernel lists it."""

    inode: int
    uid: int
    pids: tuple[int, ...]  # the processes with a descriptor on it that pylock may see

    def describe(self) -> str:
        user = user_name(self.uid)
        if not self.pids:
            return (
                f"a process of user {user} (uid {self.uid}; pylock may not see its "
                f"descriptors, socket inode {self.inode})"
            )
        return ", ".join(f"pid {pid} ({_program(pid)}, user {user})" for pid in self.pids)


class PortInUse(LockError, OSError):
    """The port lock was free but the bind failed: a process outside pylock has the port."""

    def __init__(self, port: int, protocol: str, listeners: list[Listener], cause: str) -> None:
        self.port = port
        self.protocol = protocol
        self.listeners = listeners
        who = (
            "; ".join(listener.describe() for listener in listeners)
            if listeners
            else "a process pylock cannot see (another network namespace?)"
        )
        message = (
            f"port {port}/{protocol} is in use ({cause}) by {who}, which does not take "
            "pylock's port lock: stop it or choose another port"
        )
        OSError.__init__(self, errno.EADDRINUSE, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_port_in_use, (self.port, self.protocol, self.listeners, self.strerror))


def _rebuild_port_in_use(
    port: int, protocol: str, listeners: list[Listener], message: str
) -> PortInUse:
    error = PortInUse.__new__(PortInUse)
    OSError.__init__(error, errno.EADDRINUSE, message)
    error.port, error.protocol, error.listeners = port, protocol, listeners
    return error


def _check(port: int, protocol: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"a port is an int from 1 to 65535, not {port!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be 'tcp' or 'udp', not {protocol!r}")


def port_lock_name(port: int, protocol: str = "tcp") -> str:
    _check(port, protocol)
    return f"{protocol}-{port}.lock"


def port_lock_path(port: int, protocol: str = "tcp") -> str:
    return os.path.join(port_dir(), port_lock_name(port, protocol))


def port_lock(
    port: int,
    *,
    protocol: str = "tcp",
    info: dict[str, Any] | None = None,
    blocking: bool = False,
    timeout: float | None = None,
) -> Lock:
    """Take the host-wide lock of port/protocol; returns the held Lock.

    Without waiting by default: LockHeld names the holder.  The record
    carries the port and protocol (plus info).  Lock files are created
    mode 0666 so every user can record itself as the holder, in the port
    directory that was checked, through its handle (see open_port_dir).
    """
    name = port_lock_name(port, protocol)
    directory, handle = open_port_dir()
    lock = LockAt(
        handle,
        name,
        path=directory,
        mode=0o666,
        info={**(info or {}), "port": port, "protocol": protocol},
    )
    try:
        lock.acquire(blocking=blocking, timeout=timeout)
    except BaseException:
        lock.close()
        raise
    return lock


class PortSocket(socket.socket):
    """A bound socket that holds its port lock until it is closed."""

    port_lock: Lock | None = None

    def close(self) -> None:
        super().close()
        held, self.port_lock = self.port_lock, None
        if held is not None:
            held.close()


def bind_port(
    port: int,
    host: str = "",
    *,
    protocol: str = "tcp",
    family: int | None = None,
    backlog: int | None = 128,
    info: dict[str, Any] | None = None,
) -> PortSocket:
    """Take the port lock, then bind (and for TCP listen); returns the socket.

    The socket holds the lock until it is closed.  LockHeld when another
    pylock user holds the port; PortInUse, naming the process, when the lock
    was free but the kernel refused the bind.
    """
    _check(port, protocol)
    if family is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    lock = port_lock(port, protocol=protocol, info=info)
    try:
        sock = PortSocket(family, kind)
    except BaseException:
        lock.close()
        raise
    sock.port_lock = lock
    try:
        if protocol == "tcp":
            _reuse_address(sock)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    port, protocol, listeners(port, protocol), str(exc.strerror)
                ) from None
            raise
        if protocol == "tcp" and backlog is not None:
            sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _reuse_address(sock: socket.socket) -> None:
    if sys.platform == "win32":
        # Windows' SO_REUSEADDR would let the bind steal a live port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
    else:
        # Lets a restarted server bind past its predecessor's TIME_WAIT
        # connections; a live listener still refuses the bind.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def listeners(port: int, protocol: str = "tcp") -> list[Listener]:
    """The sockets bound to port/protocol (TCP: listening) and the processes holding them."""
    _check(port, protocol)
    inodes = bound_sockets(port, protocol)
    pids = socket_pids(set(inodes)) if inodes else {}
    return [Listener(inode, uid, tuple(sorted(pids[inode]))) for inode, uid in inodes.items()]


def user_name(uid: int) -> str:
    import pwd  # POSIX only, and only needed to explain a failure

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _program(pid: int) -> str:
    """pid's command line, shortened to one readable line as holders are."""
    from .._lock.holder import Holder  # dataclasses: only to explain a failure

    return Holder(pid=pid, argv=cmdline(pid)).command() or "?"
