"""pylock.singleton: one instance per directory or user, and takeover of a running one.

Real daemons in child processes, synchronised by their stdout lines; takeover
really signals and kills them.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pylock
from pylock._core.process import ProcessIdentity, identity_of
from pylock._daemon.singleton import TakeoverRefused
from pylock._lock.record import RecordTemplate
from tests.support import env_with_repo
from tests.support.children import Forked
from tests.support.procs import NOBODY

# A daemon: takes the singleton, says "ready <pid>", and on SIGTERM says
# "term" and exits 0 (or, told to, ignores SIGTERM and says "ignored").
DAEMON = textwrap.dedent(
    """
    import os, signal, sys, pylock
    directory, behaviour = sys.argv[1], sys.argv[2]
    def on_term(signum, frame):
        if behaviour == "ignore":
            print("ignored", flush=True)
            return
        print("term", flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    lock = pylock.singleton(directory=directory, info={"role": "daemon"})
    print("ready", os.getpid(), flush=True)
    while True:
        signal.pause()
    """
)


class Daemon:
    def __init__(self, directory: Path, behaviour: str = "exit", **popen: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DAEMON, str(directory), behaviour],
            stdout=subprocess.PIPE,
            text=True,
            env=env_with_repo(),
            **popen,  # type: ignore[call-overload]
        )
        assert self.readline().startswith("ready"), "the daemon did not start"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def public_dir():
    """A directory every user may write to (tmp_path's parents are root's alone;
    conftest's public_dir may only be traversed)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pylock-daemon-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(directory: Path, behaviour: str = "exit", **popen: object) -> Daemon:
        daemon = Daemon(directory, behaviour, **popen)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.close()


def test_second_instance_is_refused_naming_the_first(tmp_path, daemons):
    first = daemons(tmp_path)
    with pytest.raises(pylock.LockHeld) as caught:
        pylock.singleton(directory=tmp_path)
    assert caught.value.holder is not None
    assert caught.value.holder.pid == first.proc.pid
    assert caught.value.holder.info == {"role": "daemon"}
    assert f"pid {first.proc.pid}" in str(caught.value)
    assert first.proc.poll() is None  # refusing never touches the running instance


def test_every_spelling_of_the_directory_is_the_same_singleton(tmp_path, daemons):
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "link").symlink_to(data)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "link").symlink_to(data)
    first = daemons(data)
    spellings = [
        tmp_path / "link",
        # ".." after a symlink is the target's parent, as the kernel resolves it.
        f"{tmp_path}/deep/link/../data",
        f"{data}/.",
        f"{tmp_path}/link/../data",
        os.path.relpath(data),
        f"{data}//",
    ]
    for spelling in spellings:
        with pytest.raises(pylock.LockHeld) as caught:
            pylock.singleton(directory=spelling)
        assert caught.value.holder is not None and caught.value.holder.pid == first.proc.pid


def test_singleton_is_free_again_when_the_holder_dies(tmp_path, daemons):
    first = daemons(tmp_path)
    first.proc.kill()
    first.proc.wait()
    lock = pylock.singleton(directory=tmp_path)
    assert lock.locked
    lock.close()


def test_name_alone_is_one_per_user_in_the_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PYLOCK_RUNTIME_DIR", str(tmp_path / "rt"))
    lock = pylock.singleton("agent")
    try:
        assert lock.path == str(tmp_path / "rt" / "agent")
        assert (tmp_path / "rt").stat().st_mode & 0o777 == 0o700
        code = "import pylock; pylock.singleton('agent')"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env_with_repo()
        )
        assert done.returncode != 0
        assert "LockHeld" in done.stderr and f"pid {os.getpid()}" in done.stderr
    finally:
        lock.close()


def test_name_and_directory_name_the_file(tmp_path):
    lock = pylock.singleton("db.lock", directory=tmp_path)
    assert lock.path == str(tmp_path / "db.lock")
    lock.close()


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "x\0y"])
def test_a_name_must_be_a_plain_file_name(tmp_path, bad):
    with pytest.raises(ValueError):
        pylock.singleton(bad, directory=tmp_path)


def test_takeover_of_a_daemon_that_exits_on_sigterm(tmp_path, daemons):
    old = daemons(tmp_path)
    lock = pylock.singleton(directory=tmp_path, takeover=30)
    try:
        assert old.readline() == "term"
        assert old.proc.wait() == 0  # it exited by itself, within the grace period
        holder = lock.holder()
        assert holder is not None and holder.pid == os.getpid()
    finally:
        lock.close()


def test_takeover_escalates_to_sigkill_after_the_grace_period(tmp_path, daemons, caplog):
    stubborn = daemons(tmp_path, "ignore")
    lock = pylock.singleton(directory=tmp_path, takeover=0.2)
    try:
        assert stubborn.readline() == "ignored"  # it did get SIGTERM first
        assert stubborn.proc.wait() == -signal.SIGKILL
        assert "SIGKILL" in caplog.text
        assert lock.locked
    finally:
        lock.close()


