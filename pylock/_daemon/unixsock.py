"""Claiming a unix socket path: a live listener is refused, a dead socket file replaced.

A socket file outlives the daemon that bound it, so a restarted daemon finds
it in the way.  Removing it blindly would cut off a live instance; so the
path is first dialled: a listener that answers (or whose backlog is full) is
live and is named from the kernel's peer credentials; a refused connection
means a dead socket file, which is removed and bound again; anything that is
not a socket is never touched.

Sockets often live in directories other users may write to (/tmp, a
group's runtime directory), and whoever may rename the socket's directory,
a parent, or the entries in it can swap names between any check and the
step that relies on it.  So the directory is opened once and every step
(look, dial, remove, bind) names the socket relative to that handle; the
mode is given to the socket file as the bind creates it (never a chmod by
name, which would follow a link put in its place); and a dead socket is
removed only if the name still leads to the socket that was dialled.

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
from typing import Any, NamedTuple

from .._core.errors import SYMLINK, LockError
from .._core.native import lib, open_directory
from .dirs import UnsafeDirectory

log = logging.getLogger("pylock")


class Peer(NamedTuple):
    """The process listening on a socket, from the kernel's peer credentials (0: unknown)."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        if self.pid <= 0:
            return "a live listener (its credentials are unavailable)"
        from .port_users import program, user_name

        return f"pid {self.pid} ({program(self.pid)}, user {user_name(self.uid)})"


class SocketInUse(LockError, OSError):
    """The socket path is taken: a live listener, or a file that is not a socket."""

    def __init__(self, path: str, peer: Peer | None, why: str) -> None:
        self.peer = peer
        OSError.__init__(self, errno.EADDRINUSE, why, path)

    def __str__(self) -> str:
        return f"cannot claim unix socket {self.filename}: {self.strerror}"

    def __reduce__(self) -> tuple[object, ...]:
        return (SocketInUse, (self.filename, self.peer, self.strerror))


class UnixListener(socket.socket):
    """The listening socket claim_unix_socket returns.

    On Linux it is bound by its bare name relative to its directory (see
    the module's docstring), so the kernel knows it by that name (a client's
    getpeername(), ss -x); getsockname() gives the full path it was claimed
    at, so code that logs it or removes the file at exit keeps working.
    """

    path: str | None = None

    def getsockname(self) -> Any:
        return self.path if self.path is not None else super().getsockname()


# PyPy's socket has no SO_PEERCRED: Linux's value then, 21 on powerpc and
# 17 on PyPy's other architectures (asm-generic/socket.h).
_SO_PEERCRED: int = (
    getattr(socket, "SO_PEERCRED", 21 if os.uname().machine.startswith("ppc") else 17)
    if sys.platform.startswith("linux")
    else 0
)


def _peer_credentials(sock: socket.socket) -> Peer:
    if sys.platform.startswith("linux"):
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i"))
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


# Whether this process's threads can have a working directory of their own
# (pl_unix_at); None until the first claim asks.
_per_thread_cwd: bool | None = None


class _Place:
    """The socket's name in its directory, opened once: every step starts there."""

    def __init__(self, path: str) -> None:
        self.path = path
        directory, self.name = os.path.split(path)
        self.dir = _open_socket_dir(directory)
        self.dir_st = os.fstat(self.dir)

    def close(self) -> None:
        lib.pl_close(self.dir)

    def lstat(self) -> os.stat_result | None:
        try:
            return os.stat(self.name, dir_fd=self.dir, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def unlink(self) -> None:
        os.unlink(self.name, dir_fd=self.dir)

    def _at(self, sock: socket.socket, op: int, mode: int) -> int | None:
        """pl_unix_at's errno, or None where threads cannot have their own
        working directory (then the caller goes by path)."""
        global _per_thread_cwd
        if _per_thread_cwd is False:
            return None
        rc = int(lib.pl_unix_at(self.dir, os.fsencode(self.name), sock.fileno(), op, mode))
        if rc == errno.ENOSYS:
            _per_thread_cwd = False
            return None
        _per_thread_cwd = True
        return rc

    def connect(self, sock: socket.socket) -> None:
        rc = self._at(sock, lib.PL_UNIX_CONNECT, -1)
        if rc is None:
            sock.connect(self.path)
        elif rc:
            raise OSError(rc, os.strerror(rc), self.path)

    def bind(self, sock: socket.socket, mode: int | None) -> None:
        rc = self._at(sock, lib.PL_UNIX_BIND, -1 if mode is None else mode)
        if rc is None:
            self._bind_by_path(sock, mode)
        elif rc:
            raise OSError(rc, os.strerror(rc), self.path)

    def _bind_by_path(self, sock: socket.socket, mode: int | None) -> None:
        """Where a thread cannot have its own working directory (macOS,
        containers refusing unshare): bind by path, then make sure the socket
        came to be in the opened directory, and set the mode by name only
        where nobody else may replace the name."""
        if mode is not None and not _only_we_rename(self.dir_st):
            raise LockError(
                f"cannot claim unix socket {self.path} with mode {mode:#o}: other users "
                f"may rename entries of its directory (mode "
                f"{stat.S_IMODE(self.dir_st.st_mode):04o}, owner uid {self.dir_st.st_uid}), "
                "so its mode could only be set through a name they control, and this "
                "system cannot create it with that mode: use a directory only you (or "
                "root) may write to, or one with the sticky bit"
            )
        sock.bind(self.path)
        st = self.lstat()
        if st is None or not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise SocketInUse(
                self.path, None, "its directory was replaced while binding; not bound there"
            )
        if mode is not None:
            os.chmod(self.name, mode, dir_fd=self.dir)


def _only_we_rename(st: os.stat_result) -> bool:
    """Whether nobody but this user and root may rename entries of the directory."""
    if st.st_uid not in (0, os.geteuid()):
        return False
    return not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX)


