"""The etcd tests' harness: which etcd they use, and EtcdLock seen from outside
(a child process holding one, the contenders queued in etcd).

The tests start their own etcd (tests/support/etcd.py), so ``pytest tests``
needs nothing running.  Without the etcd binary or the `etcd` extra the etcd
tests skip with the reason, unless PYLOCK_REQUIRE_ETCD=1 (set by .ci/run),
which turns that skip into a failure: CI never skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.children import Script
from tests.support.etcd import EtcdCluster, etcd_available


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the etcd tests run on Linux"
    if not etcd_available():
        return "no etcd binary (apt-get install etcd-server)"
    try:
        import pylock.etcd  # noqa: F401  (before gRPC: it sets gRPC's fork handling)
    except ImportError:
        return "the etcd extra is not installed (pip install -e '.[etcd]')"
    return None


def require_etcd() -> None:
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("PYLOCK_REQUIRE_ETCD") == "1":
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


def holder_process(endpoints: str, name: str, ttl: int = 2) -> Script:
    child = Script(HOLDER, endpoints, name, str(ttl))
    child.expect("ready")
    return child


def expect_line(child: Script, prefix: str, within: float = 60.0) -> str:
    """The child's next line, which must start with prefix; a guard against a
    hang (a failure), never a synchronisation by time."""
    return child.expect(prefix, within=within)


def contenders(endpoints: str, name: str, at_least: int, timeout: float = 30.0) -> int:
    """Wait, by an etcd watch on the lock's prefix, until at_least contenders
    have their keys in the queue; their number."""
    from aetcd import rpc

    from pylock.etcd.client import normalize_endpoints, prefix_end
    from pylock.etcd.lock import EtcdLock
    from pylock.etcd.loop import etcd_loop, run_blocking

    prefix = EtcdLock(name, endpoints=endpoints)._queue.prefix

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
            finally:
                stop.set()
                call.cancel()

    return run_blocking(watch())
