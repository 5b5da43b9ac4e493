"""The pylock command run by another local user (uid 65534, through setpriv)
in directories root uses: one holder lookup for `pylock run`, `pylock who`
and the API, and `list --clean` going on past a file it may not remove."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pylock._lock import record as _record
from tests.support.cli import FLOCK, PYLOCK, Holder, cli_env

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)"),
]

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NOBODY, PYLOCK, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.fixture
def sticky(public_dir: Path) -> Iterator[Path]:
    """A 1777 directory, as /tmp is."""
    shared = public_dir / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    probe = as_nobody("--version")
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot run {PYLOCK}: {probe.stderr.strip()[:200]}")
    yield shared


def _stale(path: Path, owner: int) -> bytes:
    """A lock file of owner's whose record names a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    data = _record.encode(json.dumps({"pid": proc.pid, "program": "job"}).encode())
    path.write_bytes(data)
    path.chmod(0o644)
    os.chown(path, owner, owner)
    return data


def test_clean_reports_a_file_it_may_not_remove_and_cleans_the_rest(sticky: Path) -> None:
    roots = sticky / "a-root.lock"  # first in the listing: the rest comes after it
    kept = _stale(roots, 0)
    _stale(sticky / "b-nobody.lock", 65534)
    out = as_nobody("list", "--clean", "--json", str(sticky))
    assert out.returncode == 1, out.stderr
    entries = {Path(e["path"]).name: e for e in json.loads(out.stdout)}
    assert entries["b-nobody.lock"]["removed"] is True
    assert entries["a-root.lock"]["removed"] is False
    assert entries["a-root.lock"]["error"] == f"not removed: {os.strerror(1)}"
    assert out.stderr == f"pylock: {roots}: not removed: {os.strerror(1)}\n"
    assert sorted(os.listdir(sticky)) == ["a-root.lock"]
    assert roots.read_bytes() == kept  # locked to check, never written


@pytest.mark.skipif(FLOCK is None, reason="needs util-linux flock(1)")
@pytest.mark.parametrize("kind", ["directory", "foreign file", "pylock file"])
def test_run_names_the_holder_as_who_and_the_api_do(sticky: Path, kind: str) -> None:
    """root holds it; another user may read it but not inspect root's
    descriptors: run, who and the API all name the taker /proc/locks lists."""
    path = sticky / "job"
    if kind == "directory":
        path.mkdir()
        path.chmod(0o755)
    elif kind == "foreign file":
        path.write_text("data of another program\n")
        path.chmod(0o644)
    holder = Holder([FLOCK] if kind != "pylock file" else [PYLOCK, "run"], str(path))
    try:
        named = f"pid {holder.proc.pid} "
        who = as_nobody("who", str(path))
        assert who.returncode == 0 and named in who.stdout, who
        run = as_nobody("run", "-n", str(path), "true")
        assert run.returncode == 1
        assert named in run.stderr and "unverified" in run.stderr, run.stderr
        code = (
            "import sys, pylock\n"
            "try:\n"
            "    print(pylock.holders(sys.argv[1])[0].pid)\n"
            "except pylock.LockFileError:\n"  # a directory: the kernel's tables only
            "    print('directory')\n"
        )
        api = subprocess.run(
            [*NOBODY, sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            env=cli_env(),
        )
        assert api.stdout.strip() in (str(holder.proc.pid), "directory"), api.stderr
    finally:
        holder.release()
