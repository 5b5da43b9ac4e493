"""pylock run, taking the lock: pylock.Lock for regular files, record-less for the rest.

Regular files go through pylock.Lock (created 0666 less the umask, as
flock(1) creates them); directories, devices, FIFOs, files holding someone
else's bytes and inherited descriptors are locked with flock(2) on a
read-only descriptor, without a record.  A conflict names the holder.
"""

from __future__ import annotations

import errno
import os

from .exits import EX_CANTCREAT, EX_DATAERR, EX_NOINPUT, EX_OSERR, Exit, path_problem, say
from .invocation import SHARED, UNLOCK

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from .._lock.lock import Lock
    from .invocation import Invocation


def lock_path(call: Invocation, path: str) -> tuple[int, Any]:
    """Open and lock the file at path; returns its descriptor and what keeps it open.

    Every message names the path absolute, as pylock.Lock and `pylock who` do."""
    from .._core.errors import NOT_REGULAR, LockFileError, UnsafeFilesystem
    from .._lock.errors import LockHeld, LockTimeout
    from .._lock.record import MAGIC

    path = os.path.abspath(path)
    head = _head(path)
    if call.mode == UNLOCK or (head and head != MAGIC):
        # -u only unlocks; a file with someone else's bytes (a script that
        # locks itself, a data file) is locked as it is, never written.
        fd = _open_or_exit(path, create=True)
        lock_fd(call, fd, path)
        return fd, None
    try:
        lock = _acquire(call, path, head is not None)
    except LockHeld as held:
        _conflict(call, str(held), timed_out=isinstance(held, LockTimeout))
    except LockFileError as exc:
        if exc.code not in (errno.EISDIR, NOT_REGULAR):
            _open_failed(path, exc)
        # A directory or a device: locked as flock(1) does, without a record.
        fd = _open_or_exit(path, create=False)
        lock_fd(call, fd, path)
        return fd, None
    except UnsafeFilesystem as exc:
        say(str(exc))
        raise Exit(EX_NOINPUT) from None
    except OSError as exc:
        say(path_problem(path, exc))
        raise Exit(EX_OSERR if exc.errno in (errno.ENOLCK, errno.ENOMEM) else EX_DATAERR) from None
    return lock.fileno(), lock


def _acquire(call: Invocation, path: str, exists: bool) -> Lock:
    """The pylock.Lock on path, held as the command line asks (closed if not held)."""
    from .._lock.lock import Lock

    mode = 0o666 & ~_umask()
    info = call.opts["info"]
    record = info is not None or not exists or _may_write(path)
    lock = Lock(path, shared=call.mode == SHARED, mode=mode, info=info, record=record)
    try:
        if call.takeover is not None:
            from .._daemon.singleton import take_over

            take_over(lock, call.takeover)
        elif call.nonblock:
            lock.acquire(blocking=False)
        elif _status_line(call):
            with _status(path, lambda: _holder_text(lock.holder())):
                lock.acquire(timeout=call.timeout)
        else:
            lock.acquire(timeout=call.timeout)
    except BaseException:
        lock.close()
        raise
    return lock


def _head(path: str) -> bytes | None:
    """The first bytes of the regular file at path (as many as a record's
    magic), or None: missing, a symlink, not a regular file, unreadable
    (Lock decides and explains).  Only a regular file is opened to look."""
    from .._core.peek import Peek
    from .._lock.record import MAGIC

    try:
        with Peek(path) as look:
            fd = look.open_to_read()
    except OSError:
        return None
    try:
        return os.read(fd, len(MAGIC))
    except OSError:
        return None
    finally:
        os.close(fd)


def _may_write(path: str) -> bool:
    """Whether this process may write the file at path.

    A file it may only read (another user's, on a read-only filesystem) is
    locked as flock(1) locks it, silently and without a record.  A record
    that cannot be written for any other reason (a full disk) is said in
    one line, "pylock: holding ...": Lock's warning reaches stderr through
    logging's last-resort handler (the command configures no logging: its
    import would cost start-up time).
    """
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK, effective_ids=effective)


