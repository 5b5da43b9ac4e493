"""etcd's lock recipe, as `etcdctl lock NAME` and Go's concurrency.Mutex run it.

Every contender puts the key NAME + "/" + its lease ID in lowercase hex,
bound to that lease, and reads the oldest key under NAME + "/" in the same
transaction; the key with the lowest creation revision holds the lock.  A
contender that does not hold waits for the key created just before its own
(read with our key's existence in one transaction), watched from the
revision it was read at, so nothing falls in between: a release or an
expiry wakes exactly the next waiter, and nobody polls.  Because the keys
are the recipe's, pylock and every other client of it exclude each other
and queue in one order.  Runs on pylock's etcd loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from .._core.timeout import seconds_left
from .._lock.errors import LockHeld, LockTimeout
from .client import REQUEST_TIMEOUT, Cluster, DeadlinePassed, LeaseExists
from .errors import EtcdRefused, EtcdTimeout, EtcdUnavailable
from .holder import EtcdHolder, decode_holder
from .loop import etcd_loop
from .session import RETRY_DELAY, Session, until_lost

# How long naming the holder in a LockHeld/LockTimeout may take, at most.
NAMING_TIME = 1.0

# A grant abandoned while in flight is revoked when it lands: kept here until then.
_landing: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class Queue:
    """One lock's queue in one cluster: the keys under prefix (name + "/")."""

    name: str  # as the keys spell it: namespace + the lock's name
    path: str
    prefix: bytes
    endpoints: tuple[str, ...]

    def key(self, lease: int) -> bytes:
        return self.prefix + b"%x" % lease  # Go's fmt "%x" of the lease ID

    def cluster(self) -> Cluster:
        return etcd_loop().cluster(self.endpoints)

    async def holder(self, deadline: float | None) -> EtcdHolder | None:
        """Who holds the lock, read from etcd with its lease's TTL; None when free."""
        cluster = self.cluster()
        kv, revision = await cluster.first(self.prefix, deadline)
        return None if kv is None else await self.describe(cluster, kv, revision, deadline)

    async def describe(
        self, cluster: Cluster, kv: Any, revision: int, deadline: float | None
    ) -> EtcdHolder:
        lease_ttl = None
        if kv.lease:
            with contextlib.suppress(EtcdUnavailable, EtcdRefused, DeadlinePassed):
                lease_ttl = await cluster.time_to_live(int(kv.lease), deadline)
        return decode_holder(self.name, kv, revision, self.endpoints, lease_ttl)

    async def named(self, cluster: Cluster, kv: Any | None = None) -> EtcdHolder | None:
        """The holder for a LockHeld or LockTimeout, best-effort within NAMING_TIME."""
        deadline = time.monotonic() + NAMING_TIME
        try:
            if kv is None:
                return await self.holder(deadline)
            return await self.describe(cluster, kv, 0, deadline)
        except (DeadlinePassed, EtcdUnavailable, EtcdRefused):
            return None


@dataclass(frozen=True)
class Attempt:
    """What one acquisition asks: how long it may wait, what its key says."""

    blocking: bool
    deadline: float | None
    timeout: float | None  # 0 with blocking False: a try that raises LockTimeout
    value: bytes
    ttl: int
    wanted: Callable[[], bool]  # False once the acquisition gave up (see Session)


async def contend(queue: Queue, attempt: Attempt, won: list[Session]) -> Session:
    """Create our key, wait for our turn, return the session (also put in won).

    Whatever ends it early (a cancel, a timeout, an error at any await)
    leaves nothing in etcd: the lease is revoked, and a grant that had left
    is revoked again once it lands."""
    cluster = queue.cluster()
    started = time.monotonic()
    try:
        lease, ttl = await grant_lease(cluster, attempt.ttl, attempt.deadline)
    except DeadlinePassed:
        raise no_answer(queue, cluster, attempt.timeout) from None
    session = Session(cluster, queue.key(lease), lease, ttl, started + ttl)
    session.wanted = attempt.wanted
    session.start()
    try:
        try:
            revision, oldest = await cluster.create(
                session.key, attempt.value, lease, queue.prefix, attempt.deadline
            )
        except DeadlinePassed:
            raise no_answer(queue, cluster, attempt.timeout) from None
        session.revision = revision
        if int(oldest.create_revision) != revision:
            session.watch_key()  # now: a waiter is told at once that its key went
            await wait_turn(queue, session, attempt, oldest)
        won.append(session)  # no await follows: nothing can cancel it now
    except BaseException:
        await session.end()
        raise
    return session


