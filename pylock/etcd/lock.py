"""EtcdLock: the same lock as pylock.Lock, held in an etcd cluster instead of a file.

The lock is etcd's own recipe (recipe.py), with its keys: `EtcdLock(name)`
is the lock `etcdctl lock name` and Go's concurrency.NewMutex(session, name)
take.  This module is the lock object: which thread or task uses it, and
the session it holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from .._core.errors import LockError
from .._core.native import lib
from .._core.timeout import check_timeout, deadline_of
from .._lock.errors import LockHeld, LockTimeout, NotHeld, ReentrantAcquire
from .._lock.ownership import Owned, acquires_for_awaiting_task, task_owner, this_thread
from .._lock.record import check_info
from .client import normalize_endpoints
from .holder import EtcdHolder, encode_record
from .loop import etcd_loop, run_async, run_blocking
from .recipe import Attempt, Queue, contend
from .session import Session

log = logging.getLogger("pylock")


class EtcdLock(Owned):
    """A lock named `name` in the etcd cluster at `endpoints`, with Lock's interface.

    It is etcd's lock recipe with its own keys (`namespace + name + "/"` and
    the lease ID in hex), so it excludes and queues with `etcdctl lock` and
    Go's concurrency.Mutex of the same name; namespace is a key prefix, as
    etcd's namespace client has it ("" by default: see the README).

    Holding it means owning the oldest key under the lock's prefix, bound to
    a lease this process keeps alive in pylock's etcd thread.  If the hold
    is lost (the process paused or was cut off for a whole TTL, etcd expired
    the lease, another client deleted the key), `lost` turns True and
    `on_lost(lock)` is called once, from a worker thread: another holder may
    already own the lock, so the protected resource must check
    `fencing_token` (see the README).
    """

    def __init__(
        self,
        name: str,
        *,
        endpoints: str | Sequence[str],
        ttl: int = 10,
        info: dict[str, Any] | None = None,
        on_lost: Callable[[EtcdLock], None] | None = None,
        namespace: str = "",
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"an etcd lock needs a non-empty name, not {name!r}")
        if not isinstance(namespace, str):
            raise TypeError(f"namespace is a str (a key prefix), not {type(namespace).__name__}")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl is whole seconds, at least 1, not {ttl!r}")
        check_info(info)
        self.name = name
        self.namespace = namespace
        self.endpoints = normalize_endpoints(endpoints)
        self.ttl = ttl
        self.on_lost = on_lost
        self._info = info
        full = namespace + name
        self.path = f"etcd://{','.join(self.endpoints)}/{full}"
        # The recipe's prefix, byte for byte as Go spells the same string.
        prefix = full.encode("utf-8", "surrogateescape") + b"/"
        self._queue = Queue(full, self.path, prefix, self.endpoints)
        # One attempt at a time uses this object, as a Lock: the C core's
        # owner word (in a pl_lockfile without a file), the holder kept alive.
        super().__init__()
        self._session: Session | None = None

    def __repr__(self) -> str:
        state = "locked" if self.locked else "unlocked"
        return f"<pylock.etcd.EtcdLock {self.path!r} {state}>"

    # -- state ---------------------------------------------------------------

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock (check `lost` before trusting it)."""
        return self._holding() is not None

    def _holding(self) -> object | None:
        """The holding attempt, if the C core's owner word still names it: an
        acquire whose except clause has given the object back (its first
        call) holds nothing, whatever fields the interrupted rest left."""
        attempt = self._attempt
        if attempt is None or not self._owned_by(id(attempt)):
            return None
        return attempt

    @property
    def lost(self) -> bool:
        """True once this holder can no longer prove its lease is alive: another
        process may hold the lock now.  False when not held."""
        session = self._session if self.locked else None
        return session is not None and session.lost

    @property
    def fencing_token(self) -> int | None:
        """The held key's creation revision: strictly greater for every later
        acquisition of this lock.  None when not held."""
        session = self._session if self.locked else None
        return session.revision if session is not None else None

    # -- taking the lock -----------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock, waiting (by a watch) for the holders before us.

        timeout=0 is one try, as for Lock.  Raises LockHeld (blocking=False and
        held), LockTimeout (EtcdTimeout when etcd had not answered by then),
        ReentrantAcquire, EtcdUnavailable when etcd cannot be reached (within
        the timeout, or within pylock's 5 s request limit when waiting
        longer), EtcdRefused, EtcdLost when this waiter's key or lease went
        away before its turn.
        """
        owner = this_thread.token
        if self._owner is owner and self.locked:
            raise ReentrantAcquire(
                f"{self.path}: this thread already holds this EtcdLock; pylock locks are "
                "not reentrant"
            )
        if timeout is not None and not blocking:
            raise ValueError("a timeout makes no sense with blocking=False")
        timeout = check_timeout(timeout)
        deadline = deadline_of(timeout)
        # As in Lock.acquire: named before the try, owned and given back in C
        # calls.  The session the etcd thread creates lives only while the
        # owner word names this attempt: the except clause's first call
        # gives the object back, which dooms the session even if an
        # exception cuts the rest short (its keep-alive ends it, within a
        # third of the TTL); the rest ends it at once (won).
        attempt = object()
        token = id(attempt)
        won: list[Session] = []
        waited = [False]  # slept on the bell: may have taken a ring meant for others
        try:
            if not self._own(token):
                self._take_object(token, blocking, deadline, timeout, waited)
            asked = self._attempt_of(attempt, blocking, deadline, timeout)
            session = run_blocking(contend(self._queue, asked, won))
            self._hold(session, owner)
            self._attempt = attempt
        except BaseException:
            self._give_back(attempt, won, waited[0])
            raise
        return True

    @acquires_for_awaiting_task
    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take the lock from a coroutine; cancelling the task leaves nothing in etcd."""
        owner = task_owner()
        if self._owner is owner and self.locked:
            raise ReentrantAcquire(
                f"{self.path}: this task already holds this EtcdLock; pylock locks are "
                "not reentrant"
            )
        timeout = check_timeout(timeout)
        deadline = deadline_of(timeout)
        attempt = object()
        token = id(attempt)
        won: list[Session] = []
        try:
            if not self._own(token):
                await self._take_object_async(token, deadline, timeout)
            asked = self._attempt_of(attempt, True, deadline, timeout)
            session = await run_async(contend(self._queue, asked, won))
            self._hold(session, owner)
            self._attempt = attempt
        except BaseException:
            self._give_back(attempt, won, False)
            raise
        return True

    def _attempt_of(
        self, attempt: object, blocking: bool, deadline: float | None, timeout: float | None
    ) -> Attempt:
        """What the etcd thread is asked.  timeout=0 is a try: one round of
        requests (each within the request limit) that raises LockTimeout
        when held, as Lock's does."""
        owned_by, token = self._owned_by, id(attempt)
        try_once = timeout == 0
        return Attempt(
            blocking=blocking and not try_once,
            deadline=None if try_once else deadline,
            timeout=timeout,
            value=encode_record(self._info),
            ttl=self.ttl,
            # Kept alive while the object is owned by this attempt (which the
            # closure keeps alive, so that its id names nobody else).
            wanted=lambda: owned_by(token) and attempt is not None,
        )

    def _give_back(self, attempt: object, won: list[Session], waited: bool) -> None:
        """An acquisition that raises holds nothing.  The first call gives the
        object back (the session is doomed from then on, see _contend); the
        rest ends the session at once and forgets it, and may be cut short."""
        # The C call itself, not a method: a call is where a handler's
        # exception could land before the object is given back.
        ring = lib.pl_disown(self._lf, id(attempt), 0) > 0
        try:
            # Only what this attempt set: another may own the object already.
            if won:
                session = won.pop()
                etcd_loop().submit(session.end())  # never blocks the caller
                if self._session is session:
                    self._session = None
            if self._attempt is attempt:
                self._attempt = None
        finally:
            if ring or waited:
                self._ring()

    def _raise_held(self, blocking: bool, timeout: float | None) -> NoReturn:
        # Another attempt of this process uses the object; naming the holder
        # is best-effort and never replaces the answer.
        try:
            holder = self.holder()
        except LockError:
            holder = None
        if blocking:
            raise LockTimeout(self.path, holder, timeout or 0.0)
        raise LockHeld(self.path, holder)

    def _hold(self, session: Session, owner: object) -> None:
        self._session = session
        self._owner = owner
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

    # -- releasing -----------------------------------------------------------

    def _take_session(self) -> tuple[Session, object]:
        session, attempt = self._session, self._holding()
        if self._owner is None or session is None or attempt is None:
            raise NotHeld(f"{self.path}: release() of a lock this EtcdLock object does not hold")
        self._session = None
        self._owner = None
        self._attempt = None
        return session, attempt

    def _release_object(self, attempt: object) -> None:
        if lib.pl_disown(self._lf, id(attempt), 0) > 0:  # the C call itself, as in _give_back
            self._ring()

    def release(self) -> None:
        """Release the lock: its key is deleted at once, which wakes the next waiter.

        If etcd cannot be reached, a warning is logged and the lock frees
        itself when the lease expires (within ttl seconds).
        """
        session, attempt = self._take_session()
        try:
            if threading.current_thread() is etcd_loop().thread:
                etcd_loop().loop.create_task(session.end())
            else:
                run_blocking(session.end())
        finally:
            self._release_object(attempt)

    async def release_async(self) -> None:
        """release() without blocking the event loop for the round trip."""
        session, attempt = self._take_session()
        try:
            await run_async(session.end())
        finally:
            self._release_object(attempt)

    def close(self) -> None:
        """Release the lock if this object holds it."""
        if self.locked:
            self.release()

    # -- diagnostics ---------------------------------------------------------

    def holder(self) -> EtcdHolder | None:
        """Who holds the lock now (maybe this process, maybe etcdctl or a Go
        service), read from etcd with its lease's TTL; None when free."""
        return run_blocking(self._queue.holder(None))

    def _release_in_task(self) -> Coroutine[Any, Any, None]:
        return self.release_async()

    def _after_fork(self) -> None:
        # A forked child does not hold its parent's etcd locks: releasing them
        # there would revoke the parent's lease.
        super()._after_fork()
        self._session = None


if TYPE_CHECKING:
    from .._lock.lock import Lock
    from .._lock.protocol import SupportsLock

    def _both_are_locks(lock: Lock, etcd_lock: EtcdLock) -> list[SupportsLock]:
        # mypy --strict pylock checks here that both classes satisfy the protocol.
        return [lock, etcd_lock]
