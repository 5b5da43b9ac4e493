"""EtcdLock: the same lock as pylock.Lock, held in an etcd cluster instead of a file.

etcd's own mutex recipe: every contender creates a key under the lock's
prefix, bound to its lease; the key with the lowest creation revision holds
the lock; each waiter watches only the key created just before its own, from
the revision it read it at, so a release or an expiry wakes exactly the next
waiter, and nobody polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Callable, Union
from urllib.parse import quote

from ._errors import LockHeld, LockTimeout, NotHeld, ReentrantAcquire
from ._etcd_client import (
    REQUEST_TIMEOUT,
    Cluster,
    DeadlinePassed,
    EtcdUnavailable,
    normalize_endpoints,
)
from ._etcd_holder import EtcdHolder, decode_holder, encode_record
from ._etcd_loop import etcd_loop, run_async, run_blocking
from ._etcd_session import RETRY_DELAY, Session
from ._record import check_info
from ._timeout import check_timeout, deadline_of

log = logging.getLogger("pylock")

_Owner = Union[int, tuple[str, int]]
_held_locks: weakref.WeakSet[EtcdLock] = weakref.WeakSet()

# How long naming the holder in a LockHeld/LockTimeout may take, at most.
_NAMING_TIME = 1.0


def _task_owner() -> _Owner:
    task = asyncio.current_task()
    return ("task", id(task)) if task is not None else threading.get_ident()


class EtcdLock:
    """A lock named `name` in the etcd cluster at `endpoints`, with Lock's interface.

    Holding it means owning the oldest key under the lock's prefix, bound to
    a lease this process keeps alive in pylock's etcd thread.  If that lease
    is lost while held (the process paused or was cut off for a whole TTL,
    etcd expired it), `lost` turns True and `on_lost(lock)` is called once,
    from a worker thread: another holder may already own the lock, so the
    protected resource must check `fencing_token` (see the README).
    """

    def __init__(
        self,
        name: str,
        *,
        endpoints: str | Sequence[str],
        ttl: int = 10,
        info: dict[str, Any] | None = None,
        on_lost: Callable[[EtcdLock], None] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"an etcd lock needs a non-empty name, not {name!r}")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl is whole seconds, at least 1, not {ttl!r}")
        check_info(info)
        self.name = name
        self.endpoints = normalize_endpoints(endpoints)
        self.ttl = ttl
        self.on_lost = on_lost
        self._info = info
        # Quoted, so that lock "a" never sees the keys of lock "a/b".
        self._prefix = b"pylock/lock/" + quote(name, safe="").encode() + b"/"
        self.path = f"etcd://{','.join(self.endpoints)}/{name}"
        self._guard = threading.Lock()  # one owner per EtcdLock object
        self._owner: _Owner | None = None
        self._session: Session | None = None
        self._object_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __repr__(self) -> str:
        state = "locked" if self.locked else "unlocked"
        return f"<pylock.etcd.EtcdLock {self.path!r} {state}>"

    # -- state ---------------------------------------------------------------

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock (check `lost` before trusting it)."""
        return self._owner is not None

    @property
    def lost(self) -> bool:
        """True once this holder can no longer prove its lease is alive: another
        process may hold the lock now.  False when not held."""
        session = self._session
        return session is not None and session.lost

    @property
    def fencing_token(self) -> int | None:
        """The held key's creation revision: strictly greater for every later
        acquisition of this lock.  None when not held."""
        session = self._session
        return session.revision if session is not None else None

    # -- taking the lock -----------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock, waiting (by a watch) for the holders before us.

        Raises LockHeld (blocking=False and held), LockTimeout, ReentrantAcquire,
        EtcdUnavailable when etcd cannot be reached (within the timeout, or
        within pylock's 5 s request limit when waiting longer).
        """
        owner = threading.get_ident()
        if self._owner == owner:
            raise ReentrantAcquire(
                f"{self.path}: this thread already holds this EtcdLock; pylock locks are "
                "not reentrant"
            )
        if timeout is not None and not blocking:
            raise ValueError("a timeout makes no sense with blocking=False")
        timeout = check_timeout(timeout)
        deadline = deadline_of(timeout)
        guard = self._guard
        if not guard.acquire(False) and (
            not blocking or not guard.acquire(True, -1 if timeout is None else timeout)
        ):
            if not blocking:
                raise LockHeld(self.path, self.holder())
            raise LockTimeout(self.path, self.holder(), timeout or 0.0)
        try:
            session = run_blocking(self._contend(blocking, deadline, timeout))
        except BaseException:
            guard.release()
            self._wake_object_waiter()
            raise
        self._hold(session, owner)
        return True

    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take the lock from a coroutine; cancelling the task leaves nothing in etcd."""
        owner = _task_owner()
        if self._owner == owner:
            raise ReentrantAcquire(
                f"{self.path}: this task already holds this EtcdLock; pylock locks are "
                "not reentrant"
            )
        timeout = check_timeout(timeout)
        deadline = deadline_of(timeout)
        while not self._guard.acquire(False):
            await self._wait_for_object(deadline, timeout)
        try:
            session = await run_async(
                self._contend(True, deadline, timeout),
                on_orphan=lambda s: etcd_loop().submit(s.end()),
            )
        except BaseException:
            self._guard.release()
            self._wake_object_waiter()
            raise
        self._hold(session, owner)
        return True

    def _hold(self, session: Session, owner: _Owner) -> None:
        self._session = session
        self._owner = owner
        _held_locks.add(self)
        session.on_lost = self._lost_callback(session)
        if session.lost_reason is not None:  # lost between winning and here
            session.on_lost(session.lost_reason)

    def _lost_callback(self, session: Session) -> Callable[[str], None]:
        def lost(reason: str) -> None:
            log.warning("pylock: lost %s while holding it: %s", self.path, reason)
            callback = self.on_lost
            if callback is not None and self._session is session:
                # Off the etcd loop: a slow callback must not starve the
                # keep-alives of other locks, and it may call release().
                etcd_loop().loop.run_in_executor(None, self._call_on_lost, callback)

        return lost

    def _call_on_lost(self, callback: Callable[[EtcdLock], None]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("pylock: the on_lost callback of %s raised", self.path)

    async def _contend(
        self, blocking: bool, deadline: float | None, timeout: float | None
    ) -> Session:
        """Runs on the etcd loop: create our key, wait for our turn, return the session."""
        cluster = etcd_loop().cluster(self.endpoints)
        try:
            started = time.monotonic()
            lease, ttl = await cluster.grant(self.ttl, deadline)
        except DeadlinePassed:
            raise EtcdUnavailable(self.endpoints, f"no answer within {timeout:g} s") from None
        key = self._prefix + f"{lease:016x}".encode()
        session = Session(cluster, key, lease, ttl, started + ttl)
        session.start()
        try:
            value = encode_record(self._info, lease, ttl)
            session.revision = await cluster.create(key, value, lease, deadline)
            await self._wait_turn(cluster, session, blocking, deadline)
        except DeadlinePassed:
            await session.end()
            holder = await self._find(cluster, time.monotonic() + _NAMING_TIME)
            raise LockTimeout(self.path, holder, timeout or 0.0) from None
        except BaseException:
            await session.end()
            raise
        return session

    async def _wait_turn(
        self, cluster: Cluster, session: Session, blocking: bool, deadline: float | None
    ) -> None:
        while True:
            if session.lost:
                raise EtcdUnavailable(
                    self.endpoints, f"this waiter's lease was lost: {session.lost_reason}"
                )
            try:
                found = await cluster.predecessor(
                    self._prefix, session.key, session.revision, deadline
                )
                if found is None:
                    break
                before, revision = found
                if before is None:
                    return
                if not blocking:
                    holder = await self._find(cluster, time.monotonic() + _NAMING_TIME)
                    raise LockHeld(self.path, holder)
                await cluster.deleted(bytes(before.key), revision, deadline)
            except EtcdUnavailable:
                # The member we talked to went away.  Another may answer: try
                # again until the lease is lost (no keep-alive confirmed for a
                # whole TTL), which bounds the wait when the cluster is gone.
                if session.lost:
                    raise
                await asyncio.sleep(RETRY_DELAY)
        raise EtcdUnavailable(self.endpoints, "this waiter's lease expired while it waited")

    async def _find(self, cluster: Cluster, deadline: float | None) -> EtcdHolder | None:
        try:
            kv, revision = await cluster.first(self._prefix, deadline)
        except (DeadlinePassed, EtcdUnavailable):
            return None
        return None if kv is None else decode_holder(self.name, kv, revision, self.endpoints)

    async def _wait_for_object(self, deadline: float | None, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        self._object_waiters.append(entry)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait_for(future, remaining)
        except BaseException as exc:
            if entry in self._object_waiters:
                self._object_waiters.remove(entry)
            elif not self._guard.locked():
                self._wake_object_waiter()  # handed the turn but leaving: pass it on
            if isinstance(exc, asyncio.TimeoutError):
                raise LockTimeout(self.path, self.holder(), timeout or 0.0) from None
            raise

    def _wake_object_waiter(self) -> None:
        if self._object_waiters:
            loop, future = self._object_waiters.pop(0)
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_set_result, future)

    # -- releasing -----------------------------------------------------------

    def _take_session(self) -> Session:
        session = self._session
        if self._owner is None or session is None:
            raise NotHeld(f"{self.path}: release() of a lock this EtcdLock object does not hold")
        self._session = None
        self._owner = None
        _held_locks.discard(self)
        return session

    def _release_object(self) -> None:
        self._guard.release()
        self._wake_object_waiter()

    def release(self) -> None:
        """Release the lock: its key is deleted at once, which wakes the next waiter.

        If etcd cannot be reached, a warning is logged and the lock frees
        itself when the lease expires (within ttl seconds).
        """
        session = self._take_session()
        try:
            if threading.current_thread() is etcd_loop().thread:
                etcd_loop().loop.create_task(session.end())
            else:
                run_blocking(session.end())
        finally:
            self._release_object()

    async def release_async(self) -> None:
        """release() without blocking the event loop for the round trip."""
        session = self._take_session()
        try:
            await run_async(session.end())
        finally:
            self._release_object()

    def close(self) -> None:
        """Release the lock if this object holds it."""
        if self.locked:
            self.release()

    # -- diagnostics ---------------------------------------------------------

    def holder(self) -> EtcdHolder | None:
        """Who holds the lock now (maybe this process), read from etcd; None when free."""
        return run_blocking(self._holder_now())

    async def _holder_now(self) -> EtcdHolder | None:
        cluster = etcd_loop().cluster(self.endpoints)
        kv, revision = await cluster.first(self._prefix, time.monotonic() + REQUEST_TIMEOUT)
        return None if kv is None else decode_holder(self.name, kv, revision, self.endpoints)

    # -- context managers ----------------------------------------------------

    def __enter__(self) -> EtcdLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> EtcdLock:
        await self.acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release_async()


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _forget_after_fork() -> None:
    # A forked child does not hold its parent's etcd locks: releasing them
    # there would revoke the parent's lease.
    for lock in list(_held_locks):
        lock._session = None
        lock._owner = None
        lock._guard = threading.Lock()
        lock._object_waiters = []
    _held_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
