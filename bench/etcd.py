"""EtcdLock beside pylock's flock Lock, and beside etcd's own round trips, in one run.

    python bench/etcd.py                      # starts a local single-node etcd
    python bench/etcd.py --endpoints H:P,...  # or uses a running cluster
    python bench/etcd.py --trials 50          # fewer trials (default 200)

Needs the `etcd` extra (aetcd) and, without --endpoints, Debian's etcd-server.
Prints, as median and p99 with the trial count:

- uncontended acquire + release: Lock (flock on a local file) and EtcdLock,
  and the floor: the four etcd requests an EtcdLock acquisition and release
  make (lease grant, create-if-absent transaction, predecessor read, lease
  revoke), sent back to back on the same channel with nothing around them;
- handoff: a holder process releases, a waiter in another process blocked in
  acquire() returns; from just before release() to just after acquire().
  Before each release the waiter has been blocked for 20-70 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def summary(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) / 1e3, p99 / 1e3  # microseconds


def fmt(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def interleaved(
    trials: int, pairs: dict[str, Callable[[], None]], rounds: int = 10
) -> dict[str, list[int]]:
    """Each pair timed trials times, in rounds that alternate between them, so a
    change of machine load during the run weighs on all of them alike."""
    for pair in pairs.values():
        pair()  # warm: connection, lazy imports
    samples: dict[str, list[int]] = {name: [] for name in pairs}
    per_round = max(1, trials // rounds)
    for _ in range(rounds):
        for name, pair in pairs.items():
            for _ in range(per_round):
                start = now()
                pair()
                samples[name].append(now() - start)
    return samples


def etcd_floor(endpoints: str) -> Callable[[], None]:
    from aetcd import rpc

    from pylock.etcd.client import normalize_endpoints, prefix_end
    from pylock.etcd.loop import etcd_loop, run_blocking

    prefix = b"pylock-bench/floor/"

    async def four_requests() -> None:
        cluster = etcd_loop().cluster(normalize_endpoints(endpoints))
        grant = await cluster.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=10), timeout=5)
        key = prefix + f"{grant.ID:016x}".encode()
        absent = rpc.Compare(
            result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=0
        )
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"{}", lease=grant.ID))
        created = await cluster.kv.Txn(rpc.TxnRequest(compare=[absent], success=[put]), timeout=5)
        ours = rpc.Compare(
            result=rpc.Compare.EQUAL,
            target=rpc.Compare.CREATE,
            key=key,
            create_revision=created.header.revision,
        )
        before = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            max_create_revision=created.header.revision - 1,
            limit=1,
        )
        await cluster.kv.Txn(
            rpc.TxnRequest(compare=[ours], success=[rpc.RequestOp(request_range=before)]),
            timeout=5,
        )
        await cluster.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=grant.ID), timeout=5)

    return lambda: run_blocking(four_requests())


WAITER = """
import sys, time
kind, where = sys.argv[1], sys.argv[2]
if kind == "etcd":
    from pylock.etcd import EtcdLock
    lock = EtcdLock("bench-handoff", endpoints=where, ttl=10)
else:
    import pylock
    lock = pylock.Lock(where)
print("ready", flush=True)
for line in sys.stdin:
    lock.acquire()
    print(time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
"""


def handoff(kind: str, lock: object, where: str, trials: int, rng: random.Random) -> list[int]:
    env = dict(os.environ, PYTHONPATH=REPO)
    child = subprocess.Popen(
        [sys.executable, "-c", WAITER, kind, where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    samples = []
    try:
        for trial in range(trials + 1):
            lock.acquire()  # type: ignore[attr-defined]
            child.stdin.write("go\n")
            child.stdin.flush()
            time.sleep(rng.uniform(0.020, 0.070))  # the waiter is blocked by now
            start = now()
            lock.release()  # type: ignore[attr-defined]
            acquired = int(child.stdout.readline())
            if trial:  # the first one warms the waiter's connection
                samples.append(acquired - start)
            child.stdin.write("release\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "released"
    finally:
        child.stdin.close()
        child.wait(30)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", help="a running etcd (default: start one)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--handoff-trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import pylock
    from pylock.etcd import EtcdLock

    cluster = None
    if args.endpoints is None:
        from tests.support.etcd import EtcdCluster

        cluster = EtcdCluster(1)
        endpoints = cluster.endpoint_list
    else:
        endpoints = args.endpoints
    rng = random.Random(args.seed)
    rows: list[tuple[str, list[int]]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bench.lock")
            flock = pylock.Lock(path)
            etcd = EtcdLock("bench-uncontended", endpoints=endpoints, ttl=10)

            def flock_pair() -> None:
                flock.acquire()
                flock.release()

            def etcd_pair() -> None:
                etcd.acquire()
                etcd.release()

            uncontended = interleaved(
                args.trials,
                {
                    "uncontended, Lock (flock)": flock_pair,
                    "uncontended, EtcdLock": etcd_pair,
                    "uncontended, etcd floor (4 requests)": etcd_floor(endpoints),
                },
            )
            rows.extend(uncontended.items())
            holder = EtcdLock("bench-handoff", endpoints=endpoints, ttl=10)
            rows.append(
                ("handoff, Lock (flock)", handoff("flock", flock, path, args.handoff_trials, rng))
            )
            rows.append(
                ("handoff, EtcdLock", handoff("etcd", holder, endpoints, args.handoff_trials, rng))
            )
    finally:
        if cluster is not None:
            cluster.close()

    figures = {name: summary(samples) for name, samples in rows}
    where = "local single-node etcd" if cluster is not None else endpoints
    print(f"\nEtcdLock on {where} beside flock (median / p99 / trials)\n")
    print("| | median | p99 | trials |")
    print("|---|---|---|---|")
    for name, samples in rows:
        median, p99 = figures[name]
        print(f"| {name} | {fmt(median)} | {fmt(p99)} | {len(samples)} |")
    up = figures["uncontended, EtcdLock"][0]
    floor = figures["uncontended, etcd floor (4 requests)"][0]
    print("\nratios (medians):")
    print(f"  uncontended EtcdLock / etcd floor: {up / floor:.2f}x")
    print(
        f"  uncontended EtcdLock / flock Lock: {up / figures['uncontended, Lock (flock)'][0]:.0f}x"
    )
    handoff_ratio = figures["handoff, EtcdLock"][0] / figures["handoff, Lock (flock)"][0]
    print(f"  handoff EtcdLock / flock Lock: {handoff_ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
