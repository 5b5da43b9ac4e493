"""One contender of an etcd lock: its lease, its key, and what proves both alive.

Runs on pylock's etcd loop.  The lease is kept alive from the moment it is
granted (waiters too, or their place in the queue would expire), and the
session counts as lost as soon as it cannot prove otherwise: etcd said the
lease expired, no keep-alive was confirmed for a whole TTL (a pause, a
partition), or the key itself was deleted (another client's `etcdctl del`:
the lease lives on, but the next contender holds the lock now).  The key is
watched from the revision that created it, so no deletion is missed however
late the watch starts: a waiter's starts at once, a holder's with its first
keep-alive (a lock held for less than a third of its TTL costs no watch).
The local deadline is measured from before each keep-alive was sent, so it
never outlives the lease etcd keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Callable

from .._core.errors import LockError
from .client import Cluster, DeadlinePassed
from .errors import EtcdLost, EtcdRefused, EtcdUnavailable
from .holder import key_text

log = logging.getLogger("pylock")

# After a failed keep-alive or watch, try again this soon: another member may answer.
RETRY_DELAY = 0.1

# How the session was lost: etcd was silent for a whole TTL; etcd expired the
# lease; the key was deleted while the lease lived on.
SILENCE, EXPIRED, DELETED = "silence", "expired", "deleted"

_ETCD_ERRORS = (EtcdUnavailable, EtcdRefused, DeadlinePassed)


class Session:
    def __init__(self, cluster: Cluster, key: bytes, lease: int, ttl: int, expires: float) -> None:
        self.cluster = cluster
        self.key = key
        self.lease = lease
        self.ttl = ttl
        self.expires = expires  # monotonic time the lease is surely alive until
        self.revision = 0  # the key's creation revision: the fencing token
        self.lost_reason: str | None = None
        self.lost_how = ""
        self.gone = asyncio.Event()  # set once lost, with its reason: wakes a waiter
        self.on_lost: Callable[[str], None] | None = None
        # False once the acquisition this session serves has given up (an
        # exception may have cut its clean-up short): checked at every
        # keep-alive, which then ends the session.
        self.wanted: Callable[[], bool] = lambda: True
        self._key_gone = False  # seen deleted; the reason is still being asked for
        self._keeper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None or self._key_gone or time.monotonic() >= self.expires

    def start(self) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())

    def watch_key(self) -> None:
        """Once the key exists (revision set): watch for its deletion."""
        if self._watcher is None and self.revision:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_key())

    def lost_error(self, path: str) -> LockError:
        """What a waiter whose session was lost is told."""
        reason = self.lost_reason or f"no keep-alive was confirmed for its TTL ({self.ttl} s)"
        if self.lost_how in (EXPIRED, DELETED):
            return EtcdLost(path, self.key, f"{reason}, while it waited")
        return EtcdUnavailable(self.cluster.endpoints, f"this waiter's lease was lost: {reason}")

    async def verdict(self, path: str, within: float) -> LockError:
        """lost_error once etcd showed the key gone: the watch gives the reason
        within a round trip or two."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.gone.wait(), within)
        self._mark_lost(f"its key {key_text(self.key)} is gone from etcd", DELETED)
        return self.lost_error(path)

    def _mark_lost(self, reason: str, how: str) -> None:
        if self.lost_reason is None:
            self.lost_reason, self.lost_how = reason, how
            self.gone.set()
            if self.on_lost is not None:
                self.on_lost(reason)

    async def _keep_alive(self) -> None:
        interval = max(self.ttl / 3.0, 0.05)
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if not self.wanted():
                self._keeper = None  # ending from inside: end() must not cancel this task
                await self.end()
                return
            self.watch_key()
            sent = time.monotonic()
            if sent >= self.expires:
                self._mark_lost(
                    f"no keep-alive was confirmed for the lease's whole TTL ({self.ttl} s): "
                    "this process was paused or cut off from etcd",
                    SILENCE,
                )
                return
            try:
                left = await self.cluster.refresh(self.lease, min(self.expires, sent + interval))
            except _ETCD_ERRORS as exc:
                log.debug("pylock: etcd keep-alive of lease %x failed: %s", self.lease, exc)
                next_at = time.monotonic() + RETRY_DELAY
                continue
            if left <= 0:
                self._mark_lost(self._expired(), EXPIRED)
                return
            self.expires = sent + left
            next_at = sent + interval

    def _expired(self) -> str:
        return f"etcd expired its lease {self.lease:x} (TTL {self.ttl} s) before it was renewed"

    async def _watch_key(self) -> None:
        after = self.revision
        while not self.lost:
            try:
                deleted_at = await self.cluster.deleted(self.key, after, None)
                if not deleted_at:  # the watched revisions were compacted: look at the key
                    kv, after = await self.cluster.get(self.key, None)
                    if kv is not None and int(kv.create_revision) == self.revision:
                        continue
                    deleted_at = after
            except _ETCD_ERRORS as exc:
                log.debug("pylock: etcd watch of %s failed: %s", key_text(self.key), exc)
                await asyncio.sleep(RETRY_DELAY)
                continue
            self._key_gone = True  # lost from now on; the reason takes one more request
            self._mark_lost(*await self._why_deleted(deleted_at))
            return

    async def _why_deleted(self, revision: int) -> tuple[str, str]:
        try:
            left, _ = await self.cluster.time_to_live(self.lease, time.monotonic() + 1.0)
        except _ETCD_ERRORS:
            left = 0
        if left < 0:
            return self._expired(), EXPIRED
        return (
            f"its key {key_text(self.key)} was deleted in etcd at revision {revision} by "
            f"another client (etcdctl del?) while its lease {self.lease:x} lived on",
            DELETED,
        )

    async def end(self) -> bool:
        """Stop the keep-alive and the watch, and revoke the lease (deleting the
        key at once, which wakes the next waiter).  False when etcd could not
        be told: the lease then expires on its own within its TTL."""
        current = asyncio.current_task()
        for task in (self._keeper, self._watcher):
            if task is not None and task is not current:
                task.cancel()
        self._keeper = self._watcher = None
        try:
            await self.cluster.revoke(self.lease)
        except (EtcdUnavailable, DeadlinePassed) as exc:
            log.warning(
                "pylock: could not revoke etcd lease %x (%s); it expires within %s s",
                self.lease,
                exc,
                self.ttl,
            )
            return False
        return True


async def until_lost(session: Session, path: str, request: asyncio.Future[int]) -> int:
    """request's result, unless the session is lost first: then request is
    cancelled and the waiter is told why (session.lost_error)."""
    gone = asyncio.ensure_future(session.gone.wait())
    try:
        await asyncio.wait((request, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not request.done():
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_ETCD_ERRORS):
                await request
    if request.done() and not request.cancelled():
        return request.result()
    raise session.lost_error(path)
