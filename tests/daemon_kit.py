"""Helpers for the daemon-kit tests: a real process running as another user.

setpriv(1) would have to exec an interpreter that the other user may run; the
test interpreter often lives under /root (mode 0700).  So the process is
forked from the test, drops to the other user (setgroups, setresgid,
setresuid: the same calls setpriv makes) and runs a function, speaking a line
protocol over pipes like the other tests' children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from typing import Any, Callable, TextIO

NOBODY = 65534


class AsUser:
    """A forked process running target(out, inp) as uid/gid."""

    def __init__(self, uid: int, target: Callable[[TextIO, TextIO], None]) -> None:
        child_out_r, child_out_w = os.pipe()
        child_in_r, child_in_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(child_out_r)
                os.close(child_in_w)
                out = os.fdopen(child_out_w, "w", buffering=1)
                inp = os.fdopen(child_in_r)
                try:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    target(out, inp)
                    code = 0
                except BaseException:
                    out.write("error " + traceback.format_exc().replace("\n", " | ") + "\n")
            finally:
                os._exit(code)
        os.close(child_out_w)
        os.close(child_in_r)
        self.pid = pid
        self.out = os.fdopen(child_out_r)
        self.inp = os.fdopen(child_in_w, "w", buffering=1)
        self.status: int | None = None

    def expect(self, prefix: str = "") -> str:
        line = self.out.readline().strip()
        assert line.startswith(prefix), f"expected {prefix!r} from the child, got {line!r}"
        return line

    def send(self, line: str) -> None:
        self.inp.write(line + "\n")

    def wait(self) -> int:
        if self.status is None:
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.status

    def alive(self) -> bool:
        return self.status is None and os.waitpid(self.pid, os.WNOHANG)[0] == 0

    def close(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait()
        self.out.close()
        self.inp.close()


def hold_until_told(make_lock: Callable[[], Any]) -> Callable[[TextIO, TextIO], None]:
    """A target that takes a lock (make_lock), says "held", and keeps it until its stdin closes."""

    def target(out: TextIO, inp: TextIO) -> None:
        lock = make_lock()
        out.write(f"held {os.getpid()}\n")
        inp.read()
        lock.close()

    return target
