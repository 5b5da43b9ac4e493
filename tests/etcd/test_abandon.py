"""An acquisition given up at any await (a cancel, a timeout) leaves nothing
in etcd, and a timeout says what it knows: held by whom, or no answer yet.

The proxy in front of etcd holds etcd's answer to the n-th request an
acquisition sends, so the cancel or the timeout lands exactly when that
request has done its work in etcd (a lease granted, a key put) and the
client has not seen the answer."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from pylock import LockTimeout
from tests.support.etcd_locks import (
    contenders,
    etcd_lock,
    expect_line,
    holder_process,
    keys,
    leases,
    recipe_prefix,
    require_etcd,
)
from tests.support.etcd_proxy import EtcdProxy

# The first requests of an acquisition of a held lock: lease grant, key put
# with the oldest key read, then the predecessor read and the watches.
REQUESTS = [1, 2, 3, 4]


@pytest.fixture(autouse=True)
def _etcdctl() -> None:
    require_etcd(etcdctl=True)


def proxied_lock(proxy: EtcdProxy, name: str) -> object:
    from pylock.etcd import EtcdLock

    lock = EtcdLock(name, endpoints=proxy.endpoint, ttl=10)  # no keep-alive within the test
    lock.holder()  # the channel is connected: what follows is the acquisition's own
    return lock


@pytest.mark.parametrize("nth", REQUESTS)
def test_cancelling_at_any_request_leaves_nothing_in_etcd(etcd, lock_name, nth):
    holder = etcd_lock(etcd, lock_name)
    holder.acquire()
    before = leases(etcd.endpoint_list)
    with EtcdProxy(etcd.endpoints[0]) as proxy:
        waiter = proxied_lock(proxy, lock_name)
        proxy.hold_answer(nth)

        async def main() -> None:
            task = asyncio.ensure_future(waiter.acquire_async())
            await asyncio.to_thread(proxy.wait_held)
            task.cancel()
            await asyncio.to_thread(proxy.wait_client_moved)
            proxy.release()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
    assert not waiter.locked
    assert leases(etcd.endpoint_list) - before == set()
    assert [key[2] for key in keys(etcd.endpoint_list, recipe_prefix(lock_name))] == [
        holder.fencing_token
    ]
    holder.release()


@pytest.mark.parametrize("nth", REQUESTS)
def test_a_timeout_at_any_request_leaves_nothing_and_says_what_it_knew(etcd, lock_name, nth):
    from pylock.etcd import EtcdTimeout

    holder = holder_process(etcd.endpoint_list, lock_name, ttl=10)
    try:
        holder.send("acquire")
        expect_line(holder, "locked")
        before = leases(etcd.endpoint_list)
        with EtcdProxy(etcd.endpoints[0]) as proxy:
            waiter = proxied_lock(proxy, lock_name)
            proxy.hold_answer(nth)
            failed: list[BaseException] = []

            def wait() -> None:
                try:
                    waiter.acquire(timeout=2.0)  # etcd answers the requests before, however busy
                except BaseException as exc:
                    failed.append(exc)

            thread = threading.Thread(target=wait)
            thread.start()
            proxy.wait_held()
            proxy.wait_client_moved()  # the timeout passed: the client gave up
            proxy.release()
            thread.join(30)
        [exc] = failed
        assert isinstance(exc, LockTimeout)
        if nth <= 2:  # etcd had not said who holds the lock yet
            assert isinstance(exc, EtcdTimeout) and exc.holder is None
            assert "had not answered" in str(exc) and "held by" not in str(exc)
        else:
            assert not isinstance(exc, EtcdTimeout)
            assert exc.holder is not None and exc.holder.pid == holder.pid
        assert leases(etcd.endpoint_list) - before == set()
        assert len(keys(etcd.endpoint_list, recipe_prefix(lock_name))) == 1
    finally:
        holder.close()


@pytest.mark.parametrize("nth", [1, 2])
def test_a_timeout_before_etcd_answered_on_a_free_lock_is_not_held(etcd, lock_name, nth):
    from pylock.etcd import EtcdTimeout

    before = leases(etcd.endpoint_list)
    with EtcdProxy(etcd.endpoints[0]) as proxy:
        lock = proxied_lock(proxy, lock_name)
        proxy.hold_answer(nth)
        failed: list[BaseException] = []
        thread = threading.Thread(target=lambda: failed.append(_raised(lock.acquire, 1.0)))
        thread.start()
        proxy.wait_held()
        proxy.wait_client_moved()
        proxy.release()
        thread.join(30)
    [exc] = failed
    assert isinstance(exc, EtcdTimeout), exc
    assert "held by" not in str(exc) and "not known" in str(exc)
    assert leases(etcd.endpoint_list) - before == set()
    assert keys(etcd.endpoint_list, recipe_prefix(lock_name)) == []


def _raised(acquire: object, timeout: float) -> BaseException | None:
    try:
        acquire(timeout=timeout)  # type: ignore[operator]
    except BaseException as exc:
        return exc
    return None


def test_timeout_zero_is_a_try(etcd, lock_name):
    lock = etcd_lock(etcd, lock_name)
    assert lock.acquire(timeout=0)  # free: taken, however long etcd takes to say so
    other = etcd_lock(etcd, lock_name)
    with pytest.raises(LockTimeout) as held:
        other.acquire(timeout=0)
    assert held.value.timeout == 0 and held.value.holder.pid == os.getpid()
    assert held.value.holder.fencing_token == lock.fencing_token
    assert contenders(etcd.endpoint_list, lock_name, at_least=1) == 1  # nothing left behind

    async def try_async() -> None:
        with pytest.raises(LockTimeout):
            await other.acquire_async(timeout=0)
        await lock.release_async()
        assert await other.acquire_async(timeout=0)
        await other.release_async()

    asyncio.run(try_async())


def test_tiny_timeouts_on_a_free_lock_take_it_or_say_etcd_had_not_answered(etcd, lock_name):
    from pylock.etcd import EtcdTimeout

    before = leases(etcd.endpoint_list)
    lock = etcd_lock(etcd, lock_name)
    lock.holder()  # connected: an unconnected channel is "unreachable" instead
    outcomes = set()
    for timeout in (0.0002, 0.0005, 0.001, 0.002, 0.005) * 6:
        try:
            lock.acquire(timeout=timeout)
        except EtcdTimeout as exc:
            assert "held by" not in str(exc)
            outcomes.add("no answer")
        else:
            lock.release()
            outcomes.add("taken")
    assert outcomes <= {"no answer", "taken"}
    assert keys(etcd.endpoint_list, recipe_prefix(lock_name)) == []
    assert leases(etcd.endpoint_list) - before == set()


# What gRPC and etcd say when a deadline passes, and gRPC's words for an
# outage that look alike.
CLIENT_TIMER = ("DEADLINE_EXCEEDED", "Deadline Exceeded")
ETCD_REQUEST_TIMEOUT = ("UNAVAILABLE", "etcdserver: request timed out")
ETCD_CONTEXT = ("UNKNOWN", "context deadline exceeded")  # etcd 3.4 passing Go's error on
GRPC_CONNECT = (
    "UNAVAILABLE",
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: "
    "connection attempt timed out before receiving SETTINGS frame",
)
PROXY_DIAL = ("UNAVAILABLE", "upstream connect error: context deadline exceeded")


@pytest.mark.parametrize(
    ("error", "passed", "expected"),
    [
        (CLIENT_TIMER, True, "timeout"),
        (CLIENT_TIMER, False, "timeout"),  # gRPC's clock said so
        (ETCD_REQUEST_TIMEOUT, True, "timeout"),
        (ETCD_CONTEXT, True, "timeout"),
        (ETCD_REQUEST_TIMEOUT, False, "unavailable"),
        (ETCD_CONTEXT, False, "unavailable"),
        (GRPC_CONNECT, False, "unavailable"),
        (PROXY_DIAL, False, "unavailable"),
    ],
)
def test_a_passed_deadline_is_a_timeout_and_an_outage_is_not(
    error: tuple[str, str], passed: bool, expected: str
) -> None:
    """A loaded client's timer can fire after etcd's answer that the deadline it
    was sent has passed: once the caller's deadline has passed, that is a
    timeout.  The same words before the deadline (gRPC's failed connection
    attempt, a proxy's dial timeout) are an outage, never an early timeout.
    The errors are built here because no real etcd sends them on demand; the
    tiny-timeouts test above meets etcd's under load."""
    pytest.importorskip("aetcd")
    import time

    import grpc.aio

    from pylock.etcd.client import Cluster, DeadlinePassed
    from pylock.etcd.errors import EtcdUnavailable

    code, details = error
    deadline = time.monotonic() + (-0.001 if passed else 60)

    async def translated() -> tuple[BaseException, BaseException]:
        cluster = Cluster(("127.0.0.1:9",))  # a channel connects only when used
        rpc_error = grpc.aio.AioRpcError(getattr(grpc.StatusCode, code), None, None, details)
        try:
            return cluster.translate(rpc_error, deadline), cluster.translate(rpc_error, None)
        finally:
            await cluster.channel.close()

    with_deadline, without = asyncio.run(translated())
    kinds = {"timeout": DeadlinePassed, "unavailable": EtcdUnavailable}
    assert isinstance(with_deadline, kinds[expected])
    assert isinstance(without, EtcdUnavailable)  # the request limit passed: etcd is silent
