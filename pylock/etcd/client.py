"""pylock's link to etcd: the requests of one gRPC channel per cluster, and their errors.

etcd is spoken through aetcd's generated etcd v3 API on a grpc.aio channel.
Every call carries a deadline, so an unreachable cluster is an error within
the caller's timeout, never a hang.  The channel names every endpoint
(gRPC's pick_first): when the member it talks to dies, the next call goes to
another one.

The channels are used on pylock's etcd thread only (loop.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, Callable, TypeVar

# gRPC's fork handlers would run in every child the host program forks (and
# log, and stall them); pylock never uses gRPC in a forked child, so unless
# the host asked for them, they stay off.  Read when gRPC is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from aetcd import rpc

from .._core.errors import LockError
from .errors import EtcdRefused, EtcdUnavailable

T = TypeVar("T")

# No single request may take longer than this, whatever the caller's timeout:
# a cluster that cannot answer a lease grant in 5 s is not one to lock on.
REQUEST_TIMEOUT = 5.0


def normalize_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """'http://h1:2379,h2:2379' or a list of them, as ('h1:2379', 'h2:2379')."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    found = []
    for item in items:
        text = item.strip()
        for scheme in ("http://", "https://"):
            if text.startswith(scheme):
                if scheme == "https://":
                    raise ValueError(f"{item!r}: TLS endpoints are not supported yet")
                text = text[len(scheme) :]
        text = text.rstrip("/")
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{item!r} is not an etcd endpoint like 127.0.0.1:2379")
        found.append(text)
    if not found:
        raise ValueError("no etcd endpoints given")
    return tuple(found)


def _target(endpoints: tuple[str, ...]) -> str:
    # gRPC's static address list: "ipv4:a:1,b:2"; names go through DNS one by one.
    def is_ipv4(endpoint: str) -> bool:
        host = endpoint.rpartition(":")[0]
        return all(part.isdigit() for part in host.split(".")) and host.count(".") == 3

    if all(is_ipv4(e) for e in endpoints):
        return "ipv4:" + ",".join(endpoints)
    if len(endpoints) == 1:
        return endpoints[0]
    raise ValueError(
        "several etcd endpoints must be given as IPv4 addresses (or give one DNS name "
        "that resolves to every member)"
    )


