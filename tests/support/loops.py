"""asyncio.Runner for the tests that run coroutines on a chosen event loop
(asyncio's or uvloop's): the standard library's on Python 3.11+, the same by
hand on 3.9 and 3.10, which have no Runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def runner(loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> Any:
    """A context manager whose run(coro) runs coro on one loop, closed at exit."""
    if hasattr(asyncio, "Runner"):
        return asyncio.Runner(loop_factory=loop_factory)
    return _Runner(loop_factory)


class _Runner:
    """asyncio.Runner's contract where it is missing: one loop for every run(),
    and at exit the remaining tasks cancelled and awaited, async generators
    and the default executor shut down, the loop closed."""

    def __init__(self, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None) -> None:
        self._factory = loop_factory
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Runner:
        if self._factory is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)  # as Runner does for its own loop
        else:
            self._loop = self._factory()
        return self

    def run(self, coro: Any) -> Any:
        assert self._loop is not None
        return self._loop.run_until_complete(coro)

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        assert loop is not None
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            if hasattr(loop, "shutdown_default_executor"):
                loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            if self._factory is None:
                asyncio.set_event_loop(None)
            loop.close()
