"""The etcd tests' harness: which etcd they use, and EtcdLock seen from outside
(a child process holding one, the contenders queued in etcd, `etcdctl lock`
holders and waiters, the leases etcd keeps).

The tests start their own etcd (tests/support/etcd.py), so ``pytest tests``
needs nothing running.  Without the etcd binary or the `etcd` extra the etcd
tests skip with the reason, unless PYLOCK_REQUIRE_ETCD=1 (set by .ci/run),
which turns that skip into a failure: CI never skips them.  On Python 3.9,
where aetcd does not exist, they skip saying so whatever the variable says.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.children import Child, Script
from tests.support.etcd import EtcdCluster, etcd_available

ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


# aetcd, the etcd extra's client, exists for Python 3.10 and later only: there
# the extra installs nothing, and no install could make these tests run.
BEFORE_AETCD = sys.version_info < (3, 10)


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the etcd tests run on Linux"
    if BEFORE_AETCD:
        return "the etcd tests need Python 3.10+: aetcd, the etcd extra's client, has no 3.9"
    if not etcd_available():
        return "no etcd binary (apt-get install etcd-server)"
    try:
        import pylock.etcd  # noqa: F401  (before gRPC: it sets gRPC's fork handling)
    except ImportError:
        return "the etcd extra is not installed (pip install -e '.[etcd]')"
    return None


def require_etcd(etcdctl: bool = False) -> None:
    """Skip (or fail, under PYLOCK_REQUIRE_ETCD=1) without etcd, the extra, or
    with etcdctl=True Debian's etcd-client."""
    reason = _missing()
    if reason is None and etcdctl and not os.access(ETCDCTL, os.X_OK):
        reason = "no etcdctl (apt-get install etcd-client)"
    if reason is None:
        return
    if os.environ.get("PYLOCK_REQUIRE_ETCD") == "1" and not BEFORE_AETCD:
        pytest.fail(f"PYLOCK_REQUIRE_ETCD=1 but {reason}")
    pytest.skip(reason)


def end_etcd_thread() -> None:
    """The rest of the suite checks that pylock leaves no threads of its own:
    end the etcd thread a module's in-process locks started."""
    if "pylock.etcd.loop" in sys.modules:
        from pylock.etcd.loop import shutdown

        shutdown()


class RunningCluster:
    """A cluster started outside the tests: only its endpoints are known."""

    def __init__(self, endpoints: str) -> None:
        self.endpoints = [e.strip() for e in endpoints.split(",")]
        self.endpoint_list = ",".join(self.endpoints)


@contextlib.contextmanager
def etcd_for_tests() -> Iterator[Any]:
    """The etcd a test module's non-destructive tests share: the running cluster
    PYLOCK_ETCD_ENDPOINTS names, or a single node started here."""
    require_etcd()
    running = os.environ.get("PYLOCK_ETCD_ENDPOINTS")
    if running:
        yield RunningCluster(running)
        return
    with EtcdCluster(1) as cluster:
        yield cluster


# A child holding an etcd lock, driven by lines on stdin: "acquire", "release",
# "lost" (prints "lost True|False").  Its on_lost callback prints "on_lost".
HOLDER = textwrap.dedent(
    """
    import os, sys
    from pylock.etcd import EtcdLock
    def say(*words):  # one write per line: on_lost speaks from another thread
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())
    endpoints, name, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lock = EtcdLock(name, endpoints=endpoints, ttl=ttl, info={"role": "holder"},
                    on_lost=lambda lock: say("on_lost"))
    say("ready")
    for line in sys.stdin:
        word = line.strip()
        if word == "acquire":
            lock.acquire()
            say("locked", lock.fencing_token)
        elif word == "release":
            lock.release()
            say("released")
        elif word == "lost":
            say("lost", lock.lost)
    """
)


def etcd_lock(cluster: Any, name: str, **options: Any) -> Any:
    """An EtcdLock on the test cluster, with etcd's shortest TTL unless told."""
    from pylock.etcd import EtcdLock

    options.setdefault("ttl", 2)
    return EtcdLock(name, endpoints=cluster.endpoint_list, **options)


def holder_process(endpoints: str, name: str, ttl: int = 2) -> Script:
    child = Script(HOLDER, endpoints, name, str(ttl))
    child.expect("ready")
    return child


def expect_line(child: Script, prefix: str, within: float = 60.0) -> str:
    """The child's next line, which must start with prefix; a guard against a
    hang (a failure), never a synchronisation by time."""
    return child.expect(prefix, within=within)


