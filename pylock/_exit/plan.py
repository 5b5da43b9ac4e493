"""What an exit watch watches: a target resolved to a pid, the process
expected there, and the lock its holder holds."""

from __future__ import annotations

import os
import socket
from typing import Union

from .._core.process import (
    ProcessIdentity,
    check_pid,
    has_start_identity,
    refuse_thread_id,
    same_process,
    self_identity,
)
from .._lock.holder import Holder
from .._lock.lock import Lock

Target = Union[int, Holder, Lock]


class Plan:
    """A target resolved to a pid, the process expected there, and its lock."""

    __slots__ = ("exited", "expected", "lock_path", "pid")

    def __init__(
        self,
        pid: int,
        expected: ProcessIdentity | None = None,
        lock_path: str | None = None,
        exited: bool = False,
    ) -> None:
        self.pid = pid  # 0: an unidentified holder, only its lock can be watched
        self.expected = expected  # None: whatever process has the pid now
        self.lock_path = lock_path
        self.exited = exited

    def describe(self) -> str:
        return f"pid {self.pid}" if self.pid else f"the holder of {self.lock_path}"


def _refuse_self(pid: int) -> None:
    if pid == os.getpid():
        raise ValueError(f"pid {pid} is the calling process: pylock cannot wait for its own exit")


def _plan_for_holder(holder: Holder, lock_path: str | None) -> Plan:
    ident = holder.identity
    if holder.pid <= 0:
        if lock_path is None:
            raise ValueError(
                f"the holder {holder.describe()} has no process id pylock can watch; "
                "pass the Lock itself to wait until its lock is released"
            )
        return Plan(0, lock_path=lock_path)
    mine = self_identity()
    if ident.boot_id and ident.boot_id != mine.boot_id:
        if holder.hostname and holder.hostname != socket.gethostname():
            if lock_path is not None:
                # Another machine's process: only the lock itself can tell.
                return Plan(0, lock_path=lock_path)
            raise ValueError(
                f"{holder.describe()} runs on another machine ({holder.hostname}); "
                "pylock can only watch processes of this machine"
            )
        return Plan(holder.pid, ident, exited=True)  # recorded in an earlier boot
    if same_process(ident, mine) or not has_start_identity(ident):
        _refuse_self(holder.pid)
    # Without a start identity (a Holder made from a bare pid), the process
    # that has the pid now is the one to watch.
    return Plan(holder.pid, ident if has_start_identity(ident) else None, lock_path)


def plan(target: Target) -> Plan:
    """Resolve target; ValueError/TypeError for what can never be watched."""
    if isinstance(target, Lock):
        holder = target.holder()
        if holder is None:
            return Plan(0, exited=True)  # nobody holds it now
        return _plan_for_holder(holder, target.path)
    if isinstance(target, Holder):
        return _plan_for_holder(target, None)
    pid = check_pid(target)
    _refuse_self(pid)
    refuse_thread_id(pid)
    return Plan(pid)
