"""The one door to the C core (pylock._native): its ffi and lib, and its
errno results turned into pylock errors in one place.

No other module of pylock imports the compiled module; the hot paths take
lib's functions from here directly, so no wrapper frame is added.
"""

from __future__ import annotations

import errno
import os
import time

from .._native import ffi, lib
from .errors import NOT_REGULAR, SYMLINK, LockFileError, advice_for

TYPE_CHECKING = False  # typing is not imported at run time (start-up: bench/README.md)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["check", "fail", "ffi", "lib", "open_directory", "open_lock_file", "open_lock_file_at"]

if (lib.PL_E_SYMLINK, lib.PL_E_NOTREG) != (SYMLINK, NOT_REGULAR):
    raise ImportError("pylock._native does not match this pylock package: reinstall pylock")

_PERMANENT = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.EROFS,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.ENOSPC,
    errno.EDQUOT,
    SYMLINK,
    NOT_REGULAR,
}


def fail(code: int, path: str) -> NoReturn:
    if code in _PERMANENT:
        raise LockFileError(code, path, advice_for(code, path))
    raise OSError(code, os.strerror(code), path)


def check(code: int, path: str) -> None:
    if code:
        fail(code, path)


def open_lock_file(path: str, flags: int, mode: int = -1) -> int:
    """A handle on the lock file at path; raises LockFileError for permanent errors."""
    if "\0" in path:
        raise LockFileError(errno.EINVAL, path.replace("\0", "\\0"), "the path contains a NUL byte")
    out = ffi.new("pl_handle *")
    created = ffi.new("int *")
    encoded = os.fsencode(path)
    rc = lib.pl_open(encoded, flags, mode, out, created)
    # Windows only: a file unlinked by release(unlink=True) stays "delete
    # pending" until its last handle closes, which the releasing holder does
    # right after unlocking; nothing signals that moment, so retry briefly.
    for _ in range(_DELETE_PENDING_RETRIES):
        if rc != errno.EAGAIN:
            break
        time.sleep(0.001)
        rc = lib.pl_open(encoded, flags, mode, out, created)
    check(rc, path)
    return int(out[0])


def open_lock_file_at(directory: int, name: str, path: str, flags: int, mode: int = -1) -> int:
    """A handle on the lock file name in the directory handle (open_directory),
    looked up there and nowhere else; errors name path."""
    if "\0" in name:
        raise LockFileError(errno.EINVAL, path.replace("\0", "\\0"), "the name contains a NUL byte")
    out = ffi.new("pl_handle *")
    created = ffi.new("int *")
    encoded = os.fsencode(name)
    rc = lib.pl_open_at(directory, encoded, flags, mode, out, created)
    for _ in range(_DELETE_PENDING_RETRIES):  # Windows only, as in open_lock_file
        if rc != errno.EAGAIN:
            break
        time.sleep(0.001)
        rc = lib.pl_open_at(directory, encoded, flags, mode, out, created)
    check(rc, path)
    return int(out[0])


def open_directory(path: str) -> int:
    """A handle on the directory at path, never through a symbolic link (or
    junction) as the directory itself; OSError (errno SYMLINK for a link)."""
    if "\0" in path:
        raise LockFileError(errno.EINVAL, path.replace("\0", "\\0"), "the path contains a NUL byte")
    out = ffi.new("pl_handle *")
    rc = lib.pl_open_dir(os.fsencode(path), out)
    if rc:
        raise OSError(rc, "a symbolic link" if rc == SYMLINK else os.strerror(rc), path)
    return int(out[0])


_DELETE_PENDING_RETRIES = 2000
