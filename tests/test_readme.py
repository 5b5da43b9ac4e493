"""Every code block of README.md runs as shown.

A block's fence names its language.  `text` blocks are output, synopses and
annotated shapes, not code.  A `python` or `sh` block runs as it stands,
from a directory of the test's own, and must succeed, unless the HTML comment
on the line above it says otherwise:

    <!-- readme-test: skip: WHY -->          not run, for the reason given
    <!-- readme-test: NAME (what it gets) -->  run by RUNNERS[NAME] below, which
                                              gives the block what the comment
                                              says (a holder, a daemon, names)

A `console` session or an `ini` file must carry one of the two.  Links are
absolute, so they work where PyPI shows the README too.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT, env_with_repo
from tests.support.children import HolderProcess
from tests.support.cli import PYLOCK, Holder

README = Path(REPO_ROOT) / "README.md"
pytestmark = pytest.mark.checkout  # reads README.md, .ci/run and examples/

MARKER = re.compile(r"^\s*<!-- readme-test: (?P<what>.*) -->\s*$")


@dataclass
class Block:
    line: int  # of the opening fence
    lang: str
    code: str
    marker: str | None

    @property
    def runner(self) -> str | None:
        return None if self.marker is None else self.marker.split()[0].rstrip(":")

    def __str__(self) -> str:
        return f"README.md:{self.line}:{self.lang}:{self.runner or 'as-is'}"


def blocks() -> list[Block]:
    found, lines = [], README.read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = lines[i].lstrip()
        if not fence.startswith("```"):
            i += 1
            continue
        indent = len(lines[i]) - len(fence)
        start, body = i, []
        i += 1
        while not lines[i].lstrip().startswith("```"):
            body.append(lines[i][indent:])
            i += 1
        above = MARKER.match(lines[start - 1])
        marker = above.group("what") if above else None
        found.append(Block(start + 1, fence[3:].strip(), "\n".join(body) + "\n", marker))
        i += 1
    return found


# Against an installed wheel (tests/ alone, no README.md) there is nothing to
# run: the checkout marker skips every test here.
BLOCKS = blocks() if README.exists() else []
RUN = [b for b in BLOCKS if b.lang in ("python", "sh", "console") and b.runner != "skip"]


# -- what every block and link must be ---------------------------------------------


def test_every_block_says_what_it_is_and_how_it_is_checked() -> None:
    for block in BLOCKS:
        assert block.lang in ("python", "sh", "console", "ini", "text"), block
        if block.lang == "text":
            assert block.marker is None, f"{block}: output is not run; no marker"
        elif block.lang in ("console", "ini"):
            assert block.runner in ("skip", *RUNNERS), f"{block}: mark how it is checked"
        if block.runner == "skip":
            assert block.marker is not None and len(block.marker) > len("skip: ") + 10, (
                f"{block}: say why it is not run"
            )
        elif block.runner is not None:
            assert block.runner in RUNNERS, f"{block}: no runner {block.runner!r}"


def test_every_link_is_absolute() -> None:
    # PyPI shows the README without the repository around it: a relative link
    # (examples/daemon.py, bench/latency.png, #a-heading) goes nowhere there.
    targets = re.findall(r"\]\(([^)\s]+)", README.read_text())
    assert targets
    assert [t for t in targets if not t.startswith("https://")] == []


def test_ci_runs_the_readme_commands_exactly() -> None:
    (first,) = [b for b in BLOCKS if b.lang == "sh" and "demo.py" in b.code]
    commands = [line for line in first.code.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    run = Path(REPO_ROOT) / ".ci" / "run"
    if not run.exists():
        pytest.skip("no .ci/run here: the sdist carries the tests, not the CI")
    ci = run.read_text().splitlines()
    for command in commands:
        assert command in ci, f".ci/run does not run the README's command: {command}"


# -- running them -----------------------------------------------------------------


@pytest.mark.parametrize("block", RUN, ids=str)
def test_the_block_runs_as_shown(block: Block, tmp_path: Path, request: Any) -> None:
    runner = RUNNERS[block.runner] if block.runner else run_as_is
    runner(block, tmp_path, request)


def run_as_is(block: Block, tmp_path: Path, request: Any) -> None:
    if block.lang == "python":
        done = run_python(block.code, tmp_path)
    else:
        done = subprocess.run(
            ["sh", "-e", "-c", block.code], cwd=tmp_path, capture_output=True, text=True,
            env=env_with_repo(), timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr


# A block runs in the namespace a prelude made (the names its marker says it
# is given), compiled as in `python -m asyncio` when it awaits at top level.
RUN_BLOCK = textwrap.dedent(
    """
    import ast, asyncio, sys
    prelude, block, epilogue = (open(name).read() for name in sys.argv[1:4])
    space = {"__name__": "__main__"}
    exec(compile(prelude, "prelude", "exec"), space)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if sys.argv[4] == "await" else 0
    awaiting = eval(compile(block, "README.md block", "exec", flags=flags), space)
    if awaiting is not None:
        asyncio.run(awaiting)
    exec(compile(epilogue, "epilogue", "exec"), space)
    """
)


def _python_argv(code: str, where: Path, prelude: str, epilogue: str, awaits: bool) -> list[str]:
    files = []
    for name, text in (("prelude.py", prelude), ("block.py", code), ("epilogue.py", epilogue)):
        (where / name).write_text(text)
        files.append(str(where / name))
    return [sys.executable, "-c", RUN_BLOCK, *files, "await" if awaits else "plain"]


def run_python(
    code: str, where: Path, prelude: str = "", epilogue: str = "", awaits: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = _python_argv(code, where, prelude, epilogue, awaits)
    return subprocess.run(
        argv, cwd=where, capture_output=True, text=True, env=env_with_repo(env), timeout=120
    )


def first_screen(block: Block, tmp_path: Path, request: Any) -> None:
    # Nothing held: it takes daemon.lock, runs both job.lock sections, sees
    # backup.lock free.
    done = run_python(block.code, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    # A first instance holds daemon.lock: refused, naming it.
    held = HolderProcess(tmp_path / "daemon.lock")
    try:
        done = run_python(block.code, tmp_path)
    finally:
        held.release()
    assert done.returncode == 1
    assert done.stderr.startswith(f"already running: {tmp_path / 'daemon.lock'} is held by pid ")
    assert f"pid {held.proc.pid} " in done.stderr
    # backup.lock held: the block names its holder and waits for it to exit.
    backup = HolderProcess(tmp_path / "backup.lock", info={"job": "backup"})
    argv = _python_argv(block.code, tmp_path, "", "", awaits=False)
    waiting = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env_with_repo(),
    )  # fmt: skip
    try:
        assert waiting.stdout is not None
        named = waiting.stdout.readline().split()
        assert named[0] == str(backup.proc.pid) and "{'job': 'backup'}" in " ".join(named)
        assert waiting.poll() is None  # waiting for that process to exit
        backup.release()
        assert waiting.wait(timeout=60) == 0
    finally:
        backup.close()
        if waiting.poll() is None:
            waiting.kill()
        waiting.communicate()


HOLDING_CHILD = textwrap.dedent(
    """
    import subprocess, sys
    import pylock
    # A child that holds held.lock until its stdin closes.
    child = subprocess.Popen(
        [sys.executable, "-c", "import pylock, sys; lock = pylock.Lock('held.lock'); "
         "lock.acquire(); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "held\\n"
    pid, lock = child.pid, pylock.Lock("held.lock")
    assert lock.holder().pid == pid
    child.stdin.close()  # it exits now: the block waits for that
    """
)


def exit_watch(block: Block, tmp_path: Path, request: Any) -> None:
    epilogue = "assert returncode is None and exited is True\n"  # the last two: after the exit
    done = run_python(block.code, tmp_path, HOLDING_CHILD, epilogue, awaits=True)
    assert (done.returncode, done.stderr) == (0, "")


def exit_watcher(block: Block, tmp_path: Path, request: Any) -> None:
    prelude = (
        "import subprocess, pylock\n"
        "children = [subprocess.Popen(['sh', '-c', f'exit {n}']) for n in (3, 4, 5)]\n"
        "pids = [child.pid for child in children]\n"
    )
    done = run_python(block.code, tmp_path, prelude, awaits=True)
    assert done.returncode == 0, done.stderr
    seen = sorted(tuple(map(int, line.split())) for line in done.stdout.splitlines())
    assert len(seen) == 3 and [code for _, code in seen] == [3, 4, 5]


def singletons(block: Block, tmp_path: Path, request: Any) -> None:
    prelude = (
        "import os, pylock\ndata = os.path.abspath('data')\nos.makedirs(data, exist_ok=True)\n"
    )
    env = {"PYLOCK_RUNTIME_DIR": str(tmp_path / "runtime")}
    for line in block.code.splitlines():
        epilogue = "assert lock.locked\n"
        done = run_python(line + "\n", tmp_path, prelude, epilogue, awaits=True, env=env)
        assert (done.returncode, done.stderr) == (0, ""), line


def daemon_commands(block: Block, tmp_path: Path, request: Any) -> None:
    first, refused, successor = [line.split("#")[0].strip() for line in block.code.splitlines()]
    port = _free_port()
    commands = [c.replace("9464", str(port)) for c in (first.rstrip("& "), refused, successor)]
    (tmp_path / "examples").symlink_to(Path(REPO_ROOT) / "examples")
    bindir = tmp_path / "bin"  # `python` here is the suite's interpreter
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python").chmod(stat.S_IRWXU)
    env = env_with_repo({**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
    env["PYLOCK_PORT_DIR"] = str(tmp_path / "ports")

    def start(command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["sh", "-c", f"exec {command}"], cwd=tmp_path, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def ready(daemon: subprocess.Popen[str]) -> None:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()
        assert line.startswith(f"ready pid={daemon.pid} "), (line, daemon.stderr)

    daemons = [start(commands[0])]
    try:
        ready(daemons[0])
        done = subprocess.run(shlex.split(commands[1]), cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 75 and f"held by pid {daemons[0].pid} " in done.stderr
        daemons.append(start(commands[2]))
        ready(daemons[1])
        assert daemons[0].wait(timeout=60) == 0  # taken over: SIGTERM, a clean stop
        daemons[1].send_signal(signal.SIGINT)
        assert daemons[1].wait(timeout=60) == 0
    finally:
        for daemon in daemons:
            if daemon.poll() is None:
                daemon.kill()
            daemon.communicate()
    assert not (tmp_path / "data" / "daemon.sock").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcd(block: Block, tmp_path: Path, request: Any) -> None:
    cluster = request.getfixturevalue("etcd")  # skips (saying why) without etcd
    shown = re.search(r'endpoints="([^"]+)"', block.code)
    assert shown is not None
    code = block.code.replace(shown.group(1), cluster.endpoint_list)
    prelude = textwrap.dedent(
        """
        class Storage:  # remembers each write and its fencing token
            def __init__(self):
                self.writes = []
            def write(self, data, fence):
                self.writes.append((data, fence))
        storage, data = Storage(), b"the report"
        """
    )
    epilogue = "assert [d for d, _ in storage.writes] == [data] and storage.writes[0][1] > 0\n"
    done = run_python(code, tmp_path, prelude, epilogue)
    assert (done.returncode, done.stderr) == (0, "")


# A console session: each `$` command runs in turn in bash, and what it prints
# must be the lines below it, but for what differs from machine to machine.
VARIES = [  # (as the README shows it, what it may be here); None: the test's directory
    (r"/tmp/demo|/srv/jobs", None),
    (r"pid \d+", r"pid \d+"),
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"),
    (r"for \d+s", r"for \d+s"),
    (r" on vm\b", r" on \S+"),
    # `pylock` as this machine runs it: its interpreter and script path.
    # A long script path is shown cut short ("/long/path/py...").
    (r"python3 /tmp/plv/bin/pylock", r"\S+ \S*(?:pylock|\.\.\.)"),
    (r"\(python3 /usr/local/bin/pylock run \.\.\.\)", r"\(\S+ \S*(?:pylock|\.\.\.) run .*\)"),
    (r"took \d+\.\d+ seconds", r"took \d+\.\d+ seconds"),
    # The sleep backup.sh just forked may not have exec'd sleep yet.
    (r"\(sleep 30\)", r"\((?:sh|sleep) .*\)"),
]


def expected_line(shown: str, where: Path) -> re.Pattern[str]:
    """shown as a pattern: its literal text, and what varies as VARIES says."""
    pattern, last = [], 0
    for match in re.finditer("|".join(f"({varies})" for varies, _ in VARIES), shown):
        assert match.lastindex is not None
        instead = VARIES[match.lastindex - 1][1]
        pattern += [re.escape(shown[last : match.start()]), instead or re.escape(str(where))]
        last = match.end()
    return re.compile("".join([*pattern, re.escape(shown[last:])]))


def session_env(tmp_path: Path, *first_on_path: Path) -> dict[str, str]:
    path = ":".join([*map(str, first_on_path), os.path.dirname(PYLOCK), os.environ["PATH"]])
    return env_with_repo({**os.environ, "PATH": path})


def run_session(block: Block, where: Path, env: dict[str, str]) -> None:
    """Each `$` command in turn; one ending in `&` runs in the background
    until the session ends, and must say "up" on the FIFO `started` first."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    background: list[subprocess.Popen[bytes]] = []
    try:
        for command, shown in steps:
            if command.endswith("&"):
                background.append(subprocess.Popen(
                    ["bash", "-c", command.rstrip("& ")], cwd=where, env=env,
                    stdout=subprocess.DEVNULL, start_new_session=True,
                ))  # fmt: skip
                assert (where / "started").read_text() == "up\n"
                continue
            done = subprocess.run(
                ["bash", "-c", f"exec 2>&1; {command}"], cwd=where, env=env,
                stdout=subprocess.PIPE, text=True, timeout=60,
            )  # fmt: skip
            printed = done.stdout.splitlines()
            assert len(printed) == len(shown), (command, printed)
            for line, expected in zip(printed, shown):
                assert expected_line(expected, where).fullmatch(line), (command, line, expected)
    finally:
        for job in background:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def session(block: Block, tmp_path: Path, request: Any) -> None:
    os.mkfifo(tmp_path / "started")
    # Up once it runs under the lock, with its sleep started.
    (tmp_path / "backup.sh").write_text("#!/bin/sh\nsleep 30 &\necho up > started\nwait\n")
    (tmp_path / "backup.sh").chmod(stat.S_IRWXU)
    run_session(block, tmp_path, session_env(tmp_path))


def flock_session(block: Block, tmp_path: Path, request: Any) -> None:
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    env = session_env(tmp_path, home / "bin")
    env["HOME"] = str(home)
    holder = Holder([PYLOCK, "run"], str(tmp_path / "backup.lock"))
    try:
        run_session(block, tmp_path, env)
    finally:
        holder.release()
    assert os.readlink(home / "bin" / "flock") == PYLOCK


RUNNERS: dict[str, Callable[[Block, Path, Any], None]] = {
    "session": session,
    "flock-session": flock_session,
    "first-screen": first_screen,
    "exit-watch": exit_watch,
    "exit-watcher": exit_watcher,
    "singletons": singletons,
    "daemon-commands": daemon_commands,
    "etcd": etcd,
}
