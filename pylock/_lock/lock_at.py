"""LockAt: a Lock on a file named in an open directory, for directories others share.

A Lock finds its file by path, and a path is looked up again at every open
and at every acquisition's check that the file is still there.  In a
directory other users share (the host-wide port locks), whoever may rename
the directory or one of its parents can swap it, between the program's check
of the directory and the open, for a link or a directory of their choosing,
and the lock file (mode 0666, with its record) is then created there, by
root if the program is root.  A LockAt keeps a handle on the directory the
program checked and finds its file by name in it: the open, the reopen after
an unlink, and the C core's check at each acquisition (the same one lookup a
Lock makes, from the handle instead of the working directory) all start from
that handle, so the uncontended path costs what a Lock's does.
"""

from __future__ import annotations

import os

from .._core.errors import LockError
from .._core.native import check, ffi, lib, open_lock_file_at
from .lock import Lock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class LockAt(Lock):
    """A Lock on the file name in the directory handle directory.

    directory comes from pylock._core.native.open_directory and belongs to
    this object from now on: it is closed when the object is collected (not
    at close(): a closed Lock may be acquired again, and an abandoned wait
    may still reopen the file).  path is the directory's path, for messages
    and holder lookups only.
    """

    _dir = -1  # for __del__ of an object whose __init__ refused its arguments

    def __init__(
        self,
        directory: int,
        name: str,
        *,
        path: str,
        shared: bool = False,
        mode: int | None = None,
        info: dict[str, Any] | None = None,
        allow_network_fs: bool = False,
        record: bool = True,
    ) -> None:
        try:
            if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
                raise ValueError(f"a lock file's name is one path component, not {name!r}")
            super().__init__(
                os.path.join(path, name),
                shared=shared,
                mode=mode,
                info=info,
                allow_network_fs=allow_network_fs,
                record=record,
            )
            st = ffi.new("pl_file_info *")
            check(lib.pl_file_stat(directory, st), path)
        except BaseException:
            lib.pl_close(directory)
            raise
        self._dir = directory
        self._dir_key = (st.dev, st.ino)
        self._name = name
        self._name_c = ffi.new("char[]", os.fsencode(name))
        self._lf.name = self._name_c
        self._lf.dir = directory

    def _open_file(self, flags: int, mode: int = -1) -> int:
        # The number is pylock's for this object's life; a program that
        # closed it behind pylock's back may have reused it for a directory
        # of its own, where no lock file may go.
        st = ffi.new("pl_file_info *")
        if lib.pl_file_stat(self._dir, st) != 0 or (st.dev, st.ino) != self._dir_key:
            raise LockError(
                f"{self.path}: the descriptor pylock kept on its directory no longer names "
                "that directory (closed by the program?): create the lock again"
            )
        return open_lock_file_at(self._dir, self._name, self.path, flags, mode)

    def _unlink_file(self) -> None:
        if os.name == "nt":  # no unlink relative to a directory handle there
            raise LockError(
                f"{self.path}: release(unlink=True) is not available for a lock in a "
                "shared directory on Windows; the lock is still held: release() it"
            )
        os.unlink(self._name, dir_fd=self._dir)

    def __del__(self) -> None:
        super().__del__()
        if self._dir >= 0:
            lib.pl_close(self._dir)
            self._dir = -1
