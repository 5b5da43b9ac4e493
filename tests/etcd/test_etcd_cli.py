"""`pylock run --etcd` and `pylock who --etcd` against a real etcd."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from tests.support import env_with_repo
from tests.support.children import Script
from tests.support.etcd import EtcdCluster
from tests.support.etcd_locks import (
    contenders,
    etcdctl,
    expect_line,
    keys,
    recipe_prefix,
    require_etcd,
)


def pylock_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pylock", *args]


def pylock(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pylock_argv(*args), env=env_with_repo(), capture_output=True, text=True, timeout=60, **kw
    )  # type: ignore[call-overload,no-any-return]


# Prints "running", then waits; on SIGTERM prints "terminated" and exits 0.
COMMAND = textwrap.dedent(
    """
    import signal, sys
    def stop(*_):
        print("terminated", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("running", flush=True)
    sys.stdin.readline()
    sys.exit(7)
    """
)


def run_holding(etcd: EtcdCluster, name: str, *options: str) -> Script:
    """`pylock run --etcd ... NAME -- python COMMAND`, the command's lines on stdout."""
    argv = ["run", "--etcd", etcd.endpoint_list, *options, name, "--", sys.executable, "-c"]
    return Script(
        "import sys; from pylock._cli.main import main; sys.exit(main(sys.argv[1:]))",
        *argv,
        COMMAND,
    )


def test_run_holds_the_lock_while_the_command_runs(etcd, lock_name):
    job = run_holding(etcd, lock_name)
    try:
        expect_line(job, "running")
        who = pylock("who", "--etcd", etcd.endpoint_list, lock_name)
        assert who.returncode == 0
        assert f"pid {job.pid}" in who.stdout and lock_name in who.stdout
        held = pylock("run", "--etcd", etcd.endpoint_list, "-n", lock_name, "--", "true")
        assert held.returncode == 1
        assert f"pid {job.pid}" in held.stderr and "held by" in held.stderr
        as_json = json.loads(
            pylock("who", "--etcd", etcd.endpoint_list, "--json", lock_name).stdout
        )
        [report] = as_json
        assert report["held"] and report["name"] == lock_name
        [holder] = report["holders"]
        assert holder["pid"] == job.pid and holder["fencing_token"] > 0
        job.send("")
        assert job.wait() == 7  # the command's own status
    finally:
        job.close()
    free = pylock("who", "--etcd", etcd.endpoint_list, lock_name)
    assert free.returncode == 1 and "free" in free.stdout


def test_run_waits_its_turn_then_runs(etcd, lock_name):
    first = run_holding(etcd, lock_name)
    second = None
    try:
        expect_line(first, "running")
        second = run_holding(etcd, lock_name, "-w", "60")
        contenders(etcd.endpoint_list, lock_name, at_least=2)
        first.send("")
        assert first.wait() == 7
        expect_line(second, "running")
        second.send("")
        assert second.wait() == 7
    finally:
        first.close()
        if second is not None:
            second.close()


def test_lost_lock_terminates_the_command(etcd, lock_name):
    from pylock.etcd import EtcdLock

    job = run_holding(etcd, lock_name, "--ttl", "2")
    try:
        expect_line(job, "running")
        job.signal(signal.SIGSTOP)  # pylock itself: its keep-alives stop
        other = EtcdLock(lock_name, endpoints=etcd.endpoint_list, ttl=2)
        other.acquire(timeout=30)  # the paused run's lease expired
        job.signal(signal.SIGCONT)
        expect_line(job, "terminated")
        assert job.wait() == 0
        assert "lost the etcd lock" in job.stderr
        assert other.holder().fencing_token == other.fencing_token
        other.release()
    finally:
        job.close()


def test_a_deleted_key_terminates_the_command(etcd, lock_name):
    require_etcd(etcdctl=True)
    job = run_holding(etcd, lock_name)
    try:
        expect_line(job, "running")
        [(key, _, _)] = keys(etcd.endpoint_list, recipe_prefix(lock_name))
        etcdctl(etcd.endpoint_list, "del", key.decode())
        expect_line(job, "terminated")
        assert job.wait() == 0
        assert "lost the etcd lock" in job.stderr and "was deleted in etcd" in job.stderr
    finally:
        job.close()


def test_unreachable_etcd_is_one_clear_line(lock_name):
    require_etcd()
    done = pylock("who", "--etcd", "127.0.0.1:1", lock_name)
    assert done.returncode not in (0, 1)
    assert "127.0.0.1:1" in done.stderr and "unreachable" in done.stderr
    assert "Traceback" not in done.stderr


def test_etcd_usage_mistakes_are_exit_64():
    require_etcd()  # a bad endpoint is found by the etcd extra
    for argv in (
        ["run", "--etcd", "127.0.0.1:1", "job"],  # no command
        ["run", "--etcd", "127.0.0.1:1", "-s", "job", "--", "true"],  # no shared etcd locks
        ["run", "--ttl", "5", "/tmp/x", "--", "true"],  # --ttl without --etcd
        ["run", "--etcd", "127.0.0.1:1", "--ttl", "0", "job", "--", "true"],
        ["run", "--etcd", "not-an-endpoint", "job", "--", "true"],
    ):
        done = pylock(*argv)
        assert done.returncode == 64, (argv, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
