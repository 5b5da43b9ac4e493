"""pylock run and the processes around it: descriptors the command inherits, a
background grandchild that keeps the lock, signals (Ctrl-C to the process group
as a terminal sends it, SIGINT/SIGTERM to the wrapper alone, ignored signals),
the live status line on a terminal, and the self-locking script idiom."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pidfd_open
from tests.support.cli import (
    FLOCK,
    PYLOCK,
    Holder,
    cli,
    cli_env,
    needs_flock,
)
from tests.support.kernel_locks import free_now, wait_blocked

WRAPPERS = [pytest.param([PYLOCK, "run"], id="pylock")]
if FLOCK is not None:
    WRAPPERS.append(pytest.param([FLOCK], id="flock"))


@contextlib.contextmanager
def started(argv: list[str], **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    """A wrapper in its own session (so a process-group signal reaches only it and its command)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        start_new_session=True,
        **kwargs,  # type: ignore[call-overload]
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# -- descriptors ------------------------------------------------------------------


def test_inherited_descriptors_reach_the_command(lock_path: str) -> None:
    read_end, write_end = os.pipe()
    try:
        # Descriptor 9 exists only in the child (pytest itself may use 9).
        out = cli(
            *("run", lock_path, "sh", "-c", "echo through-9 >&9"),
            close_fds=False,
            preexec_fn=lambda: os.dup2(write_end, 9),
        )
        assert out.returncode == 0, out.stderr
    finally:
        os.close(write_end)
    with os.fdopen(read_end) as pipe:
        assert pipe.read() == "through-9\n"


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_descriptor_form_locks_the_shells_descriptor(lock_path: str, wrapper: list[str]) -> None:
    """( flock -n 9 || exit 1; ... ) 9>FILE, the man page's idiom."""
    tool = " ".join(wrapper)
    script = f"( {tool} -n 9 || exit 1; echo locked; read x || : ) 9>{lock_path}"
    with started(["sh", "-c", script]) as first:
        assert first.stdout is not None and first.stdout.readline() == "locked\n"
        assert not free_now(lock_path)
        second = subprocess.run(
            ["sh", "-c", f"( {PYLOCK} run -n 9 || exit 1; echo locked ) 9>{lock_path}"],
            capture_output=True,
            text=True,
            env=cli_env(),
        )
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr.startswith(f"pylock: descriptor 9 ({lock_path}) is held by pid ")
        assert first.stdin is not None
        first.stdin.close()
        assert first.wait(timeout=30) == 0
    assert free_now(lock_path)