def _open_socket_dir(directory: str) -> int:
    """A handle on the socket's directory, never through a link as the
    directory itself unless root or this user made the link (/var/run,
    macOS's /tmp): another user's link chooses where the socket goes."""
    for _ in range(8):
        try:
            return open_directory(directory)
        except OSError as exc:
            if exc.errno != SYMLINK:
                raise OSError(exc.errno, exc.strerror, directory) from None
        link = os.lstat(directory)
        target = os.readlink(directory)
        again = os.lstat(directory)  # the same link (a link's target never changes)
        if link.st_uid not in (0, os.geteuid()) or (link.st_dev, link.st_ino) != (
            again.st_dev,
            again.st_ino,
        ):
            raise UnsafeDirectory(
                directory,
                f"it is a symbolic link of uid {link.st_uid}, who chooses where the socket goes",
                "name the real directory, or remove the link",
            )
        directory = os.path.normpath(os.path.join(os.path.dirname(directory), target))
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), directory)


def _probe(place: _Place) -> Peer | None:
    """The live listener at the name, or None when the socket file is dead."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        probe = socket.socket(socket.AF_UNIX, kind)
        try:
            probe.setblocking(False)  # a full backlog must not make us wait
            try:
                place.connect(probe)
            except ConnectionRefusedError:
                return None
            except BlockingIOError:
                return Peer(0, -1, -1)  # alive, its backlog is full
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:
                    continue  # a socket of another type: try that type
                raise SocketInUse(
                    place.path,
                    None,
                    f"cannot tell whether it is live ({exc.strerror}); not removed",
                ) from None
            return _peer_credentials(probe)
        finally:
            probe.close()
    raise SocketInUse(place.path, None, "a socket of unknown type; not removed")


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
) -> UnixListener:
    """Bind and listen on a unix stream socket at path, replacing only a dead socket file.

    SocketInUse names a live listener (pid, program, user from its peer
    credentials) or says what else is at the path (left untouched).
    mode=0o660 etc. is the socket file's mode from its creation, so no
    client connects under the wrong permissions.  Every step names the
    socket relative to its directory, opened once (see the module's
    docstring and UnixListener).  Call it while holding the daemon's
    singleton: two claimers racing on one dead file could remove each
    other's fresh socket.
    """
    path = os.path.abspath(os.fspath(path))
    if not hasattr(socket, "AF_UNIX"):
        raise LockError(f"cannot claim {path}: this platform's Python has no unix sockets")
    if mode is not None and (
        isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777
    ):
        raise ValueError(f"mode must be permission bits from 0o000 to 0o777, not {mode!r}")
    place = _Place(path)
    try:
        return _claim(place, backlog, mode)
    finally:
        place.close()


def _claim(place: _Place, backlog: int, mode: int | None) -> UnixListener:
    before = place.lstat()
    if before is not None:
        if not stat.S_ISSOCK(before.st_mode):
            raise SocketInUse(
                place.path, None, f"it is {_kind(before.st_mode)}; pylock leaves it intact"
            )
        peer = _probe(place)
        if peer is not None:
            raise SocketInUse(place.path, peer, f"{peer.describe()} is listening on it")
        _remove_dead(place, before)
    sock = UnixListener(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            place.bind(sock, mode)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            peer = _probe(place)  # someone bound it since we looked
            raise SocketInUse(
                place.path, peer, f"{peer.describe() if peer else 'another claimer'} bound it first"
            ) from None
        sock.path = place.path
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _remove_dead(place: _Place, seen: os.stat_result) -> None:
    """Unlink the dead socket file, only if its name still leads to that very file.

    Whoever could still swap the name between this last look and the unlink
    may write to the socket's directory, and could remove that entry
    themselves: the unlink never reaches outside the opened directory.
    """
    now = place.lstat()
    if now is None:
        return
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISSOCK(now.st_mode):
        raise SocketInUse(place.path, None, "it changed while pylock checked it; not removed")
    place.unlink()
    log.warning("pylock: removed the dead socket file %s (no listener answered)", place.path)
