"""examples/daemon.py, run for real: started twice (refused), restarted with takeover."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import pylock
from tests.support import REPO_ROOT, env_with_repo

EXAMPLE = os.path.join(REPO_ROOT, "examples", "daemon.py")
pytestmark = pytest.mark.checkout  # runs examples/daemon.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(data: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, EXAMPLE, "--data", str(data), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )


def ready(proc: subprocess.Popen[str]) -> dict[str, str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), (
        f"not ready: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    )
    return dict(word.split("=", 1) for word in line.split()[1:])


def ping(path: str) -> str:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(path)
        client.sendall(b"ping\n")
        return client.recv(100).decode().strip()


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_started_twice_then_restarted_with_takeover(tmp_path, procs, monkeypatch):
    monkeypatch.setenv("PYLOCK_PORT_DIR", str(tmp_path / "ports"))
    (tmp_path / "half.partial").write_text("left by a crash")
    port = str(free_port())

    first = start(tmp_path, "--metrics-port", port)
    procs.append(first)
    facts = ready(first)
    assert facts["pid"] == str(first.pid) and facts["recovered"] == "1"
    assert ping(facts["socket"]) == f"pong {first.pid}"

    second = start(tmp_path, "--metrics-port", port)
    procs.append(second)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 75
    assert f"held by pid {first.pid}" in err
    assert ping(facts["socket"]) == f"pong {first.pid}"  # the refused start touched nothing

    with urllib.request.urlopen(facts["metrics"], timeout=30) as response:
        text = response.read().decode()
    assert "pylock_lock_hold_seconds" in text or '"acquisitions"' in text

    third = start(tmp_path, "--takeover", "10", "--metrics-port", port)
    procs.append(third)
    facts3 = ready(third)
    assert first.wait(timeout=60) == 0  # it stopped cleanly on SIGTERM
    assert ping(facts3["socket"]) == f"pong {third.pid}"
    with urllib.request.urlopen(facts3["metrics"], timeout=30) as response:
        assert response.status == 200


def test_a_killed_daemons_socket_is_replaced(tmp_path, procs, monkeypatch):
    first = start(tmp_path)
    procs.append(first)
    facts = ready(first)
    first.kill()
    first.wait()
    assert os.path.exists(facts["socket"])  # left behind by the kill
    again = start(tmp_path)
    procs.append(again)
    assert ping(ready(again)["socket"]) == f"pong {again.pid}"


def singleton_free(data: Path) -> bool:
    return pylock.Lock(data / "pylock-singleton.lock").holder() is None


def test_a_new_data_directory_is_made_and_ctrl_c_stops_cleanly(tmp_path, procs):
    data = tmp_path / "new" / "data"  # neither exists yet
    daemon = start(data)
    procs.append(daemon)
    facts = ready(daemon)
    assert data.is_dir() and ping(facts["socket"]) == f"pong {daemon.pid}"
    daemon.send_signal(signal.SIGINT)
    _, err = daemon.communicate(timeout=60)
    assert (daemon.returncode, err) == (0, "")
    assert not os.path.exists(facts["socket"]) and singleton_free(data)


def test_a_closed_stdout_stops_it_cleanly(tmp_path):
    # Its reader is gone before it says "ready" (`daemon.py ... | head -0`).
    read_end, write_end = os.pipe()
    os.close(read_end)
    daemon = subprocess.Popen(
        [sys.executable, EXAMPLE, "--data", str(tmp_path)],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    os.close(write_end)
    _, err = daemon.communicate(timeout=60)
    assert (daemon.returncode, err) == (1, "")
    assert not (tmp_path / "daemon.sock").exists() and singleton_free(tmp_path)


def test_an_error_after_the_socket_is_claimed_removes_it(tmp_path, procs, monkeypatch):
    monkeypatch.setenv("PYLOCK_PORT_DIR", str(tmp_path / "ports"))
    port = free_port()
    held = pylock.port_lock(port)  # something else holds the port's lock
    try:
        daemon = start(tmp_path, "--metrics-port", str(port))
        procs.append(daemon)
        out, err = daemon.communicate(timeout=60)
    finally:
        held.close()
    assert daemon.returncode == 1 and out == ""
    assert err.startswith("daemon: stopped: ") and f"pid {os.getpid()}" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "daemon.sock").exists() and singleton_free(tmp_path)