def test_descriptor_form_unlock_and_close(lock_path: str) -> None:
    script = (
        f"exec 9>{lock_path}; {PYLOCK} run -n 9; {PYLOCK} run -q -n {lock_path} true; echo $?; "
        f"{PYLOCK} run -u 9; {PYLOCK} run -n {lock_path} true; echo $?"
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=cli_env())
    assert (out.stdout, out.stderr) == ("1\n0\n", "")
    # --fd N -c CMD: -o keeps the descriptor from the command (EBADF there: 65).
    inner = f"{PYLOCK} run -n --fd 9 true"
    closed = f"exec 9<>{lock_path}; {PYLOCK} run -o --fd 9 -c '{inner}'; echo $?"
    out = subprocess.run(["sh", "-c", closed], capture_output=True, text=True, env=cli_env())
    assert out.stdout == "65\n" and out.stderr == "pylock: 9: Bad file descriptor\n"
    kept = f"exec 9<>{lock_path}; {PYLOCK} run --fd 9 -c '{inner}'; echo $?"
    out = subprocess.run(["sh", "-c", kept], capture_output=True, text=True, env=cli_env())
    assert (out.stdout, out.stderr) == ("0\n", "")


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_background_grandchild_keeps_the_lock(lock_path: str, wrapper: list[str]) -> None:
    command = "sleep 1000 >/dev/null 2>&1 & echo $!"
    out = subprocess.run(
        [*wrapper, lock_path, "sh", "-c", command], capture_output=True, text=True, env=cli_env()
    )
    assert out.returncode == 0, out.stderr
    grandchild = int(out.stdout)
    try:
        assert not free_now(lock_path)  # pylock run only closed its copy; it never unlocks
        who = cli("who", "--all", "--json", lock_path)
        assert who.returncode == 0
        import json

        (report,) = json.loads(who.stdout)
        assert [h["pid"] for h in report["holders"]] == [grandchild]
    finally:
        os.kill(grandchild, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(grandchild, 0)
    deadline = time.monotonic() + 30
    while not free_now(lock_path):  # the orphan is reaped by init, not by us
        assert time.monotonic() < deadline
        time.sleep(0.002)  # re-reading kernel state, not standing in for a signal


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_close_keeps_the_lock_from_the_command(lock_path: str, wrapper: list[str]) -> None:
    command = "sleep 1000 >/dev/null 2>&1 & echo $!"
    out = subprocess.run(
        [*wrapper, "-o", lock_path, "sh", "-c", command],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    grandchild = int(out.stdout)
    try:
        assert free_now(lock_path)
    finally:
        os.kill(grandchild, signal.SIGKILL)


# -- signals -----------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_wrapper_alone_leaves_the_command_and_its_lock(
    lock_path: str, wrapper: list[str], signum: int
) -> None:
    with started([*wrapper, lock_path, "sh", "-c", "echo $$; read x; echo done"]) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        shell = int(proc.stdout.readline())
        shell_exit = pidfd_open(shell)
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=30) == -signum  # ended as flock(1) ends: by the signal
        assert os.path.exists(f"/proc/{shell}")
        assert not free_now(lock_path)  # the command still holds it
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"  # nothing was forwarded to it
        assert select.select([shell_exit], [], [], 30)[0]  # the orphan has exited
        os.close(shell_exit)
    assert free_now(lock_path)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_ctrl_c_reaches_the_command_once(lock_path: str, wrapper: list[str]) -> None:
    script = "trap 'echo got-INT' INT; echo ready; read x; read y; echo done"
    with started([*wrapper, lock_path, "sh", "-c", script]) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert proc.wait(timeout=30) == -signal.SIGINT
        proc.stdin.write("1\n2\n")
        proc.stdin.close()
        assert proc.stdout.read() == "got-INT\ndone\n"


def test_ctrl_c_while_waiting_ends_quietly_by_sigint(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    with started([PYLOCK, "run", lock_path, "echo", "ran"]) as proc:
        wait_blocked(lock_path, proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT  # the shell shows 130
        assert proc.stdout is not None and proc.stderr is not None
        assert (proc.stdout.read(), proc.stderr.read()) == ("", "")
    assert not free_now(lock_path)
    holder.release()
    out = subprocess.run(
        ["sh", "-c", f"{PYLOCK} run {lock_path} sh -c 'kill -INT $PPID; exec cat'; echo $?"],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert out.stdout == "130\n"


def test_exit_status_is_never_lost(lock_path: str) -> None:
    """SIGINT landing as the command exits: the wrapper reports 5 or dies by SIGINT, never 0."""
    seen = set()
    for _ in range(30):
        with started([PYLOCK, "run", lock_path, "sh", "-c", "echo r; exit 5"]) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "r\n"
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=30)
            assert code in (5, -signal.SIGINT), code
            seen.add(code)
    assert seen


# PyPy sets its KeyboardInterrupt handler over an ignored SIGINT at start
# (CPython keeps it ignored): pylock cannot see that the caller ignored it.
PYPY = sys.implementation.name == "pypy"


def _signal_name(signum: int) -> str:
    # PyPy's Signals lacks some of Linux's (SIGSTKFLT, 16).
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def test_signals_the_caller_ignores_stay_ignored(lock_path: str) -> None:
    ignored = [signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1]
    kept = [s for s in ignored if not (PYPY and s == signal.SIGINT)]

    def ignore() -> None:
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)

    # grep reads its own status: it is the command (a shell's own mask moves as it forks).
    out = cli("run", lock_path, "grep", "SigIgn", "/proc/self/status", preexec_fn=ignore)
    mask = int(out.stdout.split()[1], 16)
    for signum in kept:
        assert mask & (1 << (signum - 1)), signal.Signals(signum).name
    # What Python ignores for itself is not passed on.
    default = cli("run", lock_path, "grep", "SigIgn", "/proc/self/status")
    mask = int(default.stdout.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1))
    assert not mask & (1 << (signal.SIGXFSZ - 1))
    assert not mask & (1 << (signal.SIGINT - 1))


