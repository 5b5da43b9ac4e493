"""pylock's etcd thread: one private event loop per process that runs all etcd traffic.

gRPC channels belong to one event loop, and EtcdLock serves blocking code,
coroutines on any loop and several threads at once: so all etcd traffic runs
on one loop in one daemon thread per process, started on first use.  That
thread is also where leases are kept alive while a lock is held or awaited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .client import REQUEST_TIMEOUT, Cluster
from .errors import EtcdRefused

T = TypeVar("T")


class EtcdLoop:
    """The daemon thread running pylock's etcd event loop, and its channels."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clusters: dict[tuple[str, ...], Cluster] = {}
        self.thread = threading.Thread(target=self._run, name="pylock etcd", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def cluster(self, endpoints: tuple[str, ...]) -> Cluster:
        """Only on the loop's thread: channels are bound to it."""
        cluster = self.clusters.get(endpoints)
        if cluster is None:
            cluster = self.clusters[endpoints] = Cluster(endpoints)
        return cluster

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]


_current: EtcdLoop | None = None
_create_guard = threading.Lock()
_forked_from_user = False


def etcd_loop() -> EtcdLoop:
    global _current
    if _forked_from_user:
        raise EtcdRefused(
            "pylock.etcd cannot run in a process forked from one that used it (gRPC does "
            "not survive fork): start workers with exec, or the 'spawn' or 'forkserver' "
            "start method of multiprocessing"
        )
    current = _current
    if current is None:
        with _create_guard:
            if _current is None:
                _current = EtcdLoop()
            current = _current
    return current


def shutdown() -> None:
    """Close every channel and end the etcd thread (it starts again on next use).

    Only for when no etcd lock is held or awaited: their keep-alives end too.
    """
    global _current
    with _create_guard:
        current, _current = _current, None
    if current is None:
        return

    async def close_channels() -> None:
        for cluster in current.clusters.values():
            await cluster.channel.close()

    try:
        current.submit(close_channels()).result(REQUEST_TIMEOUT)
    finally:
        current.loop.call_soon_threadsafe(current.loop.stop)
        current.thread.join(REQUEST_TIMEOUT)
        if not current.thread.is_alive():
            current.loop.close()


def _loop_for(coro: Awaitable[Any]) -> EtcdLoop:
    try:
        return etcd_loop()
    except BaseException:
        if isinstance(coro, Coroutine):
            coro.close()  # never started: no "never awaited" warning
        raise


def run_blocking(coro: Awaitable[T]) -> T:
    """Run coro on the etcd loop and wait for it; an interrupt (Ctrl-C) cancels it
    and waits for its clean-up, so nothing is left behind in etcd."""
    runner = _loop_for(coro)
    finished = threading.Event()

    async def guarded() -> T:
        try:
            return await coro
        finally:
            finished.set()

    future = runner.submit(guarded())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        finished.wait(REQUEST_TIMEOUT)
        raise


async def run_async(coro: Awaitable[T], on_orphan: Callable[[T], object] | None = None) -> T:
    """Await coro (run on the etcd loop) from any event loop.

    Cancelling the awaiting task cancels coro and waits for its clean-up, so
    nothing is left in etcd when the cancellation arrives; a result that
    arrived at the same moment is handed to on_orphan (to give back a lock
    nobody awaits any more).
    """
    runner = _loop_for(coro)
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()

    def set_finished() -> None:
        if not finished.done():
            finished.set_result(None)

    async def guarded() -> T:
        try:
            return await coro
        finally:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                loop.call_soon_threadsafe(set_finished)

    future = runner.submit(guarded())
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        won = future.done() and not future.cancelled() and future.exception() is None
        if won and on_orphan is not None:
            on_orphan(future.result())
        elif not won:
            future.cancel()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(finished), REQUEST_TIMEOUT)
        raise


def _forget_after_fork() -> None:
    # The loop thread and gRPC's channels do not exist in a forked child,
    # and gRPC cannot start again there once it ran in the parent.
    global _current, _create_guard, _forked_from_user
    _forked_from_user = _forked_from_user or _current is not None
    _current = None
    _create_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
