"""Test machinery for pylock's suites: probes of what this machine offers,
kernel lock-state helpers, one harness for child processes, an old-kernel
simulator (seccomp), private pid namespaces with chosen pids, and small
throwaway filesystems.

Every module here uses only the standard library (plus pytest for skips), so the
launchers can run before pylock itself is importable.
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

# Probes: what this machine offers.  The suite gates on these (and on the
# `portable` and `root` markers, see tests/conftest.py), never on file names.
LINUX = sys.platform.startswith("linux")


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


IS_ROOT = is_root()

# Whether these tests sit in a source checkout (a wheel's tests run from a
# directory holding only tests/ and pyproject.toml).
CHECKOUT = os.path.isdir(os.path.join(REPO_ROOT, "csrc")) and os.path.isdir(
    os.path.join(REPO_ROOT, "examples")
)


def pidfd_open(pid: int) -> int:
    """os.pidfd_open, also where os lacks it (PyPy): the system call itself."""
    if hasattr(os, "pidfd_open"):
        return os.pidfd_open(pid)
    import ctypes

    # SYS_pidfd_open: 434 on every architecture but alpha.
    fd = int(ctypes.CDLL(None, use_errno=True).syscall(434, pid, 0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def env_with_repo(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that must import tests.support from this
    checkout, and the same pylock as the suite, whatever its working directory."""
    result = dict(os.environ if env is None else env)
    path = result.get("PYTHONPATH", "")
    parts = [p for p in path.split(os.pathsep) if p]
    entry = _tests_path()
    if entry not in parts:
        parts.insert(0, entry)
    result["PYTHONPATH"] = os.pathsep.join(parts)
    return result


_tests_only: list[str] = []


def _tests_path() -> str:
    """The checkout's root, unless the suite's pylock is installed elsewhere:
    then the checkout's pylock/ on a child's path would shadow it, and the
    child gets a directory holding nothing but a link to tests/."""
    import importlib.util

    spec = importlib.util.find_spec("pylock")
    origin = spec.origin if spec is not None else None
    if origin is None or os.path.dirname(os.path.realpath(origin)) == os.path.join(
        REPO_ROOT, "pylock"
    ):
        return REPO_ROOT
    if not _tests_only:
        import atexit
        import shutil
        import tempfile

        top = tempfile.mkdtemp(prefix="pylock-tests-path-")
        os.chmod(top, 0o755)  # the other-user tests' children read it too
        os.symlink(os.path.join(REPO_ROOT, "tests"), os.path.join(top, "tests"))
        creator = os.getpid()
        atexit.register(lambda: os.getpid() == creator and shutil.rmtree(top, True))
        _tests_only.append(top)
    return _tests_only[0]