def test_command_starts_with_an_empty_signal_mask_and_default_sigchld(lock_path: str) -> None:
    def ignore_sigchld() -> None:
        # Only SIGCHLD ignored by the caller: a test run under nohup (SIGHUP
        # ignored) passes that on, as it should.
        for sig in signal.valid_signals():
            if sig < signal.SIGRTMIN and signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    out = cli(
        *("run", lock_path, "grep", "-E", "SigBlk|SigIgn", "/proc/self/status"),
        preexec_fn=ignore_sigchld,
    )
    fields = dict(line.split(":") for line in out.stdout.splitlines())
    assert int(fields["SigBlk"], 16) == 0
    # Nothing ignored at all: not SIGCHLD (reset as flock(1) does), not
    # SIGPIPE/SIGXFSZ (Python's own), not glibc's internal 32 and 33.
    assert int(fields["SigIgn"], 16) == 0


# -- the self-locking script (flock(1)'s man page) -----------------------------------


def test_self_locking_script_twice(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    body = (
        "#!/bin/sh\n"
        '[ "${FLOCKER}" != "$0" ] && '
        f'exec env FLOCKER="$0" {PYLOCK} run -en "$0" "$0" "$@" || :\n'
        'echo "ran $1 under the lock"\n'
    )
    script.write_text(body)
    script.chmod(0o755)
    for attempt in ("one", "two"):
        out = subprocess.run([str(script), attempt], capture_output=True, text=True, env=cli_env())
        expected = (0, f"ran {attempt} under the lock\n", "")
        assert (out.returncode, out.stdout, out.stderr) == expected
        assert script.read_text() == body  # not a byte of the script was touched


def test_foreign_file_is_locked_but_never_written(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"a,b\n1,2\n")
    holder = Holder([PYLOCK, "run"], str(data))
    try:
        out = cli("run", "-n", str(data), "true")
        assert out.returncode == 1 and f"{data} is held by pid {holder.proc.pid}" in out.stderr
    finally:
        holder.release()
    assert data.read_bytes() == b"a,b\n1,2\n"


# -- the live status line ---------------------------------------------------------


def _terminal() -> tuple[int, int]:
    """A pty pair, 400 columns wide (a fresh pty reports 0 columns)."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    return master, slave


def _read_until(fd: int, needle: bytes, timeout: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"never saw {needle!r}; got {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: every slave end is closed
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_status_line_on_a_terminal_is_drawn_and_erased(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    master, slave = _terminal()
    try:
        proc = subprocess.Popen(
            [PYLOCK, "run", lock_path, "echo", "ran"],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            env=cli_env(),
        )
        os.close(slave)
        slave = -1
        shown = _read_until(master, b"\r\x1b[Kpylock: waiting 2s")
        line = shown.decode().split("\r\x1b[K")[-2]
        assert line.startswith(f"pylock: waiting 1s for {lock_path}, held by pid {holder.pid} (")
        holder.release()
        rest = _read_until(master, b"\r\x1b[K" + b"\xff")  # until EOF
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and proc.stdout.read() == "ran\n"
        assert rest.endswith(b"\r\x1b[K")  # erased: the last thing written
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_no_status_line_in_pipes_or_with_quiet(lock_path: str, spawn_holder) -> None:
    holder = spawn_holder(lock_path)
    master, slave = _terminal()
    try:
        quiet = subprocess.Popen(
            [PYLOCK, "run", "-q", lock_path, "true"], stderr=slave, env=cli_env()
        )
        piped = subprocess.Popen(
            [PYLOCK, "run", lock_path, "true"], stderr=subprocess.PIPE, env=cli_env()
        )
        os.close(slave)
        slave = -1
        wait_blocked(lock_path, quiet.pid)
        wait_blocked(lock_path, piped.pid)
        # Past the one-second mark: a status line would have been drawn by now.
        # (Waiting for the absence of output cannot be signalled; this bounds it.)
        ready, _, _ = select.select([master], [], [], 2.5)
        assert not ready
        holder.release()
        assert quiet.wait(timeout=30) == 0
        _, err = piped.communicate(timeout=30)
        assert (piped.returncode, err) == (0, b"")
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_ctrl_c_erases_the_status_line(lock_path: str, spawn_holder) -> None:
    spawn_holder(lock_path)
    master, slave = _terminal()
    try:
        proc = subprocess.Popen(
            [PYLOCK, "run", lock_path, "true"],
            stderr=slave,
            env=cli_env(),
            start_new_session=True,
        )
        os.close(slave)
        slave = -1
        _read_until(master, b"pylock: waiting 1s")
        os.killpg(proc.pid, signal.SIGINT)
        rest = _read_until(master, b"\xff")  # until EOF
        assert proc.wait(timeout=30) == -signal.SIGINT
        assert rest.endswith(b"\r\x1b[K")
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


@needs_flock
def test_interop_both_ways_with_flock(lock_path: str) -> None:
    assert FLOCK is not None
    held_by_flock = Holder([FLOCK], lock_path)
    try:
        out = cli("run", "-n", lock_path, "true")
        assert out.returncode == 1
        assert f"is held by pid {held_by_flock.proc.pid} (flock " in out.stderr
    finally:
        held_by_flock.release()
    held_by_pylock = Holder([PYLOCK, "run"], lock_path)
    try:
        assert subprocess.run([FLOCK, "-n", lock_path, "true"]).returncode == 1
    finally:
        held_by_pylock.release()
    assert subprocess.run([FLOCK, "-n", lock_path, "true"]).returncode == 0


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # SIGSTKFLT (16) has a name from Python 3.11 on
        return f"signal {signum}"


@pytest.mark.checkout
def test_exactly_the_signals_the_readme_names_are_not_passed_on_ignored(lock_path: str) -> None:
    """Every catchable signal ignored by the caller: the command finds all of
    them ignored but those the README's command-line section names, and the
    README names exactly those."""
    import re

    from tests.support import REPO_ROOT

    kept = (signal.SIGKILL, signal.SIGSTOP)
    catchable = [s for s in signal.valid_signals() if s < signal.SIGRTMIN and s not in kept]

    def ignore_all() -> None:
        for signum in catchable:
            signal.signal(signum, signal.SIG_IGN)

    def ignored(*wrapper: str) -> set[str]:
        argv = [*wrapper, "grep", "SigIgn", "/proc/self/status"]
        out = subprocess.run(
            argv, capture_output=True, text=True, env=cli_env(), preexec_fn=ignore_all
        )
        mask = int(out.stdout.split()[1], 16)
        return {_signal_name(s) for s in catchable if mask & (1 << (s - 1))}

    # The control: what a plain exec keeps ignored here (the starting
    # process may keep fewer, e.g. a synchronous signal).
    reset = ignored() - ignored(PYLOCK, "run", lock_path)
    assert reset == {"SIGPIPE", "SIGXFSZ", "SIGCHLD", *(["SIGINT"] if PYPY else [])}
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    start = readme.index("Signals the caller ignored stay ignored in the command")
    sentence = readme[start : readme.index(").", start)]
    assert set(re.findall(r"\bSIG[A-Z]+\b", sentence)) == reset - {"SIGINT"}, sentence
    if PYPY:
        pypy = readme[readme.index("Under PyPy a fourth", start) :]
        assert "SIGINT" in pypy[: pypy.index(".")], pypy
