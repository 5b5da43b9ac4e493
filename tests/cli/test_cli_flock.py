"""pylock run beside util-linux flock(1).

1. Side by side: every row runs the real flock(1) and `pylock run -q` with the
   same arguments in the same state and compares exit status, stdout and
   whether stderr is empty (so -q is silent exactly where flock(1) is).
2. util-linux's own flock test scenarios (tests/ts/flock: flock, unlock,
   close; the --fcntl and byte-range parts left out), reimplemented here and
   run through a two-line wrapper script named `flock` that execs
   `pylock run -q "$@"`, against the outputs util-linux expects.  flock(1)
   prints its own name in --verbose messages; the wrapper's say "pylock", so
   outputs are compared with that name normalised.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import FLOCK, PYLOCK, Holder, cli_env, needs_flock
from tests.support.kernel_locks import wait_blocked

F = "F"  # stands for the lock file in the rows below
D = "D"  # a directory
C = "C"  # a character device of the test's own (any process may flock /dev/null)

# (holder, arguments): holder is None, "exclusive" or "shared" (a flock(1) process).
ROWS: list[tuple[str | None, list[str]]] = [
    (None, []),
    (None, ["-n"]),
    (None, [F, "true"]),
    (None, [F, "echo", "a", "b"]),
    (None, ["--", F, "echo", "x"]),
    (None, [F, "sh", "-c", "exit 7"]),
    (None, [F, "sh", "-c", "kill -9 $$"]),
    (None, [F, "sh", "-c", "echo out; echo err >&2"]),
    (None, ["-s", F, "true"]),
    (None, ["-x", F, "true"]),
    (None, ["-e", F, "true"]),
    (None, ["-u", F, "true"]),
    (None, ["-o", F, "true"]),
    (None, ["-F", F, "true"]),
    (None, ["-nxs", F, "true"]),
    (None, ["--shared", "--exclusive", "--nonblocking", F, "true"]),
    (None, ["--nb", F, "true"]),
    (None, ["--nonbl", F, "true"]),
    (None, ["--timeout=0.5", F, "true"]),
    (None, ["--wait", "0.5", F, "true"]),
    (None, ["-w0.5", F, "true"]),
    (None, ["-w", ".5", F, "true"]),
    (None, ["-w", "1e2", F, "true"]),
    (None, ["-w", "0x10", F, "true"]),
    (None, ["-w", " 1", F, "true"]),
    (None, ["-E", " 7", F, "true"]),
    (None, ["-E", "07", F, "true"]),
    (None, ["-E", "255", F, "true"]),
    (None, [F, "-c", "echo $0 ran"]),
    (None, [F, "--command", "echo ran"]),
    (None, [D, "true"]),
    (None, [C, "true"]),
    # Usage errors: 64.
    (None, ["-Z", F, "true"]),
    (None, ["--bogus", F, "true"]),
    (None, ["--no", F, "true"]),
    (None, ["--shared=1", F, "true"]),
    (None, ["-w"]),
    (None, ["-w", "abc", F, "true"]),
    (None, ["-w", "", F, "true"]),
    (None, ["-w", "1,5", F, "true"]),
    (None, ["-w", "1.5x", F, "true"]),
    (None, ["-E", "256", F, "true"]),
    (None, ["-E", "-1", F, "true"]),
    (None, ["-E", "x", F, "true"]),
    (None, ["-E", "0x10", F, "true"]),
    (None, ["-F", "-o", F, "true"]),
    (None, [F, "-c"]),
    (None, [F, "-c", "a", "b"]),
    (None, [F, "--command", "a", "b"]),
    (None, ["abc"]),
    # The descriptor that is not open: 65; files and commands that fail: 66, 69.
    (None, ["99"]),
    (None, [F, "/nonexistent/cmd"]),
    (None, ["/nodir/x", "true"]),
    # Conflicts.
    ("exclusive", ["-n", F, "echo", "x"]),
    ("exclusive", ["-n", "-E", "42", F, "echo", "x"]),
    ("exclusive", ["-n", "-E", "0", F, "echo", "x"]),
    ("exclusive", ["-w", "0", F, "true"]),
    ("exclusive", ["-w", "0.05", F, "true"]),
    ("exclusive", ["-n", "-w", "60", F, "true"]),
    ("exclusive", ["-w", "60", "-n", F, "true"]),
    ("exclusive", ["-s", "-n", F, "true"]),
    ("exclusive", ["-F", "-n", "-E", "3", F, "true"]),
    ("exclusive", ["-n", D, "true"]),
    ("shared", ["-s", "-n", F, "echo", "x"]),
    ("shared", ["-n", F, "true"]),
    ("shared", ["-s", "-x", "-n", F, "true"]),
    ("shared", ["-x", "-s", "-n", F, "true"]),
]


def _materialise(args: list[str], tmp_path: Path, device: str) -> list[str]:
    names = {F: str(tmp_path / "lock"), D: str(tmp_path / "dir"), C: device}
    return [names.get(word, word) for word in args]


@needs_flock
@pytest.mark.parametrize(("holder", "args"), ROWS, ids=lambda v: " ".join(v) if v else str(v))
def test_side_by_side_with_flock(
    tmp_path: Path, char_device: str, holder: str | None, args: list[str]
) -> None:
    assert FLOCK is not None
    (tmp_path / "dir").mkdir()
    lock = str(tmp_path / "lock")
    argv = _materialise(args, tmp_path, char_device)
    results = []
    for tool in ([FLOCK], [PYLOCK, "run", "-q"]):
        held = None
        if holder is not None:
            target = str(tmp_path / "dir") if D in args else lock
            held = Holder([FLOCK], target, *(["-s"] if holder == "shared" else []))
        try:
            out = subprocess.run(
                [*tool, *argv],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env=cli_env({"SHELL": "/bin/sh"}),
                stdin=subprocess.DEVNULL,
                timeout=30,
            )
        finally:
            if held is not None:
                held.release()
        results.append((out.returncode, out.stdout, out.stderr == ""))
    flock_result, pylock_result = results
    assert pylock_result == flock_result
    assert "Traceback" not in out.stderr


@needs_flock
def test_deliberate_differences(tmp_path: Path) -> None:
    """Where pylock run differs from flock(1) on purpose, side by side."""
    assert FLOCK is not None
    lock = str(tmp_path / "lock")
    # A negative timeout is a usage error (64), as the issue asks; flock(1)
    # 2.38 fails later, setting its timer up (71).
    out = subprocess.run([PYLOCK, "run", "-w", "-1", lock, "true"], capture_output=True)
    assert out.returncode == 64
    # A symlinked lock path is refused (66): flock(1) follows it.
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert subprocess.run([FLOCK, str(link), "true"]).returncode == 0
    out = subprocess.run([PYLOCK, "run", str(link), "true"], capture_output=True, text=True)
    assert out.returncode == 66 and "symbolic link" in out.stderr
    assert target.read_text() == "precious\n"


# -- util-linux's scenarios through a wrapper ------------------------------------------


@pytest.fixture
def wrapper(tmp_path: Path) -> str:
    """The two-line wrapper: `flock` that is really `pylock run -q`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "flock"
    script.write_text(f'#!/bin/sh\nexec {PYLOCK} run -q "$@"\n')
    script.chmod(0o755)
    return str(script)


