"""What other etcd clients may put in a lock's queue, and what etcd refuses:
neither breaks EtcdLock, holder() or `pylock who --etcd`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pylock import LockHeld, LockTimeout
from tests.support import env_with_repo
from tests.support.etcd_locks import (
    ETCDCTL,
    etcd_lock,
    etcdctl,
    keys,
    leases,
    recipe_prefix,
    require_etcd,
)

DEEP = 20_000  # within the record's size bound, far past Python's recursion limit

HOSTILE_VALUES = {
    "huge time": b'{"pid": 4242, "acquired_at": 1e300}',
    "NaN time": b'{"pid": 4242, "acquired_at": NaN}',
    "far past": b'{"pid": 4242, "acquired_at": -1e18}',
    "deep info": b'{"pid": 4242, "info": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "50,000 deep": b"[" * 50_000 + b"]" * 50_000,
    "deep dicts": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "huge pid": b'{"pid": 1e400, "argv": "not a list", "info": []}',
    "escapes": b'{"pid": 7, "host": "\\u001b]0;owned\\u0007", "program": "x\\r\\u202e"}',
    "not UTF-8": b'\xff\xfe{"pid": 1}',
}


def put(endpoints: str, key: bytes, value: bytes) -> None:
    """etcdctl put KEY (the value from stdin, bound to no lease: another client's key)."""
    subprocess.run(
        [ETCDCTL, "--endpoints", endpoints, "put", os.fsdecode(key)],
        input=value,
        env=dict(os.environ, ETCDCTL_API="3"),
        capture_output=True,
        check=True,
        timeout=60,
    )


def no_controls(text: str) -> bool:
    return not any((ord(c) < 0x20 and c != "\n") or c in "\x7f\u202e" for c in text)


@pytest.mark.parametrize("value", HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
def test_a_hostile_holder_value_is_named_never_raised(etcd, lock_name, value):
    require_etcd(etcdctl=True)
    key = recipe_prefix(lock_name) + b"\x1b[31mintruder"
    put(etcd.endpoint_list, key, value)
    try:
        lock = etcd_lock(etcd, lock_name)
        holder = lock.holder()
        assert holder is not None and holder.key == key and holder.lease == 0
        assert "stays until deleted" in holder.describe() and no_controls(holder.describe())
        for attempt in (
            lambda: lock.acquire(blocking=False),
            lambda: lock.acquire(timeout=0),
            lambda: lock.acquire(timeout=1.0),  # long enough for etcd to answer, busy or not
        ):
            with pytest.raises(LockHeld) as held:
                attempt()
            assert held.value.holder is not None and held.value.holder.key == key
            assert no_controls(str(held.value)) and "\\x1b[31mintruder" in str(held.value)
        assert isinstance(held.value, LockTimeout)
        assert keys(etcd.endpoint_list, recipe_prefix(lock_name)) == [
            (key, 0, holder.fencing_token)
        ]
        cli = [sys.executable, "-m", "pylock", "who", "--etcd", etcd.endpoint_list]
        text = subprocess.run(
            [*cli, lock_name], env=env_with_repo(), capture_output=True, text=True
        )
        assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
        assert no_controls(text.stdout) and "held by" in text.stdout
        doc = subprocess.run(
            [*cli, "--json", lock_name], env=env_with_repo(), capture_output=True, text=True
        )
        [report] = json.loads(doc.stdout)
        assert report["held"] and report["holders"][0]["fencing_token"] == holder.fencing_token
    finally:
        etcdctl(etcd.endpoint_list, "del", os.fsdecode(key))


def test_a_holder_record_within_bounds_is_read(etcd, lock_name):
    require_etcd(etcdctl=True)
    key = recipe_prefix(lock_name) + b"by-hand"
    record = {"pid": 4242, "host": "far", "program": "job", "argv": ["job", "-x"]}
    put(
        etcd.endpoint_list,
        key,
        json.dumps({**record, "acquired_at": 1e9, "info": {"a": [1]}}).encode(),
    )
    try:
        holder = etcd_lock(etcd, lock_name).holder()
        assert (holder.pid, holder.hostname, holder.argv) == (4242, "far", ("job", "-x"))
        assert holder.acquired_at.year == 2001 and holder.info == {"a": [1]} and not holder.note
    finally:
        etcdctl(etcd.endpoint_list, "del", os.fsdecode(key))


@pytest.mark.parametrize("megabytes", [2.0, 1.6])
def test_a_request_etcd_refuses_is_a_clear_error_not_an_outage(etcd, megabytes):
    from pylock.etcd import EtcdRefused, EtcdUnavailable

    name = "n" * int(megabytes * 1024 * 1024)
    before = leases(etcd.endpoint_list)
    lock = etcd_lock(etcd, name)
    for call in (lock.acquire, lambda: lock.acquire(timeout=10), lock.holder):
        with pytest.raises(EtcdRefused) as refused:
            call()
        assert not isinstance(refused.value, EtcdUnavailable)
        message = str(refused.value)
        assert "max-request-bytes" in message and "larger than it accepts" in message
        assert "unreachable" not in message and len(message) < 1000
    assert not lock.locked
    assert leases(etcd.endpoint_list) <= before  # the lease granted first was revoked