def test_singleton_async_takes_over(tmp_path, daemons):
    old = daemons(tmp_path)

    async def main() -> pylock.Lock:
        return await pylock.singleton_async(directory=tmp_path, takeover=30)

    lock = asyncio.run(main())
    try:
        assert old.readline() == "term"
        assert old.proc.wait() == 0
        assert lock.locked
    finally:
        lock.close()


def test_singleton_async_escalates(tmp_path, daemons):
    stubborn = daemons(tmp_path, "ignore")
    lock = asyncio.run(pylock.singleton_async(directory=tmp_path, takeover=0.2))
    try:
        assert stubborn.proc.wait() == -signal.SIGKILL
    finally:
        lock.close()


def test_takeover_without_a_holder_just_acquires(tmp_path):
    lock = pylock.singleton(directory=tmp_path, takeover=1)
    assert lock.locked
    lock.close()


# A bystander that reports any SIGTERM it receives and otherwise lives on.
BYSTANDER = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGTERM, lambda *a: print("term", flush=True))
    print("up", flush=True)
    sys.stdin.read()
    """
)


def _raw_flock_holder(path: Path, record: bytes | None) -> subprocess.Popen[str]:
    """A process holding path with a bare flock (not pylock), optionally writing record."""
    code = textwrap.dedent(
        """
        import fcntl, os, signal, sys
        signal.signal(signal.SIGTERM, lambda *a: print("term", flush=True))
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        record = bytes.fromhex(sys.argv[2])
        if record:
            os.pwrite(fd, record, 0)
        print("locked", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path), (record or b"").hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _finish(proc: subprocess.Popen[str]) -> str:
    """Let proc exit; return what it printed after its first line."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    rest = proc.stdout.read()
    proc.wait()
    return rest


def test_refuses_when_the_records_process_does_not_hold_the_lock(tmp_path):
    """The record names a live process of ours that no longer holds the lock; a bare
    flock holder has it.  Neither may be signalled."""
    path = tmp_path / "pylock-singleton.lock"
    bystander = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pylock, sys, signal\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True))\n"
            f"l = pylock.Lock({str(path)!r}); l.acquire(); l.release()\n"
            "print('up', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert bystander.stdout is not None and bystander.stdout.readline().strip() == "up"
    holder = _raw_flock_holder(path, None)  # keeps the bystander's record in the file
    try:
        with pytest.raises(TakeoverRefused) as caught:
            pylock.singleton(directory=tmp_path, takeover=0.1)
        message = str(caught.value)
        assert f"pid {bystander.pid}" in message and "no longer holds it" in message
        assert f"pid {holder.pid}" in message  # the kernel's holder is named, not signalled
        assert "stop the holder yourself" in message
    finally:
        assert _finish(holder) == ""
        assert _finish(bystander) == ""


def test_refuses_a_record_whose_pid_now_names_another_process(tmp_path):
    """The record carries the holder's pid with another start identity: the pid was
    reused.  The process now at that pid holds the lock but is not the record's."""
    path = tmp_path / "pylock-singleton.lock"
    me = identity_of(os.getpid())
    assert me is not None
    # Filled in with the holder's pid once it runs: write through a second step.
    proc = _raw_flock_holder(path, None)
    try:
        fake = ProcessIdentity(proc.pid, me.start_time + 12345, me.boot_id, me.pidfs_ino + 1)
        with open(path, "r+b") as f:
            f.write(RecordTemplate(fake, {"who": "the previous owner of the pid"}).render())
        with pytest.raises(TakeoverRefused) as caught:
            pylock.singleton(directory=tmp_path, takeover=0.1)
        assert "now belongs to another process" in str(caught.value)
    finally:
        assert _finish(proc) == ""  # never signalled


@pytest.mark.root  # run a holder as another user
def test_refuses_another_users_process(public_dir):
    tmp_path = public_dir
    hit: list[str] = []

    def daemon(chan: Forked.Chan) -> None:
        signal.signal(signal.SIGTERM, lambda *a: chan.say("term"))
        lock = pylock.singleton(directory=tmp_path)
        chan.say("held")
        chan.until_closed()
        lock.close()

    other = Forked(daemon, user=NOBODY)
    try:
        assert other.line() == "held"
        with pytest.raises(TakeoverRefused) as caught:
            pylock.singleton(directory=tmp_path, takeover=0.1)
        assert "another user" in str(caught.value) and "uid 65534" in str(caught.value)
        other.close_input()
        hit.extend(other.rest())
        assert other.wait() == 0
        assert hit == []  # never signalled
    finally:
        other.kill()


