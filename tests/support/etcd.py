"""Real etcd processes for the tests: a single node or a cluster on loopback ports.

Each member gets its own data directory and free ports and is stopped (and
its directory removed) on close.  Also a command for CI and the benchmarks:
``python -m tests.support.etcd --members 3`` prints the endpoints and runs
until SIGTERM, SIGINT or SIGHUP, then stops its members.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
# Long enough for a cold start on a busy 2-core machine (about 1 s idle).
START_TIMEOUT = 30.0


def etcd_available() -> bool:
    return os.access(ETCD, os.X_OK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Member:
    def __init__(self, name: str, data_dir: str, client_port: int, peer_port: int) -> None:
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str) -> None:
        url = f"http://{self.endpoint}"
        log = open(os.path.join(os.path.dirname(self.data_dir), f"{self.name}.log"), "ab")  # noqa: SIM115
        with log:
            self.proc = subprocess.Popen(
                [
                    ETCD,
                    "--name", self.name,
                    "--data-dir", self.data_dir,
                    "--listen-client-urls", url,
                    "--advertise-client-urls", url,
                    "--listen-peer-urls", self.peer_url,
                    "--initial-advertise-peer-urls", self.peer_url,
                    "--initial-cluster", initial_cluster,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", os.path.basename(os.path.dirname(self.data_dir)),
                    "--logger", "zap",
                    "--log-level", "error",
                    # Short heartbeats: a killed leader is replaced in well under a second.
                    "--heartbeat-interval", "50",
                    "--election-timeout", "500",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped member would ignore SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class EtcdCluster:
    """`members` etcd processes forming one cluster on loopback."""

    def __init__(self, members: int = 1) -> None:
        self.root = tempfile.mkdtemp(prefix="pylock-etcd-")
        self.members = [
            Member(f"m{i}", os.path.join(self.root, f"m{i}"), free_port(), free_port())
            for i in range(members)
        ]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        try:
            for member in self.members:
                member.start(initial)
            self._wait_healthy()
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self) -> None:
        # Polling is the only way to see a service come up; it happens once, before any test.
        deadline = time.monotonic() + START_TIMEOUT
        for member in self.members:
            while not member.healthy():
                if member.proc is None or member.proc.poll() is not None:
                    raise RuntimeError(f"etcd {member.name} exited: see {self.root}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd did not become healthy in {START_TIMEOUT} s")
                time.sleep(0.05)

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def endpoint_list(self) -> str:
        return ",".join(self.endpoints)

    def close(self) -> None:
        for member in self.members:
            member.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=1)
    args = parser.parse_args()
    stop = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # taken by sigwait below, never lost
    with EtcdCluster(args.members) as cluster:
        print(cluster.endpoint_list, flush=True)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
