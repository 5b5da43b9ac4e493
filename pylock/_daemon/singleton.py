"""One instance per data directory or per user, with takeover from a running instance.

singleton() takes the lock without waiting, before a daemon does anything
destructive.  With takeover=GRACE it replaces a running instance instead of
refusing: the holder is verified from kernel facts (its record matches the
process the kernel shows holding this very file, it runs as this user),
pinned with a pidfd so the signal can only reach that process, sent SIGTERM,
awaited through the exit notification (the pidfd wakes us, nothing polls),
sent SIGKILL after GRACE seconds, and the lock is then taken.  A holder that
cannot be verified is never signalled: TakeoverRefused says why.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import stat
import sys
from collections.abc import Generator
from typing import Any

from .._core import procfs as _procfs
from .._core.display import display
from .._core.errors import LockError
from .._core.native import lib
from .._core.process import Pinned, PinUnavailable, pin
from .._lock.errors import LockHeld, describe_holder
from .._lock.holder import Holder
from .._lock.lock import Lock
from .._lock.lookup import inspect
from .dirs import runtime_dir

log = logging.getLogger("pylock")

DEFAULT_FILE = "pylock-singleton.lock"
# SIGKILL cannot be ignored, but a process in uninterruptible sleep (a hung
# NFS read, a stuck device) dies only when the kernel lets it.
KILL_WAIT = 30.0


class TakeoverRefused(LockHeld):
    """The running instance could not be verified as one pylock may signal."""


def singleton_path(name: str | None, directory: str | os.PathLike[str] | None) -> str:
    """The lock file of a singleton: name in directory, or in the per-user runtime dir."""
    if name is not None:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"a singleton name must be a plain file name, not {name!r}")
        if os.sep != "/" and os.sep in name:
            raise ValueError(f"a singleton name must be a plain file name, not {name!r}")
    if directory is None:
        if name is None:
            raise ValueError("singleton() needs name= (one per user), directory= or both")
        return os.path.join(runtime_dir(), name)
    # Every spelling of the directory, symlinks included, is one singleton.
    real = os.path.realpath(os.fspath(directory))
    try:
        is_dir = stat.S_ISDIR(os.stat(real).st_mode)
    except OSError as exc:
        raise LockError(f"cannot use singleton directory {real}: {exc.strerror}") from None
    if not is_dir:
        raise LockError(f"singleton directory {real} is not a directory")
    return os.path.join(real, name or DEFAULT_FILE)


def _check_grace(takeover: float | None) -> float | None:
    if takeover is None:
        return None
    grace = float(takeover)
    if math.isnan(grace) or grace < 0:
        raise ValueError(f"takeover must be a grace period in seconds >= 0, not {takeover!r}")
    return grace


class _Victim:
    """The verified holder, pinned: signals sent through it reach only that process."""

    def __init__(self, holder: Holder, pinned: Pinned) -> None:
        self.holder = holder
        self.pinned = pinned

    def signal(self, signum: int) -> None:
        # Through the C core: PyPy's signal module has no pidfd_send_signal.
        rc = lib.pl_proc_signal(self.pinned.handle, signum)
        # ESRCH: it has been reaped, gone as wanted.
        if rc and rc != errno.ESRCH:
            raise OSError(rc, f"cannot signal pid {self.holder.pid}: {os.strerror(rc)}")

    def close(self) -> None:
        self.pinned.close()


def _refuse(path: str, holder: Holder | None, why: str) -> TakeoverRefused:
    return TakeoverRefused(
        path,
        holder,
        f"{display(path)} is held by {describe_holder(holder)}; pylock will not take over: {why}",
    )


def _verified_holder(path: str) -> tuple[Holder, _procfs.LockKey] | None:
    """The holder the record names and the kernel confirms, and the lock
    file's name in the kernel's lock tables; None when the file went away.
    Refuses otherwise."""
    if not sys.platform.startswith("linux"):
        raise _refuse(
            path,
            None,
            "verifying a holder needs the kernel's per-descriptor lock list "
            "(/proc/PID/fdinfo), which only Linux has",
        )
    look = inspect(path)
    if look is None:
        return None  # the file went away: the next acquisition starts afresh
    try:
        holder, note = look.recorded_holder()
        if holder is None or not holder.verified:
            seen = look.kernel_holders()
            shown = holder or (seen[0] if seen else None)
            why = note or (holder.note if holder is not None else "the lock file has no record")
            if seen and holder is None:
                why += f"; the kernel shows {', '.join(h.describe() for h in seen)} holding it"
            raise _refuse(
                path,
                shown,
                f"{why}. Only a holder whose record the kernel confirms is signalled; "
                "stop the holder yourself",
            )
        return holder, look.key
    finally:
        look.close()


def _verify(lock: Lock) -> _Victim | None:
    """The holder to signal, pinned; None when the lock is free again. Refuses otherwise."""
    path = lock.path
    found = _verified_holder(path)
    if found is None:
        return None
    holder, key = found
    if holder.pid == os.getpid():
        raise _refuse(path, holder, "this very process holds it (through another Lock object)")
    try:
        pinned = pin(holder.pid, holder.identity)
    except PinUnavailable:
        raise _refuse(
            path,
            holder,
            "signalling exactly the verified process needs a pidfd (Linux 5.3+), which "
            "this system refuses (old kernel or seccomp policy)",
        ) from None
    if pinned is None:
        return None  # it exited meanwhile
    try:
        # Pinned, the pid cannot move to another process: these facts are its own.
        uids = _procfs.uids(holder.pid)
        me = os.geteuid()
        if uids is not None and uids != (me, me):
            raise _refuse(
                path,
                holder,
                f"it runs as uid {uids[0]} (effective {uids[1]}), another user than this "
                f"process (uid {me}); pylock signals only processes of the same user",
            )
        holds = _procfs.pid_holds(holder.pid, *key)
        if holds is None and pinned.identity() is not None:
            raise _refuse(path, holder, "pylock may not inspect that process's descriptors")
        if holds is not True or pinned.identity() is None:
            pinned.close()
            return None  # released or exited since the look: no one to signal
    except BaseException:
        pinned.close()
        raise
    return _Victim(holder, pinned)


def _after_exit(lock: Lock, victim: _Victim, how: str) -> None:
    """Take the lock the exited holder left; LockHeld if someone else has it now."""
    try:
        lock.acquire(blocking=False)
    except LockHeld as exc:
        raise LockHeld(
            lock.path,
            exc.holder,
            f"{lock.path}: pid {victim.holder.pid} {how}, but the lock is now held by "
            f"{describe_holder(exc.holder)} (a newer instance, or a child that inherited "
            "the lock)",
        ) from None
    log.info("pylock: took over %s from pid %d (%s)", lock.path, victim.holder.pid, how)


# What a takeover waits for: the holder's exit, within so many seconds.
_ExitWait = tuple[Holder, float]


def _takeover(lock: Lock, grace: float) -> Generator[_ExitWait, bool, None]:
    """Acquire lock, replacing its verified holder if it has one (see the
    module doc).  The waits for the holder's exit are left to the caller,
    so that one takeover serves threads and asyncio: each yields (holder,
    timeout) and is sent back whether the holder exited in time."""
    for _ in range(3):  # the holder changed while we looked: look again
        try:
            lock.acquire(blocking=False)
            return
        except LockHeld:
            victim = _verify(lock)
        if victim is None:
            continue
        try:
            victim.signal(signal.SIGTERM)
            if (yield victim.holder, grace):
                return _after_exit(lock, victim, "exited after SIGTERM")
            log.warning(
                "pylock: pid %d still holds %s %g s after SIGTERM: sending SIGKILL",
                victim.holder.pid,
                lock.path,
                grace,
            )
            victim.signal(signal.SIGKILL)
            if not (yield victim.holder, KILL_WAIT):
                raise _refuse(
                    lock.path,
                    victim.holder,
                    f"it survived SIGKILL for {KILL_WAIT:g} s (uninterruptible sleep?)",
                )
            return _after_exit(lock, victim, "was killed after the grace period")
        finally:
            victim.close()
    lock.acquire(blocking=False)


def take_over(lock: Lock, grace: float) -> None:
    """Acquire lock, replacing its verified holder if it has one (see the module doc)."""
    from .._exit.api import wait_exit

    steps = _takeover(lock, grace)
    try:
        wait = next(steps)
        while True:
            holder, timeout = wait
            wait = steps.send(wait_exit(holder, timeout=timeout))
    except StopIteration:
        pass
    finally:
        steps.close()  # an interrupted wait: the holder's pin is closed now


async def take_over_async(lock: Lock, grace: float) -> None:
    """take_over for asyncio: the waits for the holder's exit do not block the loop."""
    from .._exit.api import holder_exit

    steps = _takeover(lock, grace)
    try:
        wait = next(steps)
        while True:
            holder, timeout = wait
            try:
                await holder_exit(holder, timeout=timeout)
                exited = True
            except TimeoutError:
                exited = False
            wait = steps.send(exited)
    except StopIteration:
        pass
    finally:
        steps.close()  # cancelled or interrupted: the holder's pin is closed now


