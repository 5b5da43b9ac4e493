"""Lock-release hints for an event loop: one inotify descriptor per loop,
watching the lock files its tasks wait for (Linux; see csrc/hints.c).

A hint says only that a file's lock may have been released: a holder
closed the file or died, or a pylock holder unlocked it.  Each hint wakes
the tasks of the loop waiting on that file (pylock._lock.announced keeps
that to one per file and process: a second waiter in the same process
waits in a thread), which try the lock; their own flock decides.

The descriptor exists while tasks wait: the last one to leave closes it,
a turn of the loop later; one whose loop closed with a task still waiting
is closed when that task is collected, or by the next loop's first wait.
"""

from __future__ import annotations

import errno
import os

from .native import ffi, lib

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    import asyncio
    from typing import Any

# Hints read per turn of the loop, at most: more wait in the kernel's queue
# (past fs.inotify.max_queued_events it drops them and says so: overflow).
_BATCH = 4096


class Hint:
    """One task's wait for hints on one lock file."""

    __slots__ = ("_future", "file", "hinted")

    def __init__(self, file: FileHints) -> None:
        self.file = file
        # Set by a hint that came while the task was not awaiting one (it was
        # trying the lock, or asking who holds it): it tries again at once.
        self.hinted = False
        self._future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        self.hinted = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def next(self) -> asyncio.Future[None]:
        """A future the next hint completes (done already if one came)."""
        future = self._future = self.file.hints.loop.create_future()
        if self.hinted:
            future.set_result(None)
        return future

    def leave(self) -> None:
        self._future = None
        self.file.leave(self)


class FileHints:
    """The tasks of one loop waiting on one file (one inotify watch)."""

    __slots__ = ("facts", "hints", "waiting", "wd")

    def __init__(self, hints: LoopHints, wd: int) -> None:
        self.hints = hints
        self.wd = wd
        self.waiting: list[Hint] = []
        self.facts: Any = None  # what the lock module remembers of the file

    def wake_all(self) -> None:
        for hint in self.waiting:
            hint.wake()

    def leave(self, hint: Hint) -> None:
        if hint in self.waiting:
            self.waiting.remove(hint)
        if not self.waiting:
            self.hints.unwatch(self)


class LoopHints:
    """The inotify descriptor of one event loop and the files it watches."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop = loop
        self.fd = fd
        self.files: dict[int, FileHints] = {}
        self._wds = ffi.new("int[]", _BATCH)
        self._n = ffi.new("size_t *")
        self._overflow = ffi.new("int *")
        self._closing = False
        loop.add_reader(fd, self._read)

    def hint_for(self, handle: int) -> Hint | None:
        """A new waiter's hints on the file handle is open on; None when no
        watch can be had (ENOSPC)."""
        wd = ffi.new("int *")
        if lib.pl_hints_watch(self.fd, handle, wd):
            return None  # ENOSPC, ENOMEM, or /proc unusable: the thread is always right
        file = self.files.get(wd[0])
        if file is None:
            file = self.files[wd[0]] = FileHints(self, wd[0])
        hint = Hint(file)
        file.waiting.append(hint)
        return hint

    def unwatch(self, file: FileHints) -> None:
        if self.files.get(file.wd) is file:
            del self.files[file.wd]
            lib.pl_hints_unwatch(self.fd, file.wd)  # EINVAL: the kernel removed it first
        if not self.files and not self._closing:
            if self.loop.is_closed():  # a task of a closed loop, collected
                self.forget()
                return
            self._closing = True
            self.loop.call_soon(self._close_if_idle)

    def _close_if_idle(self) -> None:
        self._closing = False
        if self.files or _per_loop.get(self.loop) is not self:
            return
        self.loop.remove_reader(self.fd)
        self.forget()

    def _read(self) -> None:
        if lib.pl_hints_read(self.fd, self._wds, _BATCH, self._n, self._overflow):
            # The descriptor failed (it never should): every waiter tries and
            # watches its file again, on a new one.
            self.loop.remove_reader(self.fd)
            self.forget()
            return
        files = self.files
        for i in range(self._n[0]):
            wd = self._wds[i]
            if wd > 0:
                file = files.get(wd)
                if file is not None:
                    file.wake_all()
            else:
                # The watch is gone (its file deleted, or unmounted): wake all;
                # each tries and watches the file again.
                file = files.pop(-wd, None)
                if file is not None:
                    file.wd = 0
                    file.wake_all()
        if self._overflow[0]:
            for file in list(files.values()):
                file.wake_all()

    def forget(self) -> None:
        """Close the descriptor (once: the number may be the program's
        next); its waiters try again and watch anew."""
        if _per_loop.get(self.loop) is self:
            _per_loop.pop(self.loop, None)
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        files, self.files = self.files, {}
        for file in files.values():
            file.wd = 0
            if not self.loop.is_closed():  # whose futures can no longer be set
                file.wake_all()


# The hints of each running loop; a forked child starts with none (the
# descriptors it inherited are the parent's: reading them would steal its
# hints).
_per_loop: dict[asyncio.AbstractEventLoop, LoopHints] = {}
_unavailable: list[int] = []  # the errno of the first refusal: no hints in this process


def loop_hints(loop: asyncio.AbstractEventLoop) -> LoopHints | None:
    """The loop's hints, opened on first use; None where there are none (not
    Linux, inotify refused: too many instances, a seccomp policy)."""
    hints = _per_loop.get(loop)
    if hints is not None or _unavailable:
        return hints
    for closed in [h for other, h in list(_per_loop.items()) if other.is_closed()]:
        closed.forget()  # its loop closed with tasks still waiting: they never will
    out = ffi.new("pl_handle *")
    rc = lib.pl_hints_open(out)
    if rc:
        if rc in (errno.ENOSYS, errno.EPERM):
            _unavailable.append(rc)  # for good: every wait takes a thread
        return None  # EMFILE, ENFILE, ENOMEM: this wait takes a thread
    try:
        hints = LoopHints(loop, int(out[0]))
    except Exception:  # a loop without add_reader (Windows' proactor): threads
        os.close(int(out[0]))
        return None
    _per_loop[loop] = hints
    return hints


def _forget_in_child() -> None:
    for hints in _per_loop.values():
        fd, hints.fd, hints.files = hints.fd, -1, {}  # a late leave() closes nothing
        try:  # noqa: SIM105 (contextlib is not loaded at `import pylock`)
            os.close(fd)
        except OSError:
            pass
    _per_loop.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