async def wait_turn(queue: Queue, session: Session, attempt: Attempt, oldest: Any) -> None:
    """Wait until no key older than ours is left (oldest: the holder we saw)."""
    cluster = session.cluster
    if not attempt.blocking:
        holder = await queue.named(cluster, oldest)
        if attempt.timeout == 0:
            raise LockTimeout(queue.path, holder, 0.0)
        raise LockHeld(queue.path, holder)
    while True:
        if session.gone.is_set():
            raise session.lost_error(queue.path)
        try:
            found = await cluster.predecessor(
                queue.prefix, session.key, session.revision, attempt.deadline
            )
            if found is None:  # our key is gone: the session's watch says why
                raise await session.verdict(queue.path, NAMING_TIME)
            before, revision = found
            if before is None:
                return
            wait = cluster.deleted(bytes(before.key), revision, attempt.deadline)
            await until_lost(session, queue.path, asyncio.ensure_future(wait))
        except DeadlinePassed:
            holder = await queue.named(cluster)
            raise LockTimeout(queue.path, holder, attempt.timeout or 0.0) from None
        except EtcdUnavailable:
            # The member we talked to went away.  Another may answer: try
            # again until the lease is lost (no keep-alive confirmed for a
            # whole TTL), which bounds the wait when the cluster is gone.
            if session.lost:
                raise
            await asyncio.sleep(RETRY_DELAY)


def no_answer(queue: Queue, cluster: Cluster, timeout: float | None) -> BaseException:
    """The timeout passed before etcd said whether the lock is held."""
    if cluster.connected():
        return EtcdTimeout(queue.path, timeout or 0.0, queue.endpoints)
    return EtcdUnavailable(queue.endpoints, f"no connection within {timeout or 0.0:g} s")


async def grant_lease(cluster: Cluster, ttl: int, deadline: float | None) -> tuple[int, int]:
    """A new lease (ID, TTL), under an ID chosen here: a grant whose reply never
    came (a cancel or a timeout while it was in flight) can still be revoked."""
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlinePassed
        # 63 random bits: etcd's IDs are positive int64; a taken one is refused.
        lease = secrets.randbits(63) or 1
        grant = asyncio.ensure_future(cluster.grant(lease, ttl))
        try:
            return lease, await asyncio.wait_for(asyncio.shield(grant), seconds_left(deadline))
        except LeaseExists:
            continue
        except BaseException as exc:
            await _abandon(cluster, grant, lease)
            if isinstance(exc, asyncio.TimeoutError):
                raise DeadlinePassed from None
            raise


async def _abandon(cluster: Cluster, grant: asyncio.Future[int], lease: int) -> None:
    """Leave nothing of a grant given up on: revoke the lease now (the grant
    may have been applied already) and again once the grant lands (it may be
    applied after this revoke).  Waited for within the request limit; a
    grant etcd has not answered by then is revoked whenever it lands."""
    if not cluster.connected():
        grant.cancel()  # no connection: the request never reached etcd
        return
    refused = (EtcdRefused, LeaseExists)
    if grant.done() and not grant.cancelled() and isinstance(grant.exception(), refused):
        return  # never granted; or the ID is another's lease, never to revoke
    now = asyncio.ensure_future(_revoke(cluster, lease))
    landed = asyncio.ensure_future(_revoke_when_landed(cluster, grant, lease))
    _landing.add(landed)
    landed.add_done_callback(_landing.discard)
    await asyncio.wait((now, landed), timeout=REQUEST_TIMEOUT)


async def _revoke_when_landed(cluster: Cluster, grant: asyncio.Future[int], lease: int) -> None:
    with contextlib.suppress(Exception):
        await grant
    if grant.cancelled() or isinstance(grant.exception(), (EtcdRefused, LeaseExists)):
        return
    await _revoke(cluster, lease)


async def _revoke(cluster: Cluster, lease: int) -> None:
    with contextlib.suppress(EtcdUnavailable, EtcdRefused, DeadlinePassed):
        await cluster.revoke(lease)