def singleton(
    name: str | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    info: dict[str, Any] | None = None,
    takeover: float | None = None,
) -> Lock:
    """Take this program's one-instance lock without waiting; returns the held Lock.

    directory= alone: one instance per data directory (the lock file
    pylock-singleton.lock inside it, found through the real path, so every
    spelling of the directory is the same singleton).  name= alone: one per
    user, in the per-user runtime directory.  Both: the file name inside
    directory.  A running instance means LockHeld naming it, or with
    takeover=GRACE its replacement (SIGTERM, SIGKILL after GRACE seconds).
    Call it before anything destructive (recovery, cleaning, binding).
    """
    grace = _check_grace(takeover)
    lock = Lock(singleton_path(name, directory), info=info)
    try:
        if grace is None:
            lock.acquire(blocking=False)
        else:
            take_over(lock, grace)
    except BaseException:
        lock.close()
        raise
    return lock


async def singleton_async(
    name: str | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    info: dict[str, Any] | None = None,
    takeover: float | None = None,
) -> Lock:
    """singleton() for asyncio: a takeover awaits the old instance's exit on the loop."""
    grace = _check_grace(takeover)
    if grace is None:  # no takeover: nothing to wait for
        return singleton(name, directory=directory, info=info)
    lock = Lock(singleton_path(name, directory), info=info)
    try:
        await take_over_async(lock, grace)
    except BaseException:
        lock.close()
        raise
    return lock
