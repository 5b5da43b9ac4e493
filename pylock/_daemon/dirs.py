"""Where daemon locks live: the per-user runtime directory and the host-wide port directory.

Both are checked before use, because whoever controls a lock directory can
remove lock files and so split holders: the per-user directory must belong
to the user and be writable by nobody else; the shared port directory must
be a real directory that, if others may write to it, has the sticky bit (so
nobody removes another user's lock file).  The shared one is checked on a
handle that its lock files are then opened through, never by its name again.
"""

from __future__ import annotations

import errno
import os
import stat

from .._core.errors import SYMLINK, LockError
from .._core.native import lib, open_directory

ENV_RUNTIME = "PYLOCK_RUNTIME_DIR"
ENV_PORTS = "PYLOCK_PORT_DIR"
DEFAULT_PORT_DIR = "/tmp/pylock-ports"


class UnsafeDirectory(LockError):
    """A lock directory someone else could tamper with; pylock refuses to use it."""

    def __init__(self, path: str, why: str, advice: str) -> None:
        self.path = path
        super().__init__(f"refusing lock directory {path}: {why}; {advice}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (str(self), self.path))


def _rebuild(message: str, path: str) -> UnsafeDirectory:
    error = UnsafeDirectory.__new__(UnsafeDirectory)
    LockError.__init__(error, message)
    error.path = path
    return error


def _symlink_refused(path: str) -> UnsafeDirectory:
    return UnsafeDirectory(
        path,
        "it is a symbolic link (whoever made it chooses where the locks go)",
        "remove the link, or point the setting at the real directory",
    )


def open_dir(path: str, mode: int | None = None) -> tuple[int, os.stat_result | None]:
    """A handle on the directory at path (never through a link as the
    directory itself) and its fstat (None on Windows); the caller closes it.

    With mode, a missing directory is created: mkdir's mode passes through
    the umask, so the mode promised is then set on the directory just made,
    through this handle (by name, a link swapped in meanwhile would be
    followed).
    """
    made = False
    if mode is not None:
        try:
            os.mkdir(path, mode)
            made = True
        except FileExistsError:
            pass
    try:
        handle = open_directory(path)
    except OSError as exc:
        if exc.errno == SYMLINK:
            raise _symlink_refused(path) from None
        if exc.errno == errno.ENOTDIR:
            raise UnsafeDirectory(
                path, "it is not a directory", "remove it or choose another path"
            ) from None
        raise LockError(f"cannot use lock directory {path}: {exc.strerror}") from None
    if os.name == "nt":
        return handle, None
    try:
        st = os.fstat(handle)
        mine = made and st.st_uid == os.geteuid()
        if mine and mode is not None and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(handle, mode)
            st = os.fstat(handle)
    except BaseException:
        lib.pl_close(handle)
        raise
    return handle, st


def _lstat_dir(path: str) -> os.stat_result:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise LockError(f"cannot use lock directory {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_refused(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(path, "it is not a directory", "remove it or choose another path")
    return st


def check_private(path: str) -> str:
    """path if it is a directory of this user that no one else may write to."""
    st = _lstat_dir(path)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeDirectory(
            path,
            f"it belongs to uid {st.st_uid}, not to this user (uid {uid}), "
            "who could remove or replace its lock files",
            "remove it, or set PYLOCK_RUNTIME_DIR to a directory of your own",
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            path,
            f"it is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}), so "
            "other users could remove its lock files and run a second instance",
            f"chmod go-w {path}",
        )
    return path


def runtime_dir() -> str:
    """The per-user directory for singleton locks, created if missing.

    PYLOCK_RUNTIME_DIR if set, else $XDG_RUNTIME_DIR/pylock, else a private
    directory pylock-<uid> in the temporary directory.  Every choice is
    checked: owned by this user, not group- or world-writable.  On Windows:
    %LOCALAPPDATA%\\pylock.
    """
    chosen = os.environ.get(ENV_RUNTIME)
    if os.name == "nt":
        # The per-user profile is private to its user already.
        local = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~")
        path = os.path.abspath(chosen) if chosen else os.path.join(local, "pylock")
        os.makedirs(path, exist_ok=True)
        return path
    if chosen:
        path = os.path.abspath(chosen)
    else:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg and os.path.isabs(xdg):
            path = os.path.join(xdg, "pylock")
        else:
            import tempfile

            path = os.path.join(tempfile.gettempdir(), f"pylock-{os.geteuid()}")
    handle, _ = open_dir(path, 0o700)
    lib.pl_close(handle)
    return check_private(path)


def port_dir() -> str:
    """The host-wide directory of port locks, shared by every user (checked, as open_port_dir)."""
    path, handle = open_port_dir()
    lib.pl_close(handle)
    return path


def open_port_dir() -> tuple[str, int]:
    """The host-wide directory of port locks and a handle on it (the caller closes it).

    PYLOCK_PORT_DIR if set, else /tmp/pylock-ports.  Created with mode 1777
    (anyone may create a lock file, nobody may remove another user's).
    Refused when it is a symlink or writable by others without the sticky
    bit.  The checks are made on the handle, and lock files are to be opened
    through it (LockAt): whoever made the directory, or may write to one of
    its parents, can rename it and put a link or a directory of their own in
    its place, but not move where the checked handle leads.
    """
    chosen = os.environ.get(ENV_PORTS)
    if os.name == "nt":
        path = (
            os.path.abspath(chosen)
            if chosen
            else os.path.join(os.environ.get("PROGRAMDATA", r"C:\ProgramData"), "pylock", "ports")
        )
        os.makedirs(path, exist_ok=True)
        return path, open_dir(path)[0]
    path = os.path.abspath(chosen) if chosen else DEFAULT_PORT_DIR
    try:
        handle, st = open_dir(path, 0o1777)
    except OSError as exc:  # from mkdir (LockError is no OSError)
        raise LockError(
            f"cannot create the port lock directory {path}: {exc.strerror}; create it "
            f"once for every user (mkdir -m 1777 {path}) or set {ENV_PORTS}"
        ) from None
    assert st is not None
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        lib.pl_close(handle)
        raise UnsafeDirectory(
            path,
            f"others may write to it (mode {stat.S_IMODE(st.st_mode):04o}) but it lacks "
            "the sticky bit, so any user could remove a held port lock's file",
            f"chmod +t {path} (or recreate it with mode 1777)",
        )
    return path, handle
