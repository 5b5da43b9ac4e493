"""pylock run beside util-linux flock(1) for a descriptor it cannot use."""

from __future__ import annotations

import os

from tests.support.cli import cli


def test_pylock_run_of_a_negative_descriptor_exits_65_as_flock_does() -> None:
    out = cli("run", "--", "-1")
    assert (out.returncode, out.stderr) == (65, f"pylock: -1: {os.strerror(9)}\n")
    out = cli("run", "--", "-2147483649")  # beyond a C int: a usage error, as flock(1)
    assert out.returncode == 64 and out.stderr.startswith("pylock run: bad file descriptor")
    assert cli("run", "--fd", "-1", "true").returncode == 64  # --fd takes descriptors only
