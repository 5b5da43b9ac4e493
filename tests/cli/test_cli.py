"""The pylock command: `run` (forms, options, exit codes, the holder message),
usage errors, help and version.  Side by side with flock(1): test_cli_flock.py;
processes and signals: test_cli_process.py; who/wait/list: test_cli_tools.py."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

import pylock
from tests.support import mounts
from tests.support.cli import PYLOCK, Holder, cli, cli_env
from tests.support.kernel_locks import free_now, wait_blocked

# -- the lock and the command ---------------------------------------------------


def test_run_holds_the_lock_while_the_command_runs(lock_path: str) -> None:
    # The command itself checks that another taker is refused meanwhile.
    out = cli("run", lock_path, "sh", "-c", f"{PYLOCK} run -n -q {lock_path} true; echo $?")
    assert (out.returncode, out.stdout, out.stderr) == (0, "1\n", "")
    assert free_now(lock_path)


def test_every_command_form_runs_the_same_command(tmp_path: Path, lock_path: str) -> None:
    forms = [
        [lock_path, "echo", "a b"],
        [lock_path, "--", "echo", "a b"],
        [lock_path, "-c", "echo 'a b'"],
        [lock_path, "--command", "echo 'a b'"],
        ["-c", "echo 'a b'", lock_path],
        ["--command=echo 'a b'", lock_path],
        ["-n", "--", lock_path, "echo", "a b"],
    ]
    for form in forms:
        out = cli("run", *form)
        assert (out.returncode, out.stdout, out.stderr) == (0, "a b\n", ""), form


def test_options_after_the_file_belong_to_the_command(lock_path: str) -> None:
    out = cli("run", lock_path, "printf", "%s|", "-n", "-x", "--bogus", "--")
    assert (out.returncode, out.stdout) == (0, "-n|-x|--bogus|--|")


def test_dash_c_runs_through_the_users_shell(lock_path: str) -> None:
    out = cli("run", lock_path, "-c", "echo $0", env={"SHELL": "/bin/bash"})
    assert out.stdout == "/bin/bash\n"
    env = cli_env()
    env.pop("SHELL", None)
    out = subprocess.run(
        [PYLOCK, "run", lock_path, "-c", "echo $0"], capture_output=True, text=True, env=env
    )
    assert out.stdout == "/bin/sh\n"


def test_exit_status_of_the_command(lock_path: str) -> None:
    assert cli("run", lock_path, "sh", "-c", "exit 7").returncode == 7
    assert cli("run", lock_path, "sh", "-c", "kill -9 $$").returncode == 137
    assert cli("run", lock_path, "sh", "-c", "exit 0").returncode == 0
    assert free_now(lock_path)


def test_command_that_cannot_run_exits_69(lock_path: str, tmp_path: Path) -> None:
    out = cli("run", lock_path, "no-such-program-here")
    assert out.returncode == 69
    assert out.stderr == (
        "pylock: failed to execute no-such-program-here: No such file or directory\n"
    )
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    out = cli("run", lock_path, str(script))
    assert out.returncode == 69 and "Permission denied" in out.stderr
    assert cli("run", "-F", lock_path, "no-such-program-here").returncode == 69


def test_new_file_is_created_0666_less_the_umask(tmp_path: Path) -> None:
    for umask, expected in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0, 0o666)):
        path = tmp_path / f"u{umask:o}.lock"
        out = cli("run", str(path), "true", preexec_fn=lambda u=umask: os.umask(u))
        assert out.returncode == 0, out.stderr
        assert stat.S_IMODE(path.stat().st_mode) == expected, oct(umask)


def test_directories_and_devices_are_locked_without_a_record(
    tmp_path: Path, char_device: str
) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    before = sorted(os.listdir(directory))
    holder = Holder([PYLOCK, "run"], str(directory))
    try:
        out = cli("run", "-n", str(directory), "echo", "ran")
        assert (out.returncode, out.stdout) == (1, "")
        assert f"{directory} is held by pid " in out.stderr
    finally:
        holder.release()
    assert cli("run", "-n", str(directory), "true").returncode == 0
    assert sorted(os.listdir(directory)) == before
    out = cli("run", "-n", char_device, "true")
    assert (out.returncode, out.stderr) == (0, "")
    out = cli("run", "-n", f"{directory}/", "true")
    assert (out.returncode, out.stderr) == (0, "")
    # A FIFO nobody writes to: flock(1) hangs opening it; pylock never hangs.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (["-n"], ["-u"], ["-s", "-w", "1"]):
        out = cli("run", *args, str(fifo), "true", timeout=30)
        assert (out.returncode, out.stderr) == (0, ""), args


def test_symlinked_lock_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    link = tmp_path / "link.lock"
    link.symlink_to(target)
    out = cli("run", str(link), "echo", "ran")
    assert (out.returncode, out.stdout) == (66, "")
    assert "symbolic link" in out.stderr and str(link) in out.stderr
    assert target.read_text() == "keep me\n"
    dir_link = tmp_path / "dirlink"
    dir_link.symlink_to(tmp_path)
    assert cli("run", str(dir_link), "true").returncode == 66
    assert cli("run", "-u", str(link), "true").returncode == 66


def test_lock_file_problems_exit_66(tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere" / "x.lock")
    out = cli("run", path, "echo", "ran")
    assert (out.returncode, out.stdout) == (66, "")
    assert path in out.stderr and "No such file or directory" in out.stderr
    assert len(out.stderr.splitlines()) == 1


# -- conflicts: the holder's name, -q, -E, -w -------------------------------------


def test_conflict_names_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    out = cli("run", "-n", lock_path, "echo", "ran")
    assert (out.returncode, out.stdout) == (1, "")
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"pylock: {lock_path} is held by pid {holder.pid} (")
    assert f" on {socket.gethostname()} since " in line


def test_quiet_is_silent_where_flock_is(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path)
    for args in (["-n"], ["-w", "0.05"], ["-w", "0"], ["-n", "-E", "3"]):
        out = cli("run", "-q", *args, lock_path, "echo", "ran")
        assert (out.stdout, out.stderr) == ("", ""), args
        assert out.returncode == (3 if "-E" in args else 1)


def test_conflict_exit_code(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path)
    for code in ("0", "42", "255"):
        out = cli("run", "-n", "-E", code, lock_path, "echo", "ran")
        assert (out.returncode, out.stdout) == (int(code), "")
        out = cli("run", "--conflict-exit-code", code, "-w", "0.01", lock_path, "true")
        assert out.returncode == int(code)


def test_timeout_names_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    out = cli("run", "-w", "0.1", "-E", "9", lock_path, "echo", "ran")
    assert (out.returncode, out.stdout) == (9, "")
    assert "timed out after 0.1 s waiting for" in out.stderr
    assert f"pid {holder.pid}" in out.stderr


def test_nonblock_wins_over_a_timeout_and_zero_is_nonblock(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path)
    # A 60 s timeout would hang the test (subprocess timeout 30) if -n lost.
    for args in (["-n", "-w", "60"], ["-w", "60", "-n"], ["-w", "0"], ["--wait=0.0"]):
        out = cli("run", "-q", *args, lock_path, "true", timeout=30)
        assert out.returncode == 1, args


def test_run_waits_for_the_holder(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    proc = subprocess.Popen(
        [PYLOCK, "run", lock_path, "echo", "ran"], stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        wait_blocked(lock_path, proc.pid)
        holder.release()
        out, _ = proc.communicate(timeout=30)
        assert (out, proc.returncode) == ("ran\n", 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_shared_and_exclusive_last_one_wins(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path, shared=True)
    assert cli("run", "-n", "-s", lock_path, "true").returncode == 0
    assert cli("run", "-n", "--shared", lock_path, "true").returncode == 0
    assert cli("run", "-q", "-n", lock_path, "true").returncode == 1
    assert cli("run", "-q", "-n", "-s", "-x", lock_path, "true").returncode == 1
    assert cli("run", "-q", "-n", "-s", "-e", lock_path, "true").returncode == 1
    assert cli("run", "-q", "-n", "-x", "-s", lock_path, "true").returncode == 0
    assert cli("run", "-q", "-nxs", lock_path, "true").returncode == 0


def test_verbose_prints_flocks_messages(lock_path: str, spawn_holder) -> None:
    out = cli("run", "--verbose", lock_path, "true")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("pylock: getting lock took ") and lines[0].endswith(" seconds")
    assert lines[1:] == ["pylock: executing true"]
    spawn_holder(lock_path)
    out = cli("run", "--verbose", "-q", "-n", lock_path, "true")
    assert (out.returncode, out.stderr) == (1, "pylock: failed to get lock\n")
    out = cli("run", "--verbose", "-q", "-w", "0.01", lock_path, "true")
    assert (out.returncode, out.stderr) == (1, "pylock: timeout while waiting to get lock\n")


def test_no_fork_execs_in_place(lock_path: str) -> None:
    proc = subprocess.Popen(
        [PYLOCK, "run", "-F", lock_path, "sh", "-c", "echo $$"],
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    out, _ = proc.communicate(timeout=30)
    assert (int(out), proc.returncode) == (proc.pid, 0)


# -- usage errors: one line, exit 64, never a traceback ----------------------------

USAGE_ERRORS = [
    [],
    ["run"],
    ["run", "-n"],
    ["run", "-Z", "f", "true"],
    ["run", "--bogus", "f", "true"],
    ["run", "--no", "f", "true"],  # ambiguous: --nonblock, --no-fork
    ["run", "--shared=yes", "f", "true"],
    ["run", "-w"],
    ["run", "-w", "-1", "f", "true"],
    ["run", "-w", "abc", "f", "true"],
    ["run", "-w", "", "f", "true"],
    ["run", "-w", "nan", "f", "true"],
    ["run", "-w", "inf", "f", "true"],
    ["run", "-w", "1,5", "f", "true"],
    ["run", "-E", "256", "f", "true"],
    ["run", "-E", "-1", "f", "true"],
    ["run", "-E", "x", "f", "true"],
    ["run", "-E", "0x10", "f", "true"],
    ["run", "-F", "-o", "f", "true"],
    ["run", "f", "-c"],
    ["run", "f", "-c", "a", "b"],
    ["run", "-c", "true"],
    ["run", "-c", "true", "f", "g"],
    ["run", "f", "--"],
    ["run", "abc"],
    ["run", "--fcntl", "f", "true"],
    ["run", "--start", "0", "f", "true"],
    ["run", "--length", "1", "f", "true"],
    ["frobnicate"],
    ["--bogus"],
    ["who"],
    ["who", "--bogus", "f"],
    ["wait"],
    ["wait", "a", "b"],
    ["wait-exit"],
    ["wait-exit", "notapid"],
    ["wait-exit", "0"],
    ["wait-exit", "-w", "x", "1"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=lambda a: " ".join(a) or "(none)")
def test_usage_errors(tmp_path: Path, args: list[str]) -> None:
    out = cli(*args, cwd=tmp_path)
    assert out.returncode == 64, out
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("pylock") and "-h'" in line
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "f").exists()  # nothing was locked or created


def test_help_and_version() -> None:
    top = cli("--help")
    assert top.returncode == 0
    for name in ("run", "who", "wait", "wait-exit"):
        assert f"  {name} " in top.stdout
        sub = cli(name, "-h")
        assert sub.returncode == 0 and sub.stdout.startswith("Usage:\n pylock " + name)
    run_help = cli("run", "--help").stdout
    for option in ("--shared", "--exclusive", "--unlock", "--nonblock", "--timeout", "--wait",
                   "--conflict-exit-code", "--close", "--command", "--fd", "--no-fork",
                   "--quiet", "--verbose", "--version", "symbolic link"):  # fmt: skip
        assert option in run_help, option
    for args in (["--version"], ["-V"], ["run", "-V"], ["run", "--version"]):
        out = cli(*args)
        assert (out.returncode, out.stdout) == (0, f"pylock {pylock.__version__}\n")


@pytest.mark.root
def test_a_record_a_full_disk_drops_is_said_in_one_line() -> None:
    """The lock is taken and the command runs; one line on stderr says the
    record could not be written (-q too: a lost record is not flock(1)'s
    silence).  A read-only filesystem is locked silently, as flock(1) locks it."""
    with mounts.tmpfs(size="64k") as d:
        path = os.path.join(d, "full.lock")
        open(path, "wb").close()
        mounts.fill_space(d)
        for quiet in ([], ["-q"]):
            out = cli("run", *quiet, path, "echo", "ran")
            assert (out.returncode, out.stdout) == (0, "ran\n"), quiet
            (line,) = out.stderr.splitlines()
            assert line.startswith(f"pylock: holding {path}, but its holder record"), line
            assert os.strerror(errno.ENOSPC) in line
    with mounts.readonly_tmpfs(lambda d: open(os.path.join(d, "ro.lock"), "wb").close()) as d:
        out = cli("run", os.path.join(d, "ro.lock"), "echo", "ran")
        assert (out.returncode, out.stdout, out.stderr) == (0, "ran\n", "")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root, setpriv")
def test_read_only_files_are_locked_as_another_user() -> None:
    """A file the caller may read but not write: locked, not a byte written, 66 if unreadable."""
    import tempfile

    # The interpreter and pylock must be usable by uid 65534: not so where
    # they live under a private directory (a pyenv Python in /root with a
    # shared libpython, as the wheel check uses).
    probe = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYLOCK, "--version"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot run {PYLOCK}: {probe.stderr.strip()[:200]}")
    # Outside pytest's directories, which only root may enter.
    with tempfile.TemporaryDirectory(prefix="pylock-cli-") as name:
        shared = Path(name)
        shared.chmod(0o755)
        _read_only_files(shared)


def _read_only_files(shared: Path) -> None:
    empty = shared / "empty.lock"
    empty.touch()
    empty.chmod(0o644)
    script = shared / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    secret = shared / "secret.lock"
    secret.touch()
    secret.chmod(0o600)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYLOCK, "run"]
    for path in (empty, script):
        before = path.read_bytes()
        holder = Holder(nobody, str(path))
        try:
            out = subprocess.run(
                ["flock", "-n", str(path), "true"], capture_output=True, env=cli_env()
            )
            assert out.returncode == 1  # root is excluded by nobody's read-only lock
        finally:
            assert holder.release() == 0
        assert path.read_bytes() == before
        out = subprocess.run([*nobody, "-n", str(path), "true"], capture_output=True, env=cli_env())
        assert (out.returncode, out.stderr) == (0, b"")
    out = subprocess.run(
        [*nobody, str(secret), "true"], capture_output=True, text=True, env=cli_env()
    )
    assert out.returncode == 66 and "Permission denied" in out.stderr
