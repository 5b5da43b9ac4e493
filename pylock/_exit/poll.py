"""The identity-poll strategy, where pidfds are missing and the process is
not our child: the shared schedule (pylock/_exit/schedule.py) checks that
its pid still names it, about every 100 ms for all watches together."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .._core.process import ProcessIdentity, identity_of
from .._core.timeout import seconds_left
from .plan import Plan
from .schedule import schedule
from .watch import Watch, still_there


def expected_identity(plan: Plan) -> ProcessIdentity | None:
    """The identity to watch, None when that process is already gone."""
    if plan.expected is None:
        return identity_of(plan.pid)  # a bare pid: whoever has it now
    return plan.expected if still_there(plan.pid, plan.expected) else None


class PollWatch(Watch):
    def __init__(self, loop: asyncio.AbstractEventLoop, plan: Plan, target: Any) -> None:
        super().__init__(loop, plan, target)
        self._token: int | None = None
        self.expected: ProcessIdentity | None = None

    def _start(self) -> bool:
        self.expected = expected_identity(self.plan)
        if self.expected is None:
            self.finish(None)
            return True
        self._token = schedule().add(
            self.pid, self.expected.start_time, lambda: self.call_threadsafe(self._on_gone)
        )
        return True

    def _on_gone(self) -> None:
        self._token = None  # the schedule has dropped it
        self.finish(None)

    def close(self) -> None:
        if self._token is not None:
            token, self._token = self._token, None
            schedule().remove(token)

    @staticmethod
    def wait(plan: Plan, deadline: float | None) -> bool | None:
        expected = expected_identity(plan)
        if expected is None:
            return True
        gone = threading.Event()
        token = schedule().add(plan.pid, expected.start_time, gone.set)
        try:
            return gone.wait(seconds_left(deadline))
        finally:
            schedule().remove(token)