@pytest.mark.root  # run both sides as another user
def test_refuses_a_holder_it_may_not_inspect(public_dir):
    """Same user, but the holder made itself non-dumpable: its descriptors (and so
    whether it holds the lock) are hidden from this user, so it is not verified."""

    import ctypes  # here: a child running as nobody cannot read root's interpreter

    import pylock._exit.api  # likewise: loaded before the fork

    def daemon(chan: Forked.Chan) -> None:
        signal.signal(signal.SIGTERM, lambda *a: chan.say("term"))
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        lock = pylock.singleton(directory=public_dir)
        chan.say("held")
        chan.until_closed()
        lock.close()

    def taker(chan: Forked.Chan) -> None:
        try:
            pylock.singleton(directory=public_dir, takeover=0.1)
        except TakeoverRefused as exc:
            chan.say("refused " + str(exc).replace("\n", " "))

    holder = Forked(daemon, user=NOBODY)
    try:
        assert holder.line() == "held"
        other = Forked(taker, user=NOBODY)
        line = other.line()
        other.kill()
        assert line.startswith("refused ") and "may not inspect" in line
        holder.close_input()
        assert holder.rest() == []  # never signalled
        assert holder.wait() == 0
    finally:
        holder.kill()


def test_refuses_this_process_itself(tmp_path):
    first = pylock.singleton(directory=tmp_path)
    try:
        with pytest.raises(TakeoverRefused, match="this very process"):
            pylock.singleton(directory=tmp_path, takeover=0.1)
        assert first.locked
    finally:
        first.close()


def test_takeover_names_the_child_that_inherited_the_lock(tmp_path):
    """The holder's forked child keeps the lock after the holder exits: LockHeld, not a
    second signal to a process the record does not name."""
    code = textwrap.dedent(
        """
        import os, subprocess, sys, signal, pylock
        lock = pylock.singleton(directory=sys.argv[1])
        # As `pylock run` does: the command gets its own descriptor on the
        # locked open file (where subprocess forks, as on PyPy and CPython
        # 3.9, the child closes pylock's own before its exec).
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], pass_fds=(os.dup(lock._handle),)
        )
        print("ready", child.pid, flush=True)
        signal.pause()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline().split()[1])
    try:
        with pytest.raises(pylock.LockHeld) as caught:
            pylock.singleton(directory=tmp_path, takeover=10)
        assert proc.wait() == -signal.SIGTERM
        assert f"pid {child}" in str(caught.value) and "inherited" in str(caught.value)
    finally:
        os.kill(child, signal.SIGKILL)
        _finish(proc)


def test_negative_grace_is_refused(tmp_path):
    with pytest.raises(ValueError):
        pylock.singleton(directory=tmp_path, takeover=-1)


def test_lock_file_of_a_bare_flock_is_not_touched(tmp_path):
    """A refusal leaves the foreign holder's file as it was."""
    path = tmp_path / "pylock-singleton.lock"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(pylock.LockHeld):
            pylock.singleton(directory=tmp_path)
        assert path.read_bytes() == b""
    finally:
        os.close(fd)


# `pylock run --takeover GRACE FILE COMMAND...`, for service scripts.
PYLOCK = [sys.executable, "-m", "pylock"]
SERVICE = textwrap.dedent(
    """
    import os, signal
    def on_term(signum, frame):
        print("term", flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("service", os.getpid(), flush=True)
    while True:
        signal.pause()
    """
)


def start_service(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PYLOCK, "run", "--takeover", "10", str(path), sys.executable, "-c", SERVICE],
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_repo(),
    )


def test_run_with_takeover_becomes_the_command_and_replaces_it(tmp_path):
    path = tmp_path / "service.lock"
    first = start_service(path)
    second = None
    try:
        assert first.stdout is not None
        # exec: the service is the very process that took the lock.
        assert first.stdout.readline().split() == ["service", str(first.pid)]
        holder = pylock.Lock(path).holder()
        assert holder is not None and holder.pid == first.pid and holder.verified
        second = start_service(path)
        assert second.stdout is not None
        assert second.stdout.readline().split() == ["service", str(second.pid)]
        assert first.stdout.readline().strip() == "term"  # the service itself got SIGTERM
        assert first.wait() == 0
        holder = pylock.Lock(path).holder()
        assert holder is not None and holder.pid == second.pid
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()


def test_run_with_takeover_refuses_an_unverified_holder(tmp_path):
    path = tmp_path / "x.lock"
    holder = _raw_flock_holder(path, None)  # no record: cannot be verified
    try:
        done = subprocess.run(
            [*PYLOCK, "run", "--takeover", "1", str(path), "true"],
            capture_output=True,
            text=True,
            env=env_with_repo(),
        )
        assert done.returncode == 1
        assert "will not take over" in done.stderr and f"pid {holder.pid}" in done.stderr
    finally:
        assert _finish(holder) == ""  # never signalled


@pytest.mark.parametrize("extra", [["-s"], ["-o"], ["-w", "1"]])
def test_run_with_takeover_usage_errors(tmp_path, extra):
    done = subprocess.run(
        [*PYLOCK, "run", "--takeover", "1", *extra, str(tmp_path / "x.lock"), "true"],
        capture_output=True,
        text=True,
        env=env_with_repo(),
    )
    assert done.returncode == 64 and "--takeover" in done.stderr


def test_run_with_takeover_needs_a_command(tmp_path):
    done = subprocess.run(
        [*PYLOCK, "run", "--takeover", "1", "7"],
        capture_output=True,
        text=True,
        env=env_with_repo(),
    )
    assert done.returncode == 64
