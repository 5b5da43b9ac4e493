"""Port locks: one host-wide lock per port and protocol, taken before binding.

Ports belong to the host, so their locks live in one directory shared by
every user (see dirs.open_port_dir).  When the bind fails while pylock's
lock is held, the port is taken by a socket outside pylock: PortInUse says
what holds it (listening, connected from that local port, bound but not
listening) and which process, from the kernel's tables (port_users).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any

from .._core.errors import LockError
from .._core.procfs import local_port_range
from .._lock.lock import Lock
from .._lock.lock_at import LockAt
from .dirs import open_port_dir, port_dir
from .port_users import PortUser, lists_bound_tcp, port_users

PROTOCOLS = ("tcp", "udp")
# What a PortInUse names; a busy server's accepted connections are counted.
_NAMED = 4

# Kept for code that imported it from here: a socket on a port, whatever its state.
Listener = PortUser


class PortInUse(LockError, OSError):
    """The port lock was free but the bind failed: a process outside pylock has the port."""

    def __init__(self, port: int, protocol: str, listeners: list[PortUser], cause: str) -> None:
        self.port = port
        self.protocol = protocol
        self.listeners = listeners  # every socket on the port, listeners first
        OSError.__init__(self, errno.EADDRINUSE, _in_use_message(port, protocol, listeners, cause))

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_port_in_use, (self.port, self.protocol, self.listeners, self.strerror))


def _rebuild_port_in_use(
    port: int, protocol: str, listeners: list[PortUser], message: str
) -> PortInUse:
    error = PortInUse.__new__(PortInUse)
    OSError.__init__(error, errno.EADDRINUSE, message)
    error.port, error.protocol, error.listeners = port, protocol, listeners
    return error


def _in_use_message(port: int, protocol: str, users: list[PortUser], cause: str) -> str:
    head = f"port {port}/{protocol} is in use ({cause})"
    if not users:
        if not sys.platform.startswith("linux"):
            return (
                f"{head} by a process pylock cannot identify on this platform: "
                "stop it or choose another port"
            )
        unseen = "a socket in another network namespace"
        if protocol == "tcp" and not lists_bound_tcp():
            unseen += (
                ", or a TCP socket only bound (neither listening nor connected), "
                "which Linux lists from 6.8 on"
            )
        return (
            f"{head}, but this network namespace's socket tables show no socket on it "
            f"({unseen}): stop it or choose another port"
        )
    listening = [user for user in users if user.kind == "listening"]
    shown = listening or users[:_NAMED]
    by_whom: dict[str, list[str]] = {}
    for user in shown:
        by_whom.setdefault(user.who(), []).append(user.what())
    named = "; ".join(f"{who}: {', '.join(whats)}" for who, whats in by_whom.items())
    if len(users) > len(shown):
        more = len(users) - len(shown)
        named += f" (and {more} more socket{'s' if more > 1 else ''} on the port)"
    advice = "stop it or choose another port"
    ephemeral = local_port_range()
    outgoing = not listening and any(user.kind == "connected" for user in users)
    if outgoing and ephemeral and port in ephemeral:
        advice += (
            f" (the kernel hands ports {ephemeral.start}-{ephemeral.stop - 1} to outgoing "
            "connections: a server port outside net.ipv4.ip_local_port_range avoids this)"
        )
    return f"{head} by {named}, which does not take pylock's port lock: {advice}"


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
        # ~SO_REUSEADDR is winsock's own definition, for a socket module without it.
        exclusive = getattr(socket, "SO_EXCLUSIVEADDRUSE", ~socket.SO_REUSEADDR)
        sock.setsockopt(socket.SOL_SOCKET, exclusive, 1)
    else:
        # Lets a restarted server bind past its predecessor's TIME_WAIT
        # connections; a live listener still refuses the bind.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def listeners(port: int, protocol: str = "tcp") -> list[PortUser]:
    """Every socket whose local port is port/protocol (listening, bound,
    connected), listeners first, with the processes holding them."""
    _check(port, protocol)
    return port_users(port, protocol)
