"""pylock invoked as `flock` (a symlink to, or a copy of, the installed
console script) is `pylock run` speaking as util-linux flock(1): its
messages start with the name it was invoked by, and its exit codes are
flock(1)'s.  Side by side with the real flock(1) where it is installed, and
util-linux's own tests/ts/flock scenarios compared byte for byte (no
renaming of the messages, as the wrapper in test_cli_flock.py needs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import FLOCK, PYLOCK, Holder, cli, cli_env, needs_flock


@pytest.fixture(params=["symlink", "copy"])
def by_name(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The pylock console script under the name flock."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "flock"
    if request.param == "symlink":
        tool.symlink_to(PYLOCK)
    else:
        shutil.copy2(PYLOCK, tool)
    return str(tool)


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, *args], capture_output=True, text=True, env=cli_env(), timeout=60)


def _timings(text: str) -> str:
    return re.sub(r"(took) [0-9]+\.[0-9]+ (seconds)$", r"\1 <n> \2", text, flags=re.M)


def test_util_linux_unlock_scenario_byte_for_byte(tmp_path: Path, by_name: str) -> None:
    """tests/ts/flock/unlock: its expected output names flock, as flock(1) prints it."""
    lock = tmp_path / "lock"
    script = (
        f'exec 10<>"{lock}"\n'
        f"{by_name} --exclusive --nonblock --verbose 10\n"
        f"{by_name} --unlock 10\n"
        f'{by_name} --exclusive --wait 0 --verbose "{lock}" true\n'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=cli_env())
    assert _timings(out.stdout) == (
        "flock: getting lock took <n> seconds\n"
        "flock: getting lock took <n> seconds\n"
        "flock: executing true\n"
    )
    assert out.stderr == ""


def test_util_linux_close_scenario_byte_for_byte(tmp_path: Path, by_name: str) -> None:
    """tests/ts/flock/close: with --close the command's flock gets EBADF (65)."""
    lock, output, errors = tmp_path / "lock", tmp_path / "out", tmp_path / "err"
    inner = f"{by_name} --exclusive --nonblock --fd 10 true >>{output} 2>>{errors}"
    script = (
        f'exec 10<>"{lock}"\n'
        f'{by_name} --exclusive --close --fd 10 --command "{inner}" >>{output} 2>>{errors}\n'
        f'echo "exit code: $?" >>{output}\n'
        f'{by_name} --exclusive --fd 10 --command "{inner}" >>{output} 2>>{errors}\n'
        f'echo "exit code: $?" >>{output}\n'
    )
    subprocess.run(["bash", "-c", script], env=cli_env(), check=True)
    assert output.read_text() == "exit code: 65\nexit code: 0\n"
    assert errors.read_text() == f"flock: 10: {os.strerror(9)}\n"


F = "F"  # the lock file in the rows below

# Rows whose whole stderr is flock(1)'s, word for word.
SAME_WORDS = [
    ["--", "-1"],
    ["--", "-2147483648"],
    ["99"],
    [F, "/nonexistent/command"],
]
# Rows whose exit code is flock(1)'s and whose every message starts with "flock: ".
SAME_CODE = [
    *SAME_WORDS,
    ["-z"],
    ["--", "-2147483649"],
    ["-E", "300", F, "true"],
    [F, "-c"],
    ["/no/such/dir/f", "true"],
    [F, "sh", "-c", "exit 7"],
    ["-0"],
]


def _fill(row: list[str], lock: str) -> list[str]:
    return [lock if word == F else word for word in row]


@needs_flock
@pytest.mark.parametrize("row", SAME_CODE, ids=" ".join)
def test_exit_codes_and_messages_beside_flock(tmp_path: Path, by_name: str, row: list[str]) -> None:
    lock = str(tmp_path / "lock")
    assert FLOCK is not None
    real = _run(FLOCK, *_fill(row, lock))
    ours = _run(by_name, *_fill(row, lock))
    assert ours.returncode == real.returncode, (ours.stderr, real.stderr)
    assert ours.stdout == real.stdout
    lines = ours.stderr.splitlines()
    assert all(line.startswith("flock: ") for line in lines), ours.stderr
    assert bool(lines) == bool(real.stderr)
    if row in SAME_WORDS:
        assert ours.stderr == real.stderr


@needs_flock
def test_a_conflict_speaks_as_flock_and_still_names_the_holder(
    tmp_path: Path, by_name: str
) -> None:
    lock = str(tmp_path / "lock")
    assert FLOCK is not None
    holder = Holder([FLOCK], lock)
    try:
        for extra in (["-n"], ["-w", "0.05"]):
            real = _run(FLOCK, *extra, "--verbose", lock, "true")
            ours = _run(by_name, *extra, "--verbose", lock, "true")
            assert ours.returncode == real.returncode == 1
            first, named = ours.stderr.splitlines()
            assert first + "\n" == real.stderr  # "flock: failed to get lock", "...timeout..."
            assert named.startswith("flock: ") and f"pid {holder.pid} (flock " in named
            quiet = _run(by_name, *extra, "-q", lock, "true")
            assert (quiet.returncode, quiet.stderr) == (1, "")
    finally:
        holder.release()


def test_the_name_flock_needs_no_subcommand_and_its_help_says_flock(
    tmp_path: Path, by_name: str
) -> None:
    lock = str(tmp_path / "lock")
    out = _run(by_name, lock, "sh", "-c", "echo held")
    assert (out.returncode, out.stdout) == (0, "held\n")
    assert _run(by_name, lock, "run").returncode == 69  # "run" is the command here
    usage = _run(by_name, "-h")
    assert usage.returncode == 0 and usage.stdout.startswith("Usage:\n flock [options] FILE")
    assert "pylock run" not in usage.stdout
    assert _run(by_name, "-z").stderr == "flock: invalid option -- 'z'; see 'flock -h'\n"


def test_pylock_run_of_a_negative_descriptor_exits_65_as_flock_does() -> None:
    out = cli("run", "--", "-1")
    assert (out.returncode, out.stderr) == (65, f"pylock: -1: {os.strerror(9)}\n")
    out = cli("run", "--", "-2147483649")  # beyond a C int: a usage error, as flock(1)
    assert out.returncode == 64 and out.stderr.startswith("pylock run: bad file descriptor")
    assert cli("run", "--fd", "-1", "true").returncode == 64  # --fd takes descriptors only