def recipe_prefix(name: str, namespace: str = "") -> bytes:
    """The keys etcd's lock recipe queues NAME under (etcdctl's, Go's), spelled
    here on their own: the tests hold pylock to them."""
    return (namespace + name).encode() + b"/"


def contenders(
    endpoints: str, name: str, at_least: int, timeout: float = 30.0, namespace: str = ""
) -> int:
    """Wait, by an etcd watch on the lock's prefix, until at_least contenders
    have their keys in the queue; their number."""
    from aetcd import rpc

    from pylock.etcd.client import normalize_endpoints, prefix_end
    from pylock.etcd.loop import etcd_loop, run_blocking

    prefix = recipe_prefix(name, namespace)

    async def watch() -> int:
        cluster = etcd_loop().cluster(normalize_endpoints(endpoints))
        deadline = time.monotonic() + timeout
        while True:
            reply = await cluster.call(
                cluster.kv.Range,
                rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), count_only=True),
                deadline,
            )
            if reply.count >= at_least:
                return int(reply.count)
            create = rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_end(prefix), start_revision=reply.header.revision + 1
            )
            stop = asyncio.Event()

            async def requests(create: Any = create, stop: asyncio.Event = stop) -> Any:
                yield rpc.WatchRequest(create_request=create)
                await stop.wait()

            call = cluster.watch.Watch(requests(), timeout=deadline - time.monotonic())
            try:
                async for event in call:
                    if event.events:
                        break
            except rpc.AioRpcError as exc:
                if exc.code() != rpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                raise AssertionError(
                    f"{reply.count} contenders under {prefix!r} after {timeout} s, not {at_least}"
                ) from None
            finally:
                stop.set()
                call.cancel()

    return run_blocking(watch())


# -- etcd's own tools ---------------------------------------------------------------


def etcdctl(endpoints: str, *args: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    """etcdctl ARGS against the cluster (v3 API), checked."""
    return subprocess.run(
        [ETCDCTL, "--endpoints", endpoints, *args],
        env=dict(os.environ, ETCDCTL_API="3"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        **popen,
    )


def leases(endpoints: str) -> set[int]:
    """The IDs of every lease etcd keeps now (etcdctl lease list)."""
    lines = etcdctl(endpoints, "lease", "list").stdout.splitlines()
    return {int(line, 16) for line in lines[1:] if line.strip()}  # after "found N leases"


def keys(endpoints: str, prefix: bytes) -> list[tuple[bytes, int, int]]:
    """(key, lease, create revision) of every key under prefix, oldest first."""
    done = etcdctl(endpoints, "get", "--prefix", os.fsdecode(prefix), "-w", "json")
    found = [
        (base64.b64decode(kv["key"]), int(kv.get("lease", 0)), int(kv["create_revision"]))
        for kv in json.loads(done.stdout).get("kvs", [])
    ]
    return sorted(found, key=lambda item: item[2])


class EtcdctlLock(Child):
    """`etcdctl lock NAME -- sh ...`: etcd's own lock tool holding the lock for
    as long as its command runs.  The command prints "locked KEY REV PID" once
    etcdctl holds (REV: the revision etcdctl acquired at, ETCD_LOCK_REV) and
    sleeps; unlock() ends it, and etcdctl deletes its key.  Killing etcdctl
    itself (SIGKILL) leaves its key until its lease expires (ttl seconds)."""

    COMMAND = 'echo "locked $ETCD_LOCK_KEY $ETCD_LOCK_REV $$"; exec sleep 100000'

    def __init__(self, endpoints: str, name: str, ttl: int = 2) -> None:
        argv = [ETCDCTL, "--endpoints", endpoints, "lock", "--ttl", str(ttl), name]
        argv += ["--", "sh", "-c", self.COMMAND]
        super().__init__(argv, env=dict(os.environ, ETCDCTL_API="3"))
        self.key = b""
        self.revision = 0
        self.command_pid = 0

    def wait_locked(self, within: float = 60.0) -> bytes:
        """Its key, once it holds the lock."""
        key, revision, pid = self.expect("locked ", within=within).rsplit(" ", 2)
        self.key, self.revision, self.command_pid = key.encode(), int(revision), int(pid)
        return self.key

    def unlock(self) -> None:
        """End its command: etcdctl deletes its key and exits."""
        os.kill(self.command_pid, signal.SIGTERM)
        self.wait()
        self.command_pid = 0

    def close(self) -> None:
        if self.command_pid:  # etcdctl was killed: its command lives on
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.command_pid, signal.SIGKILL)
        super().close()
