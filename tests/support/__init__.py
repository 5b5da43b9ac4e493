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

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def env_with_repo(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that must import pylock and tests.support from
    this checkout, whatever its working directory."""
    result = dict(os.environ if env is None else env)
    path = result.get("PYTHONPATH", "")
    parts = [p for p in path.split(os.pathsep) if p]
    if REPO_ROOT not in parts:
        parts.insert(0, REPO_ROOT)
    result["PYTHONPATH"] = os.pathsep.join(parts)
    return result