class Cluster:
    """The stubs of one channel to one etcd cluster, used on the pylock etcd loop only."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.endpoints = endpoints
        self.channel = rpc.insecure_channel(_target(endpoints))
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)

    def unavailable(self, error: BaseException) -> EtcdUnavailable:
        detail = error.details() if isinstance(error, rpc.AioRpcError) else str(error)
        return EtcdUnavailable(self.endpoints, (detail or type(error).__name__).splitlines()[0])

    def connected(self) -> bool:
        """Whether the channel has a connection to a member (its requests reach etcd)."""
        state = self.channel.get_state(try_to_connect=False)
        return getattr(state, "name", "") == "READY"  # grpc.ChannelConnectivity

    async def call(
        self, method: Callable[..., Awaitable[T]], request: Any, deadline: float | None
    ) -> T:
        """One request with a deadline; etcd's refusals and silences become pylock errors."""
        wait = REQUEST_TIMEOUT if deadline is None else deadline - time.monotonic()
        if wait <= 0:
            raise DeadlinePassed
        try:
            return await method(request, timeout=min(wait, REQUEST_TIMEOUT))
        except rpc.AioRpcError as exc:
            caller_deadline = deadline if wait <= REQUEST_TIMEOUT else None
            raise self.translate(exc, caller_deadline, request) from None

    def translate(self, exc: Any, deadline: float | None, request: Any = None) -> BaseException:
        """deadline: the caller's, when it was the gRPC call's own deadline."""
        code, details = exc.code(), exc.details() or ""
        where = f"etcd at {','.join(self.endpoints)}"
        if deadline is not None and (
            code == rpc.StatusCode.DEADLINE_EXCEEDED or _deadline_in_etcd(code, details, deadline)
        ):
            return DeadlinePassed()
        if code == rpc.StatusCode.FAILED_PRECONDITION and "lease already exists" in details:
            return LeaseExists()
        if code == rpc.StatusCode.RESOURCE_EXHAUSTED or "request is too large" in details:
            return too_much(self.endpoints, details, request)
        if code in (
            rpc.StatusCode.INVALID_ARGUMENT,
            rpc.StatusCode.PERMISSION_DENIED,
            rpc.StatusCode.UNAUTHENTICATED,
            rpc.StatusCode.FAILED_PRECONDITION,
            rpc.StatusCode.NOT_FOUND,  # a lease that expired already
            rpc.StatusCode.OUT_OF_RANGE,
        ):
            return EtcdRefused(f"{where} refused the request: {details}")
        return self.unavailable(exc)

    async def grant(self, lease: int, ttl: int) -> int:
        """Grant the lease ID chosen by the caller; its TTL (etcd may raise it to its minimum).

        Its only deadline is the request limit: a grant that has left is
        waited for, so that it can be revoked once it lands (recipe.py)."""
        request = rpc.LeaseGrantRequest(ID=lease, TTL=ttl)
        reply = await self.call(self.lease.LeaseGrant, request, None)
        return int(reply.TTL)

    async def revoke(self, lease: int) -> None:
        # Refused when already expired: the keys are gone, which is all a revoke is for.
        with contextlib.suppress(EtcdRefused):
            await self.call(self.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease), None)

    async def time_to_live(self, lease: int, deadline: float | None) -> tuple[int, int]:
        """(seconds left, TTL granted) of a lease; (-1, 0) when it has expired."""
        request = rpc.LeaseTimeToLiveRequest(ID=lease)
        reply = await self.call(self.lease.LeaseTimeToLive, request, deadline)
        return int(reply.TTL), int(reply.grantedTTL)

    async def refresh(self, lease: int, deadline: float) -> int:
        """One keep-alive; the lease's remaining TTL (0: it has expired)."""

        async def one() -> AsyncIterator[Any]:
            yield rpc.LeaseKeepAliveRequest(ID=lease)

        wait = max(0.001, deadline - time.monotonic())
        try:
            async for reply in self.lease.LeaseKeepAlive(one(), timeout=wait):
                return int(reply.TTL)
        except rpc.AioRpcError as exc:
            raise self.translate(exc, None) from None
        raise self.unavailable(RuntimeError("keep-alive stream closed without a reply"))

    async def create(
        self, key: bytes, value: bytes, lease: int, prefix: bytes, deadline: float | None
    ) -> tuple[int, Any]:
        """Put key bound to lease if it does not exist, and read the lock's oldest
        key in the same transaction (the recipe's one round trip when the lock
        is free): the key's creation revision, and the oldest key."""
        absent = rpc.Compare(
            result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=0
        )
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
        oldest = rpc.RequestOp(request_range=_oldest(prefix))
        reply = await self.call(
            self.kv.Txn, rpc.TxnRequest(compare=[absent], success=[put, oldest]), deadline
        )
        if not reply.succeeded:
            raise EtcdRefused(f"etcd key {key!r} exists already: two acquisitions shared a lease")
        return int(reply.header.revision), reply.responses[1].response_range.kvs[0]

    async def predecessor(
        self, prefix: bytes, key: bytes, revision: int, deadline: float | None
    ) -> tuple[Any | None, int] | None:
        """The contender created just before ours, and the revision read at.

        None when our own key has gone (its lease expired while we waited):
        checked in the same transaction, so we never take a lock we lost.
        """
        ours = rpc.Compare(
            result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision
        )
        before = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            max_create_revision=revision - 1,
            limit=1,
        )
        reply = await self.call(
            self.kv.Txn,
            rpc.TxnRequest(compare=[ours], success=[rpc.RequestOp(request_range=before)]),
            deadline,
        )
        if not reply.succeeded:
            return None
        kvs = reply.responses[0].response_range.kvs
        return (kvs[0] if kvs else None), int(reply.header.revision)

    async def first(self, prefix: bytes, deadline: float | None) -> tuple[Any | None, int]:
        """The oldest contender (the holder) and the revision read at."""
        reply = await self.call(self.kv.Range, _oldest(prefix), deadline)
        return (reply.kvs[0] if reply.kvs else None), int(reply.header.revision)

    async def get(self, key: bytes, deadline: float | None) -> tuple[Any | None, int]:
        reply = await self.call(self.kv.Range, rpc.RangeRequest(key=key), deadline)
        return (reply.kvs[0] if reply.kvs else None), int(reply.header.revision)

    async def deleted(self, key: bytes, after: int, deadline: float | None) -> int:
        """Wait until key is deleted at a revision after `after`: that revision, or
        0 when the revisions were compacted (the caller must look again).

        The watch starts at after + 1, so a deletion between the caller's read
        and this watch is still seen: no gap, no polling.
        """
        create = rpc.WatchCreateRequest(
            key=key, start_revision=after + 1, filters=[rpc.WatchCreateRequest.NOPUT]
        )
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield rpc.WatchRequest(create_request=create)
            await stop.wait()

        # The deadline is kept here, not given to gRPC: etcd ends a stream
        # whose deadline passed with an unspecific "context deadline exceeded".
        call = self.watch.Watch(requests())

        async def outcome() -> int:
            async for reply in call:
                if reply.compact_revision:
                    return 0
                for event in reply.events:
                    if event.type == rpc.Event.DELETE:
                        return max(1, int(event.kv.mod_revision))
                if reply.canceled:
                    return 0
            raise self.unavailable(RuntimeError("watch stream closed"))

        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(outcome(), wait)
        except asyncio.TimeoutError:
            raise DeadlinePassed from None
        except rpc.AioRpcError as exc:
            raise self.translate(exc, None) from None
        finally:
            stop.set()
            call.cancel()


