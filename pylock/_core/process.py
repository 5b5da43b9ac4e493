"""Process identity: which process a pid names, and whether it still runs.

A pid alone is a number the kernel recycles.  An identity adds what tells
two processes with the same pid apart: the start time, the boot, and on
Linux 6.9+ the pidfs inode, which is unique for the whole boot.
"""

from __future__ import annotations

import errno
import os
import sys
from _thread import allocate_lock

from .native import ffi, lib

# Imported by every first acquisition (the holder record names this
# process), so by every `pylock run`: typing, threading and dataclasses
# (which pulls in inspect) would add to its start-up (bench/README.md).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_LINUX = sys.platform.startswith("linux")

# pidfd_open and friends refused by the kernel or a seccomp policy: the
# pinning mechanism does not exist here, the fallback takes over.
UNAVAILABLE = frozenset({errno.ENOSYS, errno.EPERM, errno.EACCES})


class ProcessIdentity:
    """One process: pid plus what tells it apart from a later owner of the pid.

    start_time is in the platform's unit (Linux: clock ticks since boot);
    pidfs_ino is 0 where the kernel has no pidfs.  An immutable value: equal
    and hashable by its fields.
    """

    __slots__ = ("boot_id", "pid", "pidfs_ino", "start_time")
    pid: int
    start_time: int
    boot_id: str
    pidfs_ino: int

    def __init__(self, pid: int, start_time: int, boot_id: str, pidfs_ino: int = 0) -> None:
        set_field = object.__setattr__
        set_field(self, "pid", pid)
        set_field(self, "start_time", start_time)
        set_field(self, "boot_id", boot_id)
        set_field(self, "pidfs_ino", pidfs_ino)

    def _fields(self) -> tuple[int, int, str, int]:
        return (self.pid, self.start_time, self.boot_id, self.pidfs_ino)

    def replace(
        self,
        *,
        pid: int | None = None,
        start_time: int | None = None,
        boot_id: str | None = None,
        pidfs_ino: int | None = None,
    ) -> ProcessIdentity:
        """A copy with the given fields changed."""
        return ProcessIdentity(
            self.pid if pid is None else pid,
            self.start_time if start_time is None else start_time,
            self.boot_id if boot_id is None else boot_id,
            self.pidfs_ino if pidfs_ino is None else pidfs_ino,
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ProcessIdentity is immutable: cannot assign {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ProcessIdentity is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessIdentity):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        pid, start_time, boot_id, pidfs_ino = self._fields()
        return (
            f"ProcessIdentity(pid={pid!r}, start_time={start_time!r}, "
            f"boot_id={boot_id!r}, pidfs_ino={pidfs_ino!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (ProcessIdentity, self._fields())


def same_process(a: ProcessIdentity, b: ProcessIdentity) -> bool:
    """Whether two identities name the same process.

    The pidfs inode is exact when both have one; otherwise pid, start time
    and boot make a collision very unlikely (the start time has a 10 ms
    granularity on Linux).  An empty boot_id (an old record) matches any.
    """
    if a.pid != b.pid:
        return False
    if a.boot_id and b.boot_id and a.boot_id != b.boot_id:
        return False
    if a.pidfs_ino and b.pidfs_ino:
        return a.pidfs_ino == b.pidfs_ino
    return a.start_time == b.start_time


def check_pid(pid: Any) -> int:
    """pid as an int, or ValueError naming why it cannot be a process id."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"a process id must be an int, not {type(pid).__name__}")
    if pid <= 0:
        raise ValueError(f"{pid} is not a process id: process ids are positive")
    from .procfs import pid_max

    limit = pid_max()
    if pid > limit:
        raise ValueError(f"{pid} is not a process id: this system's pid_max is {limit}")
    return pid


def refuse_thread_id(pid: int) -> None:
    """ValueError when pid is the id of a thread (not the main one) of some process.

    Linux gives threads ids from the same space as processes, and /proc
    answers for them, so a thread id taken for a pid would otherwise read
    as a process that is gone (pidfd_open refuses it) or as its process.
    """
    if not _LINUX:
        return
    from .procfs import thread_group

    owner = thread_group(pid)
    if owner is None or owner == pid:
        return
    whose = "this process" if owner == os.getpid() else f"process {owner}"
    raise ValueError(
        f"{pid} is the id of a thread of {whose}, not a process id: "
        f"pylock watches processes; pass {owner} to wait for the process that thread runs in"
    )


def _identity(raw: Any) -> ProcessIdentity:
    return ProcessIdentity(
        pid=int(raw.pid),
        start_time=int(raw.start_time),
        boot_id=ffi.string(raw.boot_id).decode("ascii", "replace"),
        pidfs_ino=int(raw.pidfs_ino),
    )


def identity_of(pid: int) -> ProcessIdentity | None:
    """The identity of the live process with this pid now, or None.

    None also for a zombie (it has exited) and for a pid that cannot exist.
    Alone this is racy; pinning (pin_process) makes it exact.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or pid >= 2**31:
        return None
    out = ffi.new("pl_identity *")
    rc = lib.pl_identity_of(pid, out)
    if rc == 0:
        return _identity(out)
    if rc in (errno.ESRCH, errno.EINVAL):
        return None
    raise OSError(rc, f"cannot read the identity of pid {pid}: {os.strerror(rc)}")


_self_lock = allocate_lock()
_self: ProcessIdentity | None = None


def self_identity() -> ProcessIdentity:
    """The calling process's identity (cached; a forked child gets its own)."""
    global _self
    with _self_lock:
        if _self is None or _self.pid != os.getpid():
            me = identity_of(os.getpid())
            if me is None:
                raise OSError(errno.ESRCH, "cannot read this process's own identity")
            _self = me
        return _self


def _forget_self() -> None:
    global _self, _self_lock
    _self = None
    _self_lock = allocate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_self)


class Pinned:
    """A process handle that keeps the pid from being recycled while open."""

    __slots__ = ("handle", "pid")

    def __init__(self, pid: int, handle: int) -> None:
        self.pid = pid
        self.handle = handle

    def identity(self) -> ProcessIdentity | None:
        """Identity of the pinned process; None once it has been reaped."""
        out = ffi.new("pl_identity *")
        rc = lib.pl_proc_identity(self.handle, self.pid, out)
        if rc == 0:
            return _identity(out)
        if rc == errno.ESRCH:
            return None
        raise OSError(rc, f"cannot read the identity of pid {self.pid}: {os.strerror(rc)}")

    def exited(self) -> bool:
        out = ffi.new("int *")
        rc = lib.pl_proc_poll(self.handle, out)
        if rc:
            raise OSError(rc, f"cannot poll pid {self.pid}: {os.strerror(rc)}")
        return bool(out[0])

    def returncode(self) -> int | None:
        """Exit code (or -signal) of the exited process, None when the kernel cannot tell."""
        out = ffi.new("int *")
        rc = lib.pl_proc_returncode(self.handle, self.pid, out)
        return int(out[0]) if rc == 0 else None

    def event_fd(self) -> int | None:
        """A descriptor that becomes readable at exit, or None (Windows)."""
        out = ffi.new("int64_t *")
        rc = lib.pl_proc_event_fd(self.handle, out)
        return int(out[0]) if rc == 0 else None

    def close(self) -> None:
        if self.handle >= 0:
            handle, self.handle = self.handle, -1
            lib.pl_proc_close(handle)


class PinUnavailable(Exception):
    """Pinning does not exist here (old kernel, seccomp): use the fallback."""


_pin_works: bool | None = None


def pinning_available() -> bool:
    """Whether this process can pin processes (probed once on itself, then cached)."""
    global _pin_works
    if _pin_works is None:
        out = ffi.new("pl_handle *")
        rc = lib.pl_proc_open(os.getpid(), out)
        if rc == 0:
            lib.pl_proc_close(out[0])
            _pin_works = True
        elif rc in UNAVAILABLE:
            _pin_works = False
        else:
            raise OSError(rc, f"cannot probe process pinning: {os.strerror(rc)}")
    return _pin_works


def pin(pid: int, expected: ProcessIdentity | None = None) -> Pinned | None:
    """Pin pid, then verify it is the expected process.

    Returns None when there is no such process, or when the pid now belongs
    to another process than expected (the expected one has exited).  Pinning
    first and verifying after is what makes this exact: a pid recycled in
    between cannot pass the check.  Raises PinUnavailable where pinning is
    refused here.
    """
    out = ffi.new("pl_handle *")
    rc = lib.pl_proc_open(pid, out)
    if rc == errno.ESRCH:
        return None
    if rc in UNAVAILABLE:
        raise PinUnavailable(rc)
    if rc == errno.EMFILE or rc == errno.ENFILE:
        raise OSError(
            rc,
            f"cannot watch pid {pid}: {os.strerror(rc)}; each watched process holds "
            "one descriptor, raise RLIMIT_NOFILE (ulimit -n, resource.setrlimit)",
        )
    if rc:
        raise OSError(rc, f"cannot watch pid {pid}: {os.strerror(rc)}")
    pinned = Pinned(pid, int(out[0]))
    if expected is not None:
        try:
            now = pinned.identity()
        except BaseException:
            pinned.close()
            raise
        if now is None or not same_process(now, expected):
            pinned.close()
            return None
    return pinned


def is_alive(identity: ProcessIdentity) -> bool:
    """Whether this very process still runs (a zombie does not), from kernel facts.

    A different boot_id means another boot (or machine): not alive here.
    An identity with neither start time nor pidfs inode can only be checked
    by its pid.
    """
    if identity.pid <= 0 or identity.pid >= 2**31:
        return False
    if identity.boot_id and identity.boot_id != self_identity().boot_id:
        return False
    expected = identity if has_start_identity(identity) else None
    if pinning_available():
        try:
            pinned = pin(identity.pid, expected)
        except PinUnavailable:
            pinned = None
        else:
            if pinned is None:
                return False
            try:
                return not pinned.exited()
            finally:
                pinned.close()
    now = identity_of(identity.pid)
    return now is not None and (expected is None or same_process(now, expected))


def has_start_identity(identity: ProcessIdentity) -> bool:
    """Whether identity tells its process apart from a later owner of the pid."""
    return bool(identity.start_time or identity.pidfs_ino)
