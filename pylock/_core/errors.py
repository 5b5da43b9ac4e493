"""The errors of the lock file and its filesystem, and the base of every pylock error.

Every failure names the path and what to do.  The errors that name a holder
(LockHeld, LockTimeout) and those of the lock object's use (ReentrantAcquire,
NotHeld) belong to the lock itself: pylock._lock.errors.
"""

from __future__ import annotations

import errno
import os

from .display import display


class LockError(Exception):
    """Base class of every error pylock raises."""


class UnsafeFilesystem(LockError):
    """The lock file lives on a network filesystem where flock cannot be trusted."""

    def __init__(self, path: str, fs_name: str):
        self.path = path
        self.fs_name = fs_name
        super().__init__(
            f"{display(path)} is on {fs_name}, a network filesystem: flock there is emulated or "
            "local to one client, so two hosts can both 'hold' the lock. Put the lock "
            "file on a local filesystem (for example under /run or /tmp), or pass "
            "allow_network_fs=True if every user of this lock runs on this one host."
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (UnsafeFilesystem, (self.path, self.fs_name))


class LockFileError(LockError, OSError):
    """The lock file cannot be used at all; retrying or waiting will not help."""

    def __init__(self, code: int, path: str, advice: str = ""):
        # The C core's own codes become the errno an open would have given.
        real = {SYMLINK: errno.ELOOP, NOT_REGULAR: errno.EINVAL, PSEUDO_FS: errno.EINVAL}.get(
            code, code
        )
        OSError.__init__(self, real, _meaning(code), path)
        self.code = code
        self.advice = advice

    def __reduce__(self) -> tuple[object, ...]:
        return (LockFileError, (self.code, self.filename, self.advice))

    def __str__(self) -> str:
        # The path escaped: a name from a shared directory may carry escapes.
        text = f"cannot use {display(str(self.filename))} as a lock file: {self.strerror}"
        return f"{text}; {display(self.advice)}" if self.advice else text


_ADVICE = {
    errno.ENOENT: "the directory does not exist: create it first",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.EACCES: "permission denied: check the directory's and file's owner and mode",
    errno.EPERM: "operation not permitted: check the file's owner, mode and attributes",
    errno.EISDIR: "the path is a directory: name a file inside it",
    errno.EROFS: "the filesystem is read-only and the file does not exist",
    errno.ENAMETOOLONG: "the name is too long for this filesystem",
    errno.ENOSPC: "the filesystem is full (no space or no inodes): free some first",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.ELOOP: "too many symbolic links in the path",
}


def _meaning(code: int) -> str:
    if code == SYMLINK:
        return "the lock file is a symbolic link"
    if code == NOT_REGULAR:
        return "not a regular file (a FIFO, socket or device)"
    if code == PSEUDO_FS:
        return "a file of a kernel pseudo-filesystem"
    return os.strerror(code)


def advice_for(code: int, path: str = "") -> str:
    """What to do about code; for a missing directory, the directory path names."""
    if code == errno.ENOENT and path:
        directory = os.path.dirname(os.path.abspath(path))
        return f"the directory {directory} does not exist: create it first"
    if code == SYMLINK:
        return (
            "pylock never follows a symlink at the lock path (another user could point it "
            "at a file of yours); use the real path, or remove the link"
        )
    if code == NOT_REGULAR:
        return "a lock file must be a regular file"
    return _ADVICE.get(code, "")


# The C core's own codes (PL_E_SYMLINK, PL_E_NOTREG); checked against the
# compiled values in native.py at import.
SYMLINK = 10001
NOT_REGULAR = 10002
# pylock's own (no C code): the path is on proc, sysfs, cgroup...
PSEUDO_FS = 10101
