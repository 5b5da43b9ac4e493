"""The front's one in-process wake-up: rung when a front lock of this
process is released, heard by the waits no kernel can wake.

Two waits need it.  A FileLock whose file this thread (or task) already
holds through another object cannot wait in the kernel for itself; only a
release by another thread of this process can end it (filelock waits out
the timeout there).  And a SoftFileLock's marker has no kernel wake-up at
all: a release in this process rings at once, one in another process is
seen at the next look, poll_interval later.

A waiter listens before its attempt and waits only if nothing rang since:
a release between the attempt and the sleep is never missed.
"""

from __future__ import annotations

import contextlib
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio


class ReleaseBell:
    def __init__(self) -> None:
        self._mu = threading.Condition(threading.Lock())
        self._rings = 0
        # Read without the mutex by ring(): a release with nobody listening
        # costs one attribute read.
        self.listeners = 0
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def listen(self) -> int:
        """Start listening; returns the count to pass to wait()."""
        with self._mu:
            self.listeners += 1
            return self._rings

    def stop(self) -> None:
        with self._mu:
            self.listeners -= 1

    def wait(self, seen: int, timeout: float) -> int:
        """Sleep up to timeout seconds unless it rang since seen; the new count."""
        with self._mu:
            if self._rings == seen:
                self._mu.wait(timeout)
            return self._rings

    async def wait_async(self, seen: int, timeout: float) -> int:
        import asyncio  # only async locks pay for it

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._mu:
            if self._rings != seen:
                return self._rings
            self._futures.append(entry)
        try:
            await asyncio.wait((future,), timeout=timeout)
        finally:
            with self._mu:
                if entry in self._futures:
                    self._futures.remove(entry)
        return self._rings

    def ring(self) -> None:
        if not self.listeners:
            return
        with self._mu:
            self._rings += 1
            self._mu.notify_all()
            futures, self._futures = self._futures, []
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # closed: nobody waits there any more
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


BELL = ReleaseBell()
