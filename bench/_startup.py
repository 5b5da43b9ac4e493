"""Start-up: what a fresh process pays for pylock, beside the bare interpreter and flock(1).

Operators call `pylock run` from shell loops and cron, and services import
pylock at start, so the figures are whole processes, timed from just before
posix_spawn to the return of waitpid: `python -c pass` (the interpreter's
own start), `python -c "import pylock"`, `import filelock`, the `pylock`
console script running `pylock run FILE true`, and flock(1) doing the same.

Every Python row runs the same interpreter the same way: a fresh, empty
virtual environment of the base interpreter, as a service's venv would be,
so no one's .pth files run at start (an editable install's finder, or a
distribution's or pyenv's hooks, can double the interpreter's own start and
so flatter every ratio); PYTHONPATH names the checkout and the directories
of the C extensions pylock and filelock need, and pylock's bytecode is
compiled beforehand, as an installed wheel has it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import tomllib
from _common import REPO, BenchError, Context, Row, guarded, now, progress

STARTUP_ROWS = ("python", "import-pylock", "import-filelock", "pylock-run", "flock-run")

# What pip (distlib) writes as a console script, less the shebang line: the
# real cost of typing `pylock` includes its `import re`.
CONSOLE_SCRIPT = """\
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {func}
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit({func}())
"""


def startup_python(tmp: str) -> tuple[str, dict[str, str]]:
    """The interpreter and environment every Python row runs with: a fresh,
    empty virtual environment of the base interpreter (as a service's venv
    with pylock installed would be, without anyone's .pth files)."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    if sys.prefix == sys.base_prefix or not os.path.exists(base):
        base = sys.executable
    venv = os.path.join(tmp, "startup-venv")
    subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True, capture_output=True)
    exe = os.path.join(venv, "bin", "python")
    paths = [REPO]
    for module in ("_cffi_backend", "filelock"):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        where = os.path.dirname(spec.origin)
        if spec.submodule_search_locations is not None:  # a package: its parent
            where = os.path.dirname(where)
        if where not in paths:
            paths.append(where)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return exe, env


def console_script(tmp: str) -> str:
    """pylock's console script as pip would write it, from pyproject.toml."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["pylock"]
    module, func = target.split(":")
    path = os.path.join(tmp, "pylock-script")
    with open(path, "w") as f:
        f.write(CONSOLE_SCRIPT.format(module=module, func=func))
    return path


def spawn_ns(argv: list[str], env: dict[str, str]) -> int:
    """Wall time of one process, from just before posix_spawn to waitpid."""
    quiet = [
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    t0 = now()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=quiet)
    _, status = os.waitpid(pid, 0)
    elapsed = now() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise BenchError(f"{' '.join(argv)} exited with {code}")
    return elapsed


def _importtime(argv: list[str], env: dict[str, str]) -> list[tuple[str, int, int]]:
    """(module, cumulative µs, depth) per line of one `-X importtime` run."""
    res = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True
    )
    out = []
    for line in res.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3:
            continue
        try:
            cumulative = int(parts[1])
        except ValueError:
            continue  # the header line
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        out.append((name.strip(), cumulative, depth))
    return out


def heaviest_imports(argv: list[str], env: dict[str, str], top: int = 8) -> list[tuple[str, int]]:
    """The imports with the largest cumulative time (µs) in one `-X importtime`
    run, none inside another shown, leaving out what `python -c pass` loads
    too: where a start-up goes."""
    lines = _importtime(argv, env)
    baseline = {name for name, _, _ in _importtime([argv[0], "-c", "pass"], env)}
    # importtime prints children before their parent, one level deeper.
    parent: list[int | None] = []
    for i, (_, _, depth) in enumerate(lines):
        parent.append(next((j for j in range(i + 1, len(lines)) if lines[j][2] < depth), None))

    def ancestors(i: int) -> set[int]:
        found = set()
        j = parent[i]
        while j is not None:
            found.add(j)
            j = parent[j]
        return found

    order = sorted(
        # pylock's own modules are looked into, not shown: what they import is.
        (
            i
            for i, (name, _, _) in enumerate(lines)
            if name not in baseline and name.split(".")[0] != "pylock"
        ),
        key=lambda i: -lines[i][1],
    )
    shown: list[int] = []
    for i in order:
        if not ancestors(i) & set(shown):
            shown.append(i)
        if len(shown) == top:
            break
    return [(lines[i][0], lines[i][1]) for i in shown]


def measure_startup(ctx: Context) -> dict[str, Row]:
    rows = {k: Row(k) for k in STARTUP_ROWS}
    exe, env = startup_python(ctx.tmp)
    lock_path = os.path.join(ctx.tmp, "startup.lock")
    flock_path = os.path.join(ctx.tmp, "startup-flock.lock")
    true = shutil.which("true") or "/bin/true"
    argvs: dict[str, list[str]] = {
        "python": [exe, "-c", "pass"],
        "import-pylock": [exe, "-c", "import pylock"],
        "import-filelock": [exe, "-c", "import filelock"],
    }
    if ctx.pylock_error:
        for k in ("import-pylock", "pylock-run"):
            rows[k].error = ctx.pylock_error
    else:
        # Bytecode as an installed wheel has it (pip compiles at install).
        compile_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run(
            [exe, "-m", "compileall", "-q", os.path.join(REPO, "pylock")],
            env=compile_env,
            check=False,
            capture_output=True,
        )
        script = console_script(ctx.tmp)

        def find_run_syntax() -> None:
            # `pylock run FILE true`, or the same with "--" where the CLI wants it.
            for extra in ([], ["--"]):
                argv = [exe, script, "run", lock_path, *extra, true]
                try:
                    spawn_ns(argv, env)
                except BenchError as exc:
                    error = str(exc)
                    continue
                argvs["pylock-run"] = argv
                return
            raise BenchError(error)

        guarded(rows["pylock-run"], find_run_syntax)
    flock = shutil.which("flock")
    if flock is None:
        rows["flock-run"].error = "flock(1) is not installed (util-linux)"
    else:
        argvs["flock-run"] = [flock, flock_path, true]
    live = [k for k in STARTUP_ROWS if k in argvs and rows[k].error is None]
    for k in live:  # warm the page cache and the bytecode caches
        for _ in range(3):
            guarded(rows[k], lambda k=k: spawn_ns(argvs[k], env))
    trials = ctx.sizes.startup
    for i in range(trials):
        order = [k for k in live if rows[k].error is None]
        ctx.rng.shuffle(order)
        for k in order:
            guarded(rows[k], lambda k=k: rows[k].samples.append(float(spawn_ns(argvs[k], env))))
        progress("start-up", i + 1, trials)
    for k in ("import-pylock", "pylock-run"):
        if k in argvs and rows[k].ok:
            rows[k].extra["heaviest"] = heaviest_imports(argvs[k], env)
    rows["python"].extra["interpreter"] = os.path.realpath(exe)  # the venv links to it
    rows["python"].extra["pythonpath"] = env["PYTHONPATH"]
    if "pylock-run" in argvs:
        shown = [os.path.basename(a) if a.startswith(ctx.tmp) else a for a in argvs["pylock-run"]]
        rows["pylock-run"].extra["argv"] = " ".join(shown[2:])
    return rows
