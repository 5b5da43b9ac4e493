"""Claiming a unix socket path: a live listener is refused, a dead socket file replaced.

A socket file outlives the daemon that bound it, so a restarted daemon finds
it in the way.  Removing it blindly would cut off a live instance; so the
path is first dialled: a listener that answers (or whose backlog is full) is
live and is named from the kernel's peer credentials; a refused connection
means a dead socket file, which is removed and bound again; anything that is
not a socket is never touched.

Between the check and the bind another claimer could do the same: claim
under the daemon's singleton lock, which makes the claimer the only one.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
import sys
from typing import NamedTuple

from .._core.errors import LockError

log = logging.getLogger("pylock")


class Peer(NamedTuple):
    """The process listening on a socket, from the kernel's peer credentials (0: unknown)."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        if self.pid <= 0:
            return "a live listener (its credentials are unavailable)"
        from .ports import _program, user_name

        return f"pid {self.pid} ({_program(self.pid)}, user {user_name(self.uid)})"


class SocketInUse(LockError, OSError):
    """The socket path is taken: a live listener, or a file that is not a socket."""

    def __init__(self, path: str, peer: Peer | None, why: str) -> None:
        self.peer = peer
        OSError.__init__(self, errno.EADDRINUSE, why, path)

    def __str__(self) -> str:
        return f"cannot claim unix socket {self.filename}: {self.strerror}"

    def __reduce__(self) -> tuple[object, ...]:
        return (SocketInUse, (self.filename, self.peer, self.strerror))


def _peer_credentials(sock: socket.socket) -> Peer:
    if sys.platform.startswith("linux"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return Peer(pid, uid, gid)
    if sys.platform == "darwin":
        sol_local, local_peerpid, local_peercred = 0, 0x002, 0x001
        pid = struct.unpack("i", sock.getsockopt(sol_local, local_peerpid, 4))[0]
        # struct xucred: u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]
        cred = sock.getsockopt(sol_local, local_peercred, 76)
        uid = struct.unpack_from("I", cred, 4)[0]
        return Peer(pid, uid, -1)
    return Peer(0, -1, -1)


def _probe(path: str) -> Peer | None:
    """The live listener at path, or None when the socket file is dead."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        probe = socket.socket(socket.AF_UNIX, kind)
        try:
            probe.setblocking(False)  # a full backlog must not make us wait
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                return None
            except BlockingIOError:
                return Peer(0, -1, -1)  # alive, its backlog is full
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:
                    continue  # a socket of another type: try that type
                raise SocketInUse(
                    path, None, f"cannot tell whether it is live ({exc.strerror}); not removed"
                ) from None
            return _peer_credentials(probe)
        finally:
            probe.close()
    raise SocketInUse(path, None, "a socket of unknown type; not removed")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a socket"


def claim_unix_socket(
    path: str | os.PathLike[str], *, backlog: int = 128, mode: int | None = None
) -> socket.socket:
    """Bind and listen on a unix stream socket at path, replacing only a dead socket file.

    SocketInUse names a live listener (pid, program, user from its peer
    credentials) or says what else is at the path (left untouched).
    mode=0o660 etc. is applied before listen(), so no client connects
    under the wrong permissions.  Call it while holding the daemon's
    singleton: two claimers racing on one dead file could remove each
    other's fresh socket.
    """
    path = os.path.abspath(os.fspath(path))
    if not hasattr(socket, "AF_UNIX"):
        raise LockError(f"cannot claim {path}: this platform's Python has no unix sockets")
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        before = None
    if before is not None:
        if not stat.S_ISSOCK(before.st_mode):
            raise SocketInUse(path, None, f"it is {_kind(before.st_mode)}; pylock leaves it intact")
        peer = _probe(path)
        if peer is not None:
            raise SocketInUse(path, peer, f"{peer.describe()} is listening on it")
        _remove_dead(path, before)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            peer = _probe(path)  # someone bound it since we looked
            raise SocketInUse(
                path, peer, f"{peer.describe() if peer else 'another claimer'} bound it first"
            ) from None
        if mode is not None:
            os.chmod(path, mode)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _remove_dead(path: str, seen: os.stat_result) -> None:
    """Unlink the dead socket file, only if the path still names that very file."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISSOCK(now.st_mode):
        raise SocketInUse(path, None, "it changed while pylock checked it; not removed")
    os.unlink(path)
    log.warning("pylock: removed the dead socket file %s (no listener answered)", path)
