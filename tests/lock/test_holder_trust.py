"""What a Holder may be trusted for.  The kernel names and describes the holder
(pid, start identity, program, argv, this host); a record adds only info and
since when, and only while the kernel shows its process holding the lock
exclusively; record_private says whether anyone but the holder's user could
have written it.  Looking takes no lock, sees other users' holders, and
prints nothing a terminal would obey."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import pylock
from pylock._core.process import identity_of
from pylock._lock import lookup as _lookup
from tests.support import REPO_ROOT, env_with_repo
from tests.support.procs import cmdline

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to act as another user")

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\r"


def _nobody_cannot_run() -> str:
    """Why uid 65534 cannot run this interpreter with pylock ('' when it can):
    a pyenv Python whose libpython lies under a private /root, as in the
    wheel check, cannot serve as another user."""
    if not _NOBODY_PROBE:
        probe = subprocess.run(
            [
                "setpriv",
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                sys.executable,
                "-c",
                "import pylock",
            ],
            env=env_with_repo(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        _NOBODY_PROBE.append("" if probe.returncode == 0 else probe.stderr.strip()[-300:])
    return _NOBODY_PROBE[0]


_NOBODY_PROBE: list[str] = []


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python code as uid/gid 65534 (setpriv), importing this checkout's pylock."""
    problem = _nobody_cannot_run()
    if problem:
        pytest.skip(f"uid {NOBODY} cannot run {sys.executable} with pylock: {problem}")
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
            *args,
        ],
        env=env_with_repo(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return as_nobody("import sys, pylock._cli.main as c; sys.exit(c.main(sys.argv[1:]))", *args)


def record_bytes(**fields: Any) -> bytes:
    payload = json.dumps(fields).encode()
    return b"pylock-record v1 %d %08x\n" % (len(payload), zlib.crc32(payload)) + payload


FORGE = textwrap.dedent(
    """
    import os, sys
    fd = os.open(sys.argv[1], os.O_WRONLY)
    os.pwrite(fd, bytes.fromhex(sys.argv[2]), 0)
    os.close(fd)
    """
)


def forged_for(pid: int) -> bytes:
    """A record naming pid's real identity, every other detail the forger's."""
    ident = identity_of(pid)
    assert ident is not None
    return record_bytes(
        pid=ident.pid,
        start_time=ident.start_time,
        boot_id=ident.boot_id,
        pidfs_ino=ident.pidfs_ino,
        host="db1",
        program="sshd",
        argv=["/usr/sbin/sshd", "-D"],
        info={"port": 31337},
        acquired_at=1000000000.0,
    )


@pytest.fixture
def public_dir() -> Iterator[str]:
    """A sticky, world-writable directory like /tmp, for two users' files."""
    d = tempfile.mkdtemp(prefix="pylock-trust-", dir="/tmp")
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- item 4: a verified holder's facts come from the kernel -------------------------


@needs_root
def test_a_rewritten_record_cannot_speak_for_a_verified_holder(
    public_dir: str, spawn_holder
) -> None:
    """Anyone who can write the lock file (0o666, as the README suggests for
    locks shared between users) rewrites the record while the holder holds."""
    path = os.path.join(public_dir, "shared.lock")
    holder = spawn_holder(path, info={"port": 8080})
    os.chmod(path, 0o666)
    forged = as_nobody(FORGE, path, forged_for(holder.pid).hex())
    assert forged.returncode == 0, forged.stderr
    found = pylock.Lock(path).holder()
    assert found is not None and found.verified and found.pid == holder.pid
    assert found.program == os.path.basename(sys.executable) != "sshd"
    assert found.argv == cmdline(holder.pid)
    assert found.hostname == socket.gethostname() != "db1"
    ident = identity_of(holder.pid)
    assert ident is not None and found.identity == ident
    # What only the record can tell is passed on, marked as writable by others.
    assert found.info == {"port": 31337}
    assert found.record_private is False
    with pytest.raises(pylock.LockHeld) as held:
        pylock.Lock(path).acquire(blocking=False)
    assert "sshd" not in str(held.value) and "db1" not in str(held.value)


@needs_root
def test_a_lock_file_pre_created_by_another_user_is_not_private(
    public_dir: str, spawn_holder
) -> None:
    path = os.path.join(public_dir, "precreated.lock")
    made = as_nobody(
        "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644))", path
    )
    assert made.returncode == 0, made.stderr
    holder = spawn_holder(path, info={"port": 8080})
    found = pylock.Lock(path).holder()
    assert found is not None and found.verified and found.info == {"port": 8080}
    assert found.record_private is False  # its owner can rewrite the record at will
    assert as_nobody(FORGE, path, forged_for(holder.pid).hex()).returncode == 0
    found = pylock.Lock(path).holder()
    assert found is not None and found.info == {"port": 31337} and not found.record_private


def test_a_record_only_its_holders_user_can_write_is_private(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path, info={"port": 8080})
    os.chmod(lock_path, 0o644)
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.info == {"port": 8080} and found.record_private
    os.chmod(lock_path, 0o664)  # the group may write it too
    found = pylock.Lock(lock_path).holder()
    assert found is not None and found.info == {"port": 8080} and not found.record_private


# -- item 7: an old exclusive record does not describe a shared holder ----------------


def test_a_shared_holder_is_not_described_by_its_own_old_exclusive_record(
    lock_path: str,
) -> None:
    with pylock.Lock(lock_path, info={"mine": 1}):
        pass
    with pylock.Lock(lock_path, shared=True) as lock:
        found = lock.holder()
        assert found is not None and found.pid == os.getpid() and found.verified
        assert found.shared and found.info is None and found.acquired_at is None
        with pytest.raises(pylock.LockHeld) as held:
            pylock.Lock(lock_path).acquire(blocking=False)
        assert " since " not in str(held.value)
        assert pylock.holders(lock_path)[0].info is None


def test_an_old_record_does_not_describe_a_holder_without_a_record(
    lock_path: str,
) -> None:
    """The same process holds the lock again through a record-less Lock
    (shared), then exclusively: only the exclusive hold is described by its
    record, as pylock rewrites the record for every exclusive acquisition."""
    with pylock.Lock(lock_path, info={"first": 1}):
        pass
    with pylock.Lock(lock_path, shared=True, record=False):
        assert pylock.Lock(lock_path).holder().info is None  # type: ignore[union-attr]
    with pylock.Lock(lock_path, info={"second": 2}) as lock:
        assert lock.holder().info == {"second": 2}  # type: ignore[union-attr]


# -- item 5: looking takes no lock -----------------------------------------------------


class _ProbeSpy:
    """Stands in for pylock's C library inside pylock._lock.lookup only: any lock
    taken by holder() is reported, and at that moment another process tries
    the lock, as a monitoring loop's neighbour would (the real syscall still
    runs; this only watches)."""

    def __init__(self, real: Any, path: str) -> None:
        self._real = real
        self._path = path
        self.refused: list[int] = []
        self.probes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def pl_try_lock(self, handle: int, shared: int) -> int:
        rc = self._real.pl_try_lock(handle, shared)
        self.probes += 1
        if rc == 0:
            other = subprocess.run(["flock", "-n", "-x", self._path, "true"])
            if other.returncode != 0:
                self.refused.append(other.returncode)
        return int(rc)


def test_holder_of_a_free_lock_never_makes_an_acquirer_fail(
    lock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    open(lock_path, "w").close()
    spy = _ProbeSpy(_lookup.lib, lock_path)
    monkeypatch.setattr(_lookup, "lib", spy)
    assert pylock.Lock(lock_path).holder() is None
    assert pylock.holders(lock_path) == []
    with pylock.Lock(lock_path):  # and while held, nothing is probed either
        assert pylock.Lock(lock_path).holder() is not None
    assert spy.probes == 0 and spy.refused == []


# -- items 6 and 8: another user's view --------------------------------------------------

LOOK = textwrap.dedent(
    """
    import json, sys, pylock
    path = sys.argv[1]
    def row(h):
        return None if h is None else {"pid": h.pid, "verified": h.verified, "note": h.note}
    try:
        print(json.dumps({"holder": row(pylock.Lock(path).holder()),
                          "holders": [row(h) for h in pylock.holders(path)]}))
    except pylock.LockError as exc:
        print(json.dumps({"error": str(exc), "errno": exc.errno}))
    """
)


def look_as_nobody(path: str) -> dict[str, Any]:
    out = as_nobody(LOOK, path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@needs_root
def test_another_users_holder_is_listed_unverified(public_dir: str, spawn_holder) -> None:
    path = os.path.join(public_dir, "root.lock")
    holder = spawn_holder(path)
    os.chmod(path, 0o644)
    seen = look_as_nobody(path)
    expected = {"pid": holder.pid, "verified": False}
    assert {k: seen["holder"][k] for k in expected} == expected
    assert "lock table" in seen["holder"]["note"]
    assert [h["pid"] for h in seen["holders"]] == [holder.pid]
    for args in (["who", "--all", path], ["who", path]):
        out = cli_as_nobody(*args)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        assert f"pid {holder.pid}" in out.stdout and "free" not in out.stdout


@needs_root
def test_shared_holders_of_another_user_are_all_listed(public_dir: str, spawn_holder) -> None:
    path = os.path.join(public_dir, "shared.lock")
    first = spawn_holder(path, shared=True)
    second = spawn_holder(path, shared=True)
    seen = look_as_nobody(path)
    assert sorted(h["pid"] for h in seen["holders"]) == sorted([first.pid, second.pid])
    assert not any(h["verified"] for h in seen["holders"])


@needs_root
def test_an_unreadable_lock_file_is_answered_from_the_kernel(public_dir: str, spawn_holder) -> None:
    path = os.path.join(public_dir, "private.lock")
    seen = look_as_nobody(path)
    assert seen == {"holder": None, "holders": []}  # no file: free
    holder = spawn_holder(path, info={"secret": 1})
    os.chmod(path, 0o600)
    seen = look_as_nobody(path)
    assert "error" not in seen, seen
    assert seen["holder"]["pid"] == holder.pid and not seen["holder"]["verified"]
    holder.release()
    assert look_as_nobody(path) == {"holder": None, "holders": []}


def test_a_missing_directory_is_reported_as_acquire_reports_it(tmp_path: Any) -> None:
    path = str(tmp_path / "nowhere" / "x.lock")
    with pytest.raises(pylock.LockFileError) as by_acquire:
        pylock.Lock(path).acquire(blocking=False)
    with pytest.raises(pylock.LockFileError) as by_holder:
        pylock.Lock(path).holder()
    with pytest.raises(pylock.LockFileError) as by_holders:
        pylock.holders(path)
    assert str(by_acquire.value) == str(by_holder.value) == str(by_holders.value)
    assert f"directory {tmp_path / 'nowhere'} does not exist" in str(by_holder.value)
    # The command line too: who fails as run does, never "free".
    codes = []
    for args in (["who", path], ["run", path, "--", "true"]):
        out = subprocess.run(
            [sys.executable, "-m", "pylock", *args],
            env=env_with_repo(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert "free" not in out.stdout and path in out.stderr
        codes.append(out.returncode)
    assert codes[0] == codes[1] not in (0, 1)
    assert pylock.Lock(str(tmp_path / "x.lock")).holder() is None  # the file alone missing


# -- item 3: nothing printed is obeyed by a terminal ---------------------------------

WEIRD_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(1, b"locked\\n")
    sys.stdin.read()
    """
)


@pytest.fixture
def escaping_holder(lock_path: str) -> Iterator[subprocess.Popen[str]]:
    """A holder whose command line is a terminal escape sequence, and whose
    lock file holds a record naming it with escapes in every string."""
    proc = subprocess.Popen(
        [ESCAPES + "python", "-c", WEIRD_HOLDER, lock_path, ESCAPES],
        executable=sys.executable,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    ident = identity_of(proc.pid)
    assert ident is not None
    with open(lock_path, "r+b") as f:
        f.write(
            record_bytes(
                pid=proc.pid,
                start_time=ident.start_time,
                boot_id=ident.boot_id,
                pidfs_ino=ident.pidfs_ino,
                host=ESCAPES,
                program=ESCAPES,
                argv=[ESCAPES],
                info={ESCAPES: ESCAPES},
                acquired_at=time.time(),
            )
        )
    yield proc
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def no_controls(text: str) -> bool:
    return not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in text)


def test_messages_escape_what_records_and_processes_say(
    lock_path: str, escaping_holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(pylock.LockHeld) as held:
        pylock.Lock(lock_path).acquire(blocking=False)
    message = str(held.value)
    assert f"pid {escaping_holder.pid}" in message
    assert no_controls(message) and "\\x1b]0;owned\\x07" in message
    with pytest.raises(pylock.LockTimeout) as timed_out:
        pylock.Lock(lock_path).acquire(timeout=0.01)
    assert no_controls(str(timed_out.value))


def test_who_escapes_for_people_and_keeps_json_exact(
    lock_path: str, escaping_holder: subprocess.Popen[str]
) -> None:
    def who(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "pylock", "who", *args, lock_path],
            env=env_with_repo(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    for args in ((), ("--all",)):
        text = who(*args)
        assert no_controls(text) and "\\x1b" in text, text
    exact = json.loads(who("--json"))[0]["holders"][0]
    assert exact["argv"][0] == ESCAPES + "python" and exact["info"] == {ESCAPES: ESCAPES}


def test_describe_escapes_every_string() -> None:
    holder = pylock.Holder(
        pid=42, hostname=ESCAPES, program=ESCAPES, argv=(ESCAPES, "a\u202eb"), note=ESCAPES
    )
    assert no_controls(holder.describe()) and "\u202e" not in holder.describe()
    assert no_controls(pylock.Holder(pid=42, program=ESCAPES).describe())
