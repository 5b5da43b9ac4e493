"""A contender's key deleted by another client (`etcdctl del`): the holder
knows it lost the lock, a waiter is told its place is gone."""

from __future__ import annotations

import os
import threading

import pytest

from tests.support.etcd_locks import (
    contenders,
    etcd_lock,
    etcdctl,
    expect_line,
    holder_process,
    keys,
    leases,
    recipe_prefix,
    require_etcd,
)


@pytest.fixture(autouse=True)
def _etcdctl() -> None:
    require_etcd(etcdctl=True)


def test_a_holder_whose_key_is_deleted_is_lost_and_says_so(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name, ttl=5)
    try:
        holder.send("acquire")
        token = int(expect_line(holder, "locked"))
        [(key, lease, _)] = keys(etcd.endpoint_list, recipe_prefix(lock_name))
        etcdctl(etcd.endpoint_list, "del", os.fsdecode(key))
        expect_line(holder, "on_lost", within=20)
        holder.send("lost")
        assert expect_line(holder, "lost") == "True"
        # Another process holds the lock now, with a greater fencing token.
        other = etcd_lock(etcd, lock_name)
        other.acquire(timeout=10)
        assert other.fencing_token > token
        # The stale holder's release revokes only its own lease.
        holder.send("release")
        expect_line(holder, "released")
        assert lease not in leases(etcd.endpoint_list)
        assert other.holder().fencing_token == other.fencing_token and not other.lost
        other.release()
    finally:
        holder.close()
    assert "was deleted in etcd" in holder.stderr and "lived on" in holder.stderr


def test_a_waiter_whose_key_is_deleted_is_told_exactly_that(etcd, lock_name):
    from pylock.etcd import EtcdLost, EtcdUnavailable

    holder, waiter = etcd_lock(etcd, lock_name), etcd_lock(etcd, lock_name)
    holder.acquire()
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.acquire(timeout=60)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    contenders(etcd.endpoint_list, lock_name, at_least=2)
    ours, theirs = keys(etcd.endpoint_list, recipe_prefix(lock_name))
    etcdctl(etcd.endpoint_list, "del", os.fsdecode(theirs[0]))
    thread.join(20)  # while the holder still holds: told at once, not at its release
    assert not thread.is_alive(), "the waiter did not notice its key was deleted"
    [exc] = failed
    assert isinstance(exc, EtcdLost) and not isinstance(exc, EtcdUnavailable)
    assert exc.key == theirs[0]
    assert "was deleted in etcd" in str(exc) and "while it waited" in str(exc)
    assert "expired" not in str(exc)
    assert not waiter.locked and theirs[1] not in leases(etcd.endpoint_list)
    assert holder.locked and not holder.lost and holder.fencing_token == ours[2]
    holder.release()
