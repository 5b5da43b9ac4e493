"""The child strategy, where pidfds are missing: a child of the caller is
checked with waitid(WNOWAIT), which never reaps, at each SIGCHLD (and each
backstop tick) of the fan-out (pylock/_exit/sigchld.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .._core.process import ProcessIdentity, identity_of
from .._core.timeout import seconds_left
from .plan import Plan
from .sigchld import child_status, fanout
from .watch import Watch, still_there


class ChildWatch(Watch):
    def __init__(self, loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> None:
        super().__init__(loop, plan, target)
        self._sub: int | None = None
        self._expected = plan.expected

    def _start(self) -> bool:
        # Subscribed before the first look, so no exit falls in between.
        self._sub = fanout().subscribe(lambda: self.call_threadsafe(self._on_sigchld))
        if self._sub is None:
            return False  # the kernel reaps children itself: nothing to read
        status = child_status(self.pid)
        if not status.is_child:
            self.close()
            return False
        if status.exited:
            self.finish(status.returncode)
            return True
        # From here on SIGCHLD tells; the identity covers a child reaped by
        # its owner (Popen.wait) whose pid went to another child of ours.
        if self._expected is None:
            self._expected = identity_of(self.pid)
        if self._expected is None or not still_there(self.pid, self._expected):
            self.finish(self._late_status())
        return True

    def _late_status(self) -> int | None:
        """The status of a child found gone after waitid said it ran: it may have
        become a zombie in between (then waitid tells now), or been reaped by
        its owner (then nobody can)."""
        status = child_status(self.pid)
        return status.returncode if status.is_child and status.exited else None

    def _on_sigchld(self) -> None:
        if self.future.done():
            return
        status = child_status(self.pid)
        if not status.is_child:
            self.finish(None)  # reaped by its owner (Popen.wait) meanwhile
        elif status.exited:
            self.finish(status.returncode)
        elif self._expected is not None and not still_there(self.pid, self._expected):
            self.finish(self._late_status())

    def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            fanout().unsubscribe(sub)

    @staticmethod
    def wait(plan: Plan, deadline: float | None) -> bool | None:
        pid = plan.pid
        woken = threading.Event()
        sub = fanout().subscribe(woken.set)
        if sub is None:
            return None
        try:
            status = child_status(pid)
            if not status.is_child:
                return None
            expected: ProcessIdentity | None = plan.expected or identity_of(pid)
            while True:
                if status.exited or not status.is_child:
                    return True
                if expected is None or not still_there(pid, expected):
                    return True
                left = seconds_left(deadline)
                if left == 0:
                    return False
                woken.wait(left)
                woken.clear()
                status = child_status(pid)
        finally:
            fanout().unsubscribe(sub)
