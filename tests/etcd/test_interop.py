"""EtcdLock and etcd's own `etcdctl lock` (Go's concurrency.Mutex) on one name
are one lock: they exclude each other both ways, queue in one arrival order,
and pylock names an etcdctl holder for what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from pylock import LockHeld, LockTimeout
from tests.support import env_with_repo
from tests.support.etcd_locks import (
    EtcdctlLock,
    contenders,
    etcd_lock,
    etcdctl,
    expect_line,
    holder_process,
    keys,
    recipe_prefix,
    require_etcd,
)


@pytest.fixture(autouse=True)
def _etcdctl() -> None:
    require_etcd(etcdctl=True)


def current_revision(endpoints: str) -> int:
    done = etcdctl(endpoints, "get", "--prefix", "pylock-test-none/", "-w", "json")
    return int(json.loads(done.stdout)["header"]["revision"])


def pylock_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pylock", *args],
        env=env_with_repo(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_etcdctl_holder_excludes_etcdlock_and_is_named_for_what_it_is(etcd, lock_name):
    ctl = EtcdctlLock(etcd.endpoint_list, lock_name, ttl=5)
    try:
        key = ctl.wait_locked()
        [(seen_key, lease, created)] = keys(etcd.endpoint_list, recipe_prefix(lock_name))
        assert seen_key == key and key.startswith(recipe_prefix(lock_name))
        lock = etcd_lock(etcd, lock_name)
        for attempt in (lambda: lock.acquire(blocking=False), lambda: lock.acquire(timeout=1.0)):
            with pytest.raises(LockHeld) as held:
                attempt()
            holder = held.value.holder
            assert holder is not None and holder.key == key and holder.pid == 0
            assert holder.lease == lease and holder.fencing_token == created
            assert holder.ttl == 5 and 0 <= holder.ttl_left <= 5
            text = str(held.value)
            assert key.decode() in text and f"lease {lease:x}" in text
            assert f"fencing token {created}" in text and "etcdctl" in text
        assert isinstance(held.value, LockTimeout)
        assert lock.holder().key == key
        # The command line says it is held, by that key, never "free".
        who = pylock_cli("who", "--etcd", etcd.endpoint_list, lock_name)
        assert who.returncode == 0, who.stderr
        assert key.decode() in who.stdout and "free" not in who.stdout
        [report] = json.loads(
            pylock_cli("who", "--etcd", etcd.endpoint_list, "--json", lock_name).stdout
        )
        assert report["held"] and report["holders"][0]["key"] == key.decode()
        assert report["holders"][0]["fencing_token"] == created
        assert report["holders"][0]["lease"] == f"{lease:x}"
        assert 0 <= report["holders"][0]["ttl_left"] <= 5 and report["holders"][0]["ttl"] == 5
        run = pylock_cli("run", "--etcd", etcd.endpoint_list, "-n", lock_name, "--", "true")
        assert run.returncode == 1 and key.decode() in run.stderr
        # A pylock waiter queues behind it and takes over when etcdctl unlocks.
        got = threading.Event()
        waiter = threading.Thread(target=lambda: (lock.acquire(timeout=60), got.set()))
        waiter.start()
        contenders(etcd.endpoint_list, lock_name, at_least=2)
        assert not got.is_set()
        ctl.unlock()
        waiter.join(60)
        assert got.is_set() and lock.fencing_token > created
        lock.release()
    finally:
        ctl.close()


def test_an_etcdlock_holder_excludes_etcdctl_lock(etcd, lock_name):
    lock = etcd_lock(etcd, lock_name)
    lock.acquire()
    ctl = EtcdctlLock(etcd.endpoint_list, lock_name)
    try:
        assert contenders(etcd.endpoint_list, lock_name, at_least=2) == 2
        ours, theirs = keys(etcd.endpoint_list, recipe_prefix(lock_name))
        assert ours[2] == lock.fencing_token and theirs[2] > ours[2]
        lock.release()
        released_at = current_revision(etcd.endpoint_list)
        ctl.wait_locked()
        # etcdctl saw itself first only after pylock's key was deleted.
        assert ctl.revision >= released_at
        assert lock.holder().key == ctl.key
        ctl.unlock()
        assert lock.holder() is None
    finally:
        ctl.close()


def test_etcdctl_and_pylock_waiters_queue_in_one_arrival_order(etcd, lock_name):
    first = holder_process(etcd.endpoint_list, lock_name)
    waiters: list[object] = []
    try:
        first.send("acquire")
        expect_line(first, "locked")
        for n, kind in enumerate(("etcdctl", "pylock", "etcdctl", "pylock")):
            if kind == "etcdctl":
                waiters.append(EtcdctlLock(etcd.endpoint_list, lock_name))
            else:
                waiter = holder_process(etcd.endpoint_list, lock_name)
                waiter.send("acquire")
                waiters.append(waiter)
            contenders(etcd.endpoint_list, lock_name, at_least=n + 2)  # queued, by watch
        queued = [created for _, _, created in keys(etcd.endpoint_list, recipe_prefix(lock_name))]
        first.send("release")
        expect_line(first, "released")
        taken = []
        for waiter in waiters:
            # Each holds until told: had a later one taken the lock, this one
            # would never get it, and the read below would fail.
            if isinstance(waiter, EtcdctlLock):
                waiter.wait_locked()
                taken.append(keys(etcd.endpoint_list, waiter.key)[0][2])
                waiter.unlock()
            else:
                taken.append(int(expect_line(waiter, "locked")))
                waiter.send("release")
                expect_line(waiter, "released")
        assert taken == queued[1:]
    finally:
        for child in (first, *waiters):
            child.close()


def test_sigkill_of_an_etcdctl_holder_hands_the_lock_on_at_its_lease_expiry(etcd, lock_name):
    ctl = EtcdctlLock(etcd.endpoint_list, lock_name, ttl=2)
    try:
        ctl.wait_locked()
        created = keys(etcd.endpoint_list, ctl.key)[0][2]
        lock = etcd_lock(etcd, lock_name)
        got = threading.Event()
        waiter = threading.Thread(target=lambda: (lock.acquire(timeout=60), got.set()))
        waiter.start()
        contenders(etcd.endpoint_list, lock_name, at_least=2)
        killed_at = time.monotonic()
        ctl.kill()
        waiter.join(60)
        assert got.is_set() and lock.fencing_token > created
        # The lease's expiry, not the death, freed it: a 2 s TTL renewed every
        # 2/3 s outlives its holder by more than 1 s.
        assert time.monotonic() - killed_at > 1.0
        assert lock.holder().pid == os.getpid()
        lock.release()
    finally:
        ctl.close()


def test_etcdctl_waits_behind_a_sigkilled_pylock_holder_until_its_lease_expires(etcd, lock_name):
    holder = holder_process(etcd.endpoint_list, lock_name, ttl=2)
    ctl = None
    try:
        holder.send("acquire")
        token = int(expect_line(holder, "locked"))
        ctl = EtcdctlLock(etcd.endpoint_list, lock_name)
        contenders(etcd.endpoint_list, lock_name, at_least=2)
        killed_at = time.monotonic()
        holder.kill()
        ctl.wait_locked()
        assert time.monotonic() - killed_at > 1.0
        assert keys(etcd.endpoint_list, ctl.key)[0][2] > token
        ctl.unlock()
    finally:
        holder.close()
        if ctl is not None:
            ctl.close()