def lock_fd(call: Invocation, fd: int, name: str, label: str = "") -> None:
    """Lock fd; errors name it as flock(1) does (name), conflicts say what it is (label)."""
    from .fdlock import Conflict, lock_descriptor, unlock_descriptor

    try:
        if call.mode == UNLOCK:
            unlock_descriptor(fd)
        elif _status_line(call) and not call.nonblock:
            with _status(label or name, lambda: _fd_holder_text(fd)):
                lock_descriptor(fd, call.mode == SHARED, True, call.timeout)
        else:
            lock_descriptor(fd, call.mode == SHARED, not call.nonblock, call.timeout)
    except Conflict as conflict:
        message = ""
        if not call.quiet:
            who = _fd_holder_text(fd)
            if conflict.timed_out:
                what = label or name
                message = f"timed out after {call.timeout:g} s waiting for {what}: held by {who}"
            else:
                message = f"{label or name} is held by {who}"
        _conflict(call, message, conflict.timed_out)
    except OSError as exc:
        say(f"{name}: {exc.strerror}")
        raise Exit(EX_OSERR if exc.errno in (errno.ENOLCK, errno.ENOMEM) else EX_DATAERR) from None


def _conflict(call: Invocation, message: str, timed_out: bool) -> NoReturn:
    if call.verbose:
        say("timeout while waiting to get lock" if timed_out else "failed to get lock")
    if not call.quiet and message:
        say(message)
    raise Exit(call.conflict_exit)


def _open_or_exit(path: str, create: bool) -> int:
    """A read-only descriptor for a record-less lock on path (created with -u, as flock(1))."""
    from .fdlock import open_existing

    try:
        fd = -1
        if create:
            # O_NONBLOCK: a FIFO at the path must not hang the open.
            flags = os.O_RDONLY | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(path, flags | os.O_CREAT, 0o666)
                os.set_blocking(fd, True)  # the command shares this open file description
            except (IsADirectoryError, FileExistsError):
                pass
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
        if fd < 0:
            fd = open_existing(path)
    except OSError as exc:
        _open_failed(path, exc)
    _refuse_network_filesystem(path, fd)
    return fd


def _refuse_network_filesystem(path: str, fd: int) -> None:
    """As pylock.Lock refuses them: flock there is emulated or local to one client."""
    from .._core.errors import UnsafeFilesystem
    from .._core.fs import refuse_unfit_filesystem

    try:
        refuse_unfit_filesystem(fd, path, pseudo=False)
    except UnsafeFilesystem as exc:
        os.close(fd)
        say(str(exc))
        raise Exit(EX_NOINPUT) from None


def _open_failed(path: str, exc: OSError) -> NoReturn:

    say(path_problem(path, exc))
    code = exc.errno
    if code in (errno.ENOMEM, errno.EMFILE, errno.ENFILE):
        raise Exit(EX_OSERR)
    if code in (errno.EROFS, errno.ENOSPC):
        raise Exit(EX_CANTCREAT)
    raise Exit(EX_NOINPUT)


def _umask() -> int:
    from .._core.procfs import own_umask

    mask = own_umask()
    if mask is None:
        mask = os.umask(0o022)  # one thread here: reading it by setting it is safe
        os.umask(mask)
    return mask


def _status_line(call: Invocation) -> bool:
    return not call.quiet and os.isatty(2)


def _status(what: str, holder: Any) -> Any:
    from .._core.display import display
    from .status import StatusLine

    return StatusLine(display(what), holder)


def _holder_text(holder: Any) -> str:
    from .._lock.errors import describe_holder

    return describe_holder(holder) if holder is not None else "nobody (about to be granted)"


def _fd_holder_text(fd: int) -> str:
    from .fdlock import kernel_holders

    found = kernel_holders(fd)
    if not found:
        return "a process pylock cannot see (another user's, or in another pid namespace)"
    text = found[0].describe()
    return text if len(found) == 1 else f"{text} and {len(found) - 1} more"
