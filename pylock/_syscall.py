"""Calls into the C core, with its errno results turned into pylock errors."""

from __future__ import annotations

import errno
import os
from typing import NoReturn

from ._errors import NOT_REGULAR, SYMLINK, LockFileError, advice_for
from ._native import ffi, lib

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
        raise LockFileError(code, path, advice_for(code))
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
    check(lib.pl_open(os.fsencode(path), flags, mode, out, created), path)
    return int(out[0])