class DeadlinePassed(Exception):
    """The caller's deadline passed during a request (becomes LockTimeout or TimeoutError)."""


class LeaseExists(Exception):
    """The lease ID chosen for a grant is taken already: choose another."""


def _deadline_in_etcd(code: Any, details: str, deadline: float) -> bool:
    """etcd's own words for the deadline it was sent passing inside etcd, met
    when they beat this client's timer (a loaded client): its request
    timeout, or Go's context error passed on as is (UNKNOWN from etcd 3.4).
    Only once the caller's deadline has passed here too: etcd's deadline
    passes after it, while gRPC's own "connection attempt timed out" and a
    proxy's dial timeout use the same words for an outage, at any time."""
    if time.monotonic() < deadline:
        return False
    if code == rpc.StatusCode.UNAVAILABLE and "timed out" in details:
        return True
    return code in (rpc.StatusCode.UNKNOWN, rpc.StatusCode.UNAVAILABLE) and (
        "context deadline exceeded" in details
    )


def too_much(endpoints: tuple[str, ...], details: str, request: Any) -> LockError:
    """A request larger than etcd takes, or etcd out of space: never an outage."""
    where = f"etcd at {','.join(endpoints)}"
    if "space exceeded" in details:
        return EtcdRefused(
            f"{where} refused the request: its database is full ({details}); its "
            "--quota-backend-bytes limit was reached: an administrator must compact, "
            "defragment and disarm the NOSPACE alarm (etcdctl alarm disarm)"
        )
    if "too many requests" in details:  # overloaded: worth another try later
        return EtcdUnavailable(endpoints, details)
    size = f"of {request.ByteSize()} bytes " if hasattr(request, "ByteSize") else ""
    return EtcdRefused(
        f"{where} refused a request {size}as larger than it accepts ({details}): etcd "
        "takes requests up to its --max-request-bytes (1.5 MiB unless configured) and "
        "gRPC messages up to 2 MiB: use a shorter lock name or a smaller info"
    )


def _oldest(prefix: bytes) -> Any:
    """The key under prefix with the lowest creation revision (the holder)."""
    return rpc.RangeRequest(
        key=prefix,
        range_end=prefix_end(prefix),
        sort_order=rpc.RangeRequest.ASCEND,
        sort_target=rpc.RangeRequest.CREATE,
        limit=1,
    )


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])
