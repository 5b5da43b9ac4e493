"""A front lock's count of acquisitions: only the first takes the lock,
only the last release gives it back.  The count, the backend's hold and
the settings acquire() defaults to (timeout, blocking, poll_interval) are
per thread by default, and shared by every thread with thread_local=False."""

from __future__ import annotations

from threading import Lock as allocate_lock
from threading import local
from typing import Any


class Context:
    def __init__(self, timeout: float, blocking: bool, poll_interval: float) -> None:
        self.timeout = timeout
        self.blocking = blocking
        self.poll_interval = poll_interval
        self.counter = 0
        self.held: Any = None  # the backend's hold while counter > 0


class ThreadContext(Context, local):
    """The same, per thread: a thread's first look runs __init__ again with
    the constructor's values, as filelock's thread-local settings do."""


class Holds:
    """The count's updates: a shared count is changed under a mutex."""

    def __init__(self, context: Context, thread_local: bool) -> None:
        self.context = context
        self.thread_local = thread_local
        self._mu = allocate_lock()

    def join(self) -> bool:
        """Count one more acquisition if this thread (shared: anyone) holds it."""
        ctx = self.context
        if self.thread_local:
            if ctx.counter:
                ctx.counter += 1
                return True
            return False
        with self._mu:
            if ctx.counter:
                ctx.counter += 1
                return True
        return False

    def start(self, held: object) -> None:
        ctx = self.context
        if self.thread_local:
            ctx.held, ctx.counter = held, 1
            return
        with self._mu:
            ctx.held = held
            ctx.counter += 1

    def end(self, force: bool) -> object:
        """Count one release (force: all); the hold to give back after the last."""
        if self.thread_local:
            ctx = self.context
            if ctx.counter > 1 and not force:
                ctx.counter -= 1
                return None
            held, ctx.held, ctx.counter = ctx.held, None, 0
            return held  # None when it was not held
        with self._mu:
            return _count_down(self.context, force)


def _count_down(ctx: Context, force: bool) -> object:
    if ctx.counter > 1 and not force:
        ctx.counter -= 1
        return None
    held, ctx.held, ctx.counter = ctx.held, None, 0
    return held
