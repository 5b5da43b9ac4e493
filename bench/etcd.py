"""EtcdLock beside etcd's own `etcdctl lock`, etcd's bare requests and flock, in one run.

    python bench/etcd.py                      # starts a local single-node etcd
    python bench/etcd.py --endpoints H:P,...  # or uses a running cluster
    python bench/etcd.py --trials 50          # fewer trials (default 200)

Needs the `etcd` extra (aetcd), Debian's etcd-client (etcdctl) and, without
--endpoints, etcd-server.  Prints, as median and p99 with the trial count:

- uncontended acquire + release in a running process: Lock (flock on a local
  file), EtcdLock, and the floor: the three requests etcd's lock recipe needs
  (lease grant, the put-and-read-oldest transaction, lease revoke) sent back
  to back on the same channel with nothing around them;
- uncontended acquire + release as a command, the whole process timed:
  `etcdctl lock NAME -- true` beside `pylock run --etcd EP NAME -- true`
  (both start, connect, lock, run `true`, unlock and exit);
- handoff: a holder releases, a waiter in another process takes the lock;
  from just before release() to the waiter's report.  Waiters: a process
  blocked in EtcdLock.acquire() (reports at once), Lock's, and the two
  commands `etcdctl lock NAME -- echo` and `pylock run --etcd ... -- echo`
  (reported when the `echo` they run writes its line, so both include one
  fork and exec).  Before each release the waiter has queued (its key seen
  in etcd, by a watch) and had time to settle into its wait: 20-70 ms for
  a process blocked in acquire(), 200-300 ms for a command just started
  (a fresh etcdctl takes tens of milliseconds more to start watching).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


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
    """The recipe's three requests, bare, on pylock's channel."""
    from aetcd import rpc

    from pylock.etcd.client import normalize_endpoints, prefix_end
    from pylock.etcd.loop import etcd_loop, run_blocking

    prefix = b"bench-floor/"

    async def three_requests() -> None:
        cluster = etcd_loop().cluster(normalize_endpoints(endpoints))
        grant = await cluster.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=10), timeout=5)
        key = prefix + b"%x" % grant.ID
        absent = rpc.Compare(
            result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=0
        )
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"{}", lease=grant.ID))
        oldest = rpc.RequestOp(
            request_range=rpc.RangeRequest(
                key=prefix,
                range_end=prefix_end(prefix),
                sort_order=rpc.RangeRequest.ASCEND,
                sort_target=rpc.RangeRequest.CREATE,
                limit=1,
            )
        )
        await cluster.kv.Txn(rpc.TxnRequest(compare=[absent], success=[put, oldest]), timeout=5)
        await cluster.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=grant.ID), timeout=5)

    return lambda: run_blocking(three_requests())


def etcdctl_argv(endpoints: str, name: str, *command: str) -> list[str]:
    return [ETCDCTL, "--endpoints", endpoints, "lock", "--ttl", "10", name, "--", *command]


def pylock_argv(endpoints: str, name: str, *command: str) -> list[str]:
    return [sys.executable, "-m", "pylock", "run", "--etcd", endpoints, name, "--", *command]


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=REPO, ETCDCTL_API="3")


def command_pair(argv: list[str]) -> Callable[[], None]:
    """One whole command, from start to exit."""

    def pair() -> None:
        subprocess.run(argv, env=child_env(), stdout=subprocess.DEVNULL, check=True)

    return pair


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
    """Library waiters: one process blocked in acquire(), told to wait each trial."""
    child = subprocess.Popen(
        [sys.executable, "-c", WAITER, kind, where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    samples = []
    try:
        for trial in range(trials + 1):
            lock.acquire()  # type: ignore[attr-defined]
            child.stdin.write("go\n")
            child.stdin.flush()
            if kind == "etcd":
                queued(where, "bench-handoff")
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


def queued(endpoints: str, name: str) -> None:
    """Until a waiter's key is in the queue behind the holder's (an etcd watch)."""
    from tests.support.etcd_locks import contenders

    contenders(endpoints, name, at_least=2, timeout=60)


def command_handoff(
    argv: list[str], holder: object, endpoints: str, trials: int, rng: random.Random
) -> list[int]:
    """Command waiters: a new process each trial, queued behind holder; timed
    until the command it runs (`echo`) writes its line."""
    samples = []
    for _ in range(trials):
        holder.acquire()  # type: ignore[attr-defined]
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=child_env())
        assert child.stdout is not None
        try:
            queued(endpoints, holder.name)  # type: ignore[attr-defined]
            time.sleep(rng.uniform(0.200, 0.300))  # settled into its wait by now
            start = now()
            holder.release()  # type: ignore[attr-defined]
            assert child.stdout.readline().strip() == "handed-over"
            samples.append(now() - start)
        finally:
            child.stdout.close()
            child.wait(60)
    return samples


def measure(args: argparse.Namespace, endpoints: str, tmp: str) -> list[tuple[str, list[int]]]:
    import pylock
    from pylock.etcd import EtcdLock

    rng = random.Random(args.seed)
    path = os.path.join(tmp, "bench.lock")
    flock = pylock.Lock(path)
    etcd = EtcdLock("bench-uncontended", endpoints=endpoints, ttl=10)

    def flock_pair() -> None:
        flock.acquire()
        flock.release()

    def etcd_pair() -> None:
        etcd.acquire()
        etcd.release()

    rows: list[tuple[str, list[int]]] = []
    rows += interleaved(
        args.trials,
        {
            "uncontended, Lock (flock)": flock_pair,
            "uncontended, EtcdLock": etcd_pair,
            "uncontended, etcd floor (3 requests)": etcd_floor(endpoints),
        },
    ).items()
    rows += interleaved(
        args.command_trials,
        {
            "command, etcdctl lock": command_pair(etcdctl_argv(endpoints, "bench-cmd", "true")),
            "command, pylock run --etcd": command_pair(pylock_argv(endpoints, "bench-cmd", "true")),
        },
        rounds=5,
    ).items()
    holder = EtcdLock("bench-handoff", endpoints=endpoints, ttl=10)
    trials = args.handoff_trials
    rows.append(("handoff, Lock (flock)", handoff("flock", flock, path, trials, rng)))
    rows.append(("handoff, EtcdLock", handoff("etcd", holder, endpoints, trials, rng)))
    echo = ("echo", "handed-over")
    cmd_holder = EtcdLock("bench-cmd-handoff", endpoints=endpoints, ttl=10)
    for name, argv in (
        ("handoff, etcdctl lock -- echo", etcdctl_argv(endpoints, "bench-cmd-handoff", *echo)),
        ("handoff, pylock run --etcd -- echo", pylock_argv(endpoints, "bench-cmd-handoff", *echo)),
    ):
        samples = command_handoff(argv, cmd_holder, endpoints, args.command_trials, rng)
        rows.append((name, samples))
    return rows


def report(rows: list[tuple[str, list[int]]], where: str) -> None:
    figures = {name: summary(samples) for name, samples in rows}
    print(f"\nEtcdLock on {where} beside etcdctl, etcd's requests and flock (median / p99)\n")
    print("| | median | p99 | trials |")
    print("|---|---|---|---|")
    for name, samples in rows:
        median, p99 = figures[name]
        print(f"| {name} | {fmt(median)} | {fmt(p99)} | {len(samples)} |")

    def ratio(a: str, b: str) -> float:
        return figures[a][0] / figures[b][0]

    print("\nratios (medians):")
    for a, b in (
        ("uncontended, EtcdLock", "uncontended, etcd floor (3 requests)"),
        ("uncontended, EtcdLock", "uncontended, Lock (flock)"),
        ("command, pylock run --etcd", "command, etcdctl lock"),
        ("handoff, EtcdLock", "handoff, Lock (flock)"),
        ("handoff, pylock run --etcd -- echo", "handoff, etcdctl lock -- echo"),
    ):
        print(
            f"  {a.split(', ', 1)[1]} / {b.split(', ', 1)[1]} ({a.split(',')[0]}): "
            f"{ratio(a, b):.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", help="a running etcd (default: start one)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--handoff-trials", type=int, default=100)
    parser.add_argument("--command-trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not os.access(ETCDCTL, os.X_OK):
        parser.error("needs etcdctl (Debian: apt-get install etcd-client)")

    cluster = None
    if args.endpoints is None:
        from tests.support.etcd import EtcdCluster

        cluster = EtcdCluster(1)
        endpoints = cluster.endpoint_list
    else:
        endpoints = args.endpoints
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = measure(args, endpoints, tmp)
    finally:
        if cluster is not None:
            cluster.close()
    report(rows, "local single-node etcd" if cluster is not None else endpoints)
    return 0


if __name__ == "__main__":
    sys.exit(main())
