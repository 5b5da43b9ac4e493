"""Looking at a name in a place others can write, without side effects.

Opening a FIFO for reading releases a writer blocked in its open (which
then dies of SIGPIPE when the reader closes, or loses what it writes), and
opening some devices does something.  Looking therefore opens nothing but a
regular file: on Linux the name is taken with O_PATH (which opens nothing,
follows no symlink, and fixes the inode), its kind read from that
descriptor, and only a regular file is opened for reading, through
/proc/self/fd, so a name swapped for a FIFO in between is never opened.
Where O_PATH is missing (macOS) the name is lstat'ed first and opened with
O_NONBLOCK|O_NOFOLLOW, then checked to be the inode that was looked at; a
FIFO swapped in in that instant is opened and closed at once.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from . import procfs as _procfs
from .native import lib

_O_PATH = _procfs.O_PATH  # 0 where Linux's O_PATH does not exist
# Closing a file on FUSE or NFS waits for its server (a flush).  PyPy's
# os.close keeps the GIL meanwhile, which stops every thread of the program
# (an in-process FUSE server too, for good); the C core's close lets it go.
close_read = os.close if sys.implementation.name == "cpython" else lib.pl_close
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_NONBLOCK", 0)
)


class Peek:
    """One name looked at: the file's own stat (never a symlink's target)
    and, on Linux, an O_PATH descriptor that pins it.  close() when done."""

    def __init__(self, path: str, dir_fd: int | None = None) -> None:
        self.path = path
        self._dir_fd = dir_fd
        self.fd = -1
        if _O_PATH:
            self.fd = os.open(path, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                self.st = os.fstat(self.fd)
            except BaseException:
                self.close()
                raise
        else:
            self.st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> Peek:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def regular(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    def key(self) -> _procfs.LockKey:
        """The file as the kernel's lock tables name it (Linux)."""
        if self.fd >= 0:
            return _procfs.lock_key(self.fd, self.st)
        return _procfs.LockKey(self.st.st_dev, self.st.st_ino, None)

    def open_to_read(self) -> int:
        """A read-only descriptor of this very file, opened only if it is a
        regular file (EINVAL otherwise); the caller closes it (close_read)."""
        if not self.regular:
            raise OSError(errno.EINVAL, "not a regular file", self.path)
        fd = -1
        if self.fd >= 0:
            try:
                fd = os.open(f"/proc/self/fd/{self.fd}", _READ_FLAGS)
            except FileNotFoundError:
                fd = -1  # no /proc: by name, checked below
        if fd < 0:
            fd = os.open(self.path, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=self._dir_fd)
        try:
            now = os.fstat(fd)
        except BaseException:
            close_read(fd)
            raise
        if (now.st_dev, now.st_ino) != (self.st.st_dev, self.st.st_ino):
            close_read(fd)
            raise FileNotFoundError(errno.ENOENT, "replaced while looked at", self.path)
        return fd
