"""One contender of an etcd lock: its lease, its key, and the keep-alive that proves it.

Runs on pylock's etcd loop.  The lease is kept alive from the moment the key
is created (waiters too, or their place in the queue would expire), and the
session counts as lost as soon as it cannot prove otherwise: etcd said the
lease expired, or no keep-alive was confirmed for a whole TTL (a pause, a
partition).  The local deadline is measured from before each keep-alive was
sent, so it never outlives the lease etcd keeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from .client import Cluster, DeadlinePassed, EtcdRefused, EtcdUnavailable

log = logging.getLogger("pylock")

# After a failed keep-alive, try again this soon: another member may answer.
RETRY_DELAY = 0.1


class Session:
    def __init__(self, cluster: Cluster, key: bytes, lease: int, ttl: int, expires: float) -> None:
        self.cluster = cluster
        self.key = key
        self.lease = lease
        self.ttl = ttl
        self.expires = expires  # monotonic time the lease is surely alive until
        self.revision = 0  # the key's creation revision: the fencing token
        self.lost_reason: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        # False once the acquisition this session serves has given up (an
        # exception may have cut its clean-up short): checked at every
        # keep-alive, which then ends the session.
        self.wanted: Callable[[], bool] = lambda: True
        self._keeper: asyncio.Task[None] | None = None

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None or time.monotonic() >= self.expires

    def start(self) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())

    def _mark_lost(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            if self.on_lost is not None:
                self.on_lost(reason)

    async def _keep_alive(self) -> None:
        interval = max(self.ttl / 3.0, 0.05)
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if not self.wanted():
                self._keeper = None  # ending from inside: end() must not cancel this task
                await self._revoke()
                return
            sent = time.monotonic()
            if sent >= self.expires:
                self._mark_lost(
                    f"no keep-alive was confirmed for the lease's whole TTL ({self.ttl} s): "
                    "this process was paused or cut off from etcd"
                )
                return
            try:
                left = await self.cluster.refresh(self.lease, min(self.expires, sent + interval))
            except (EtcdUnavailable, EtcdRefused, DeadlinePassed) as exc:
                log.debug("pylock: etcd keep-alive of lease %x failed: %s", self.lease, exc)
                next_at = time.monotonic() + RETRY_DELAY
                continue
            if left <= 0:
                self._mark_lost(f"etcd expired the lease (TTL {self.ttl} s) before it was renewed")
                return
            self.expires = sent + left
            next_at = sent + interval

    async def end(self) -> bool:
        """Stop the keep-alive and revoke the lease (deleting the key at once,
        which wakes the next waiter).  False when etcd could not be told: the
        lease then expires on its own within its TTL."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
        return await self._revoke()

    async def _revoke(self) -> bool:
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