def _tools(wrapper: str) -> list[str]:
    return [wrapper] + ([FLOCK] if FLOCK else [])


def _normalise(text: str) -> str:
    text = re.sub(r"^pylock: ", "flock: ", text, flags=re.M)
    return re.sub(r"(took) [0-9]+\.[0-9]+ (seconds)$", r"\1 <n> \2", text, flags=re.M)


NEVER = "You will never see this!"


def _do_lock(tool: str, lock: str, opts: list[str], expected: int, message: str) -> str:
    """One subtest of the scenario: the command's output, then Success or Failed."""
    out = subprocess.run(
        [tool, *opts, lock, "echo", message], capture_output=True, text=True, env=cli_env()
    )
    verdict = "Success" if out.returncode == expected else f"Failed [rc={out.returncode}]"
    return f"{out.stdout}{verdict}\n"


def test_scenario_flock(tmp_path: Path, wrapper: str) -> None:
    """util-linux ts/flock/flock (flock(2) part): a shared holder in the background,
    then non-block, no-fork, shared, exclusive, fd and timeout subtests."""
    for tool in _tools(wrapper):
        lock = str(tmp_path / "lockfile")
        hold = "echo 'API: flock(2)'; echo Locking; read x; echo Unlocking"
        background = subprocess.Popen(
            [tool, "--shared", lock, "bash", "-c", hold],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        assert background.stdout is not None and background.stdin is not None
        log = [background.stdout.readline(), background.stdout.readline()]
        conflict = ["--conflict-exit-code", "123"]
        log.append(_do_lock(tool, lock, ["--nonblock", *conflict], 123, NEVER))
        log.append(_do_lock(tool, lock, ["--no-fork", "--nonblock", *conflict], 123, NEVER))
        log.append(_do_lock(tool, lock, ["--shared"], 0, "Have shared lock"))
        log.append(_do_lock(tool, lock, ["--nonblock", "--exclusive", *conflict], 123, NEVER))
        descriptor = f"cd {tmp_path} && exec 4<>{lock} && {tool} --nonblock --exclusive "
        fd_case = subprocess.run(
            ["bash", "-c", descriptor + "--conflict-exit-code 123 4; echo $?"],
            capture_output=True,
            text=True,
            env=cli_env(),
        )
        log.append("Success\n" if fd_case.stdout == "123\n" else f"Failed {fd_case.stdout}")
        assert not (tmp_path / "4").exists()  # the descriptor is not a file name
        waiter = subprocess.Popen(
            [tool, "--timeout", "5", "--conflict-exit-code", "5", lock, "echo", "After timeout."],
            stdout=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        # The background holder lets go only once the waiter is seen blocked.
        wait_blocked(lock, waiter.pid)  # the wrapper execs pylock: the same pid
        background.stdin.close()
        log.append(background.stdout.read())
        assert background.wait(timeout=30) == 0
        out, _ = waiter.communicate(timeout=30)
        log.append(out)
        log.append("Success\n" if waiter.returncode == 0 else f"Failed [{waiter.returncode}]\n")
        background.stdout.close()
        assert "".join(log) == (
            "API: flock(2)\nLocking\n"
            "Success\n"  # non-block
            "Success\n"  # no-fork
            "Have shared lock\nSuccess\n"
            "Success\n"  # exclusive
            "Success\n"  # fd
            "Unlocking\n"
            "After timeout.\nSuccess\n"
        ), tool
        os.unlink(lock)


def test_scenario_unlock(tmp_path: Path, wrapper: str) -> None:
    """util-linux ts/flock/unlock: lock a descriptor verbosely, unlock it, then
    -w 0 on the file succeeds (0 is non-blocking)."""
    for tool in _tools(wrapper):
        lock = tmp_path / "lock"
        script = (
            f'exec 10<>"{lock}"\n'
            f"{tool} --exclusive --nonblock --verbose 10\n"
            f"{tool} --unlock 10\n"
            f'{tool} --exclusive --wait 0 --verbose "{lock}" true\n'
        )
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=cli_env())
        assert _normalise(out.stdout) == (
            "flock: getting lock took <n> seconds\n"
            "flock: getting lock took <n> seconds\n"
            "flock: executing true\n"
        ), tool
        assert out.stderr == ""


def _supports_fd(tool: str) -> bool:
    out = subprocess.run([tool, "--help"], capture_output=True, text=True, env=cli_env())
    return "--fd" in out.stdout


def test_scenario_close(tmp_path: Path, wrapper: str) -> None:
    """util-linux ts/flock/close: with --close the command does not inherit the
    descriptor (the inner lock fails with EBADF: 65); without, it does (0)."""
    tools = [tool for tool in _tools(wrapper) if _supports_fd(tool)]
    assert wrapper in tools
    for tool in tools:
        lock = tmp_path / "lock"
        output, errors = tmp_path / "out", tmp_path / "err"
        inner = f"{tool} --exclusive --nonblock --fd 10 true >>{output} 2>>{errors}"
        script = (
            f'exec 10<>"{lock}"\n'
            f'{tool} --exclusive --close --fd 10 --command "{inner}" >>{output} 2>>{errors}\n'
            f'echo "exit code: $?" >>{output}\n'
            f'{tool} --exclusive --fd 10 --command "{inner}" >>{output} 2>>{errors}\n'
            f'echo "exit code: $?" >>{output}\n'
        )
        subprocess.run(["bash", "-c", script], env=cli_env(), check=True)
        ebadf = os.strerror(9)
        assert output.read_text() == "exit code: 65\nexit code: 0\n", tool
        assert _normalise(errors.read_text()).replace(ebadf, "EBADF") == "flock: 10: EBADF\n"
        output.unlink()
        errors.unlink()
