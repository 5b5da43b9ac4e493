"""Holders found on filesystems whose files stat and the kernel's lock tables
name differently: btrfs (each subvolume has a device number of its own, the
lock tables use the superblock's, and files in two subvolumes share inode
numbers) and overlayfs (a layer's files carry the layer's device number);
ext4 and XFS are the controls, where both agree.  Real loop mounts, real
holders, as root."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylock
from pylock._daemon.singleton import take_over
from tests.support import mounts
from tests.support.cli import PYLOCK, cli, cli_env
from tests.support.kernel_locks import free_now

pytestmark = pytest.mark.root


def _key_in_table(path: str) -> str:
    """The device the kernel's /proc/locks names path's lock by (it must be locked)."""
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        for line in f:
            words = line.split()
            if len(words) > 5 and words[1] == "FLOCK" and words[5].endswith(f":{ino}"):
                return words[5].rsplit(":", 1)[0]
    raise AssertionError(f"/proc/locks lists no flock on inode {ino}")


def _stat_dev(path: str) -> str:
    dev = os.stat(path).st_dev
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def _assert_named(path: str, holder_pid: int) -> None:
    """Every way pylock names a holder finds holder_pid, verified."""
    found = pylock.Lock(path).holder()
    assert found is not None and found.pid == holder_pid and found.verified, found
    assert [(h.pid, h.verified) for h in pylock.holders(path)] == [(holder_pid, True)]
    with pytest.raises(pylock.LockHeld) as refused:
        pylock.Lock(path).acquire(blocking=False)
    assert refused.value.holder is not None and refused.value.holder.pid == holder_pid
    out = cli("who", path)
    assert out.returncode == 0, out.stderr
    assert f"held by pid {holder_pid} " in out.stdout and "(verified by the kernel)" in out.stdout


def _assert_free(path: str) -> None:
    assert pylock.Lock(path).holder() is None
    assert pylock.holders(path) == []
    assert cli("who", path).returncode == 1
    assert free_now(path)


@pytest.fixture
def btrfs() -> Iterator[str]:
    if mounts.mkfs_missing("btrfs"):
        pytest.skip(str(mounts.mkfs_missing("btrfs")))
    with mounts.loop_filesystem("btrfs") as d:
        for sub in ("sv1", "sv2"):
            subprocess.run(
                ["btrfs", "subvolume", "create", os.path.join(d, sub)],
                check=True,
                capture_output=True,
            )
        yield d


def test_btrfs_holders_are_seen_and_twin_inodes_of_two_subvolumes_kept_apart(
    btrfs: str, spawn_holder
) -> None:
    held, twin = os.path.join(btrfs, "sv1", "job.lock"), os.path.join(btrfs, "sv2", "job.lock")
    Path(held).touch()
    Path(twin).touch()
    # The trap is real: one inode number in two subvolumes, two device numbers.
    assert os.stat(held).st_ino == os.stat(twin).st_ino
    assert os.stat(held).st_dev != os.stat(twin).st_dev
    holder = spawn_holder(held, info={"job": 1})
    assert _key_in_table(held) != _stat_dev(held)  # the tables name the superblock
    _assert_named(held, holder.pid)
    info = pylock.Lock(held).holder()
    assert info is not None and info.info == {"job": 1}  # the record is matched too
    _assert_free(twin)
    twin_holder = spawn_holder(twin)
    _assert_named(twin, twin_holder.pid)
    _assert_named(held, holder.pid)


def test_btrfs_top_level_and_takeover(btrfs: str, spawn_holder) -> None:
    path = os.path.join(btrfs, "top.lock")
    holder = spawn_holder(path)
    assert _key_in_table(path) != _stat_dev(path)
    _assert_named(path, holder.pid)
    lock = pylock.Lock(path)
    try:
        take_over(lock, 30)  # refused when the holder cannot be verified
        assert lock.locked
        holder.wait(timeout=30)
    finally:
        lock.close()


def test_btrfs_another_user_sees_the_holder_unverified(btrfs: str, spawn_holder) -> None:
    """Another user may not inspect root's descriptors: /proc/locks names the
    taker, and for the subvolume twin pylock says it cannot tell which file."""
    held, twin = os.path.join(btrfs, "sv1", "job.lock"), os.path.join(btrfs, "sv2", "job.lock")
    for path in (held, twin):
        Path(path).touch()
        os.chmod(path, 0o644)
    for sub in ("sv1", "sv2"):
        os.chmod(os.path.join(btrfs, sub), 0o755)
    holder = spawn_holder(held)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYLOCK]
    probe = subprocess.run([*nobody, "--version"], capture_output=True, text=True, env=cli_env())
    if probe.returncode != 0:  # a checkout in a private directory (mktemp -d)
        pytest.skip(f"uid 65534 cannot run {PYLOCK}: {probe.stderr.strip()[:200]}")
    out = subprocess.run([*nobody, "who", held], capture_output=True, text=True, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert f"held by pid {holder.pid} " in out.stdout and "unverified" in out.stdout
    out = subprocess.run([*nobody, "who", twin], capture_output=True, text=True, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert "another with the same inode number" in out.stdout


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_ext4_and_xfs_controls(kind: str, spawn_holder) -> None:
    if mounts.mkfs_missing(kind):
        pytest.skip(str(mounts.mkfs_missing(kind)))
    with mounts.loop_filesystem(kind) as d:
        path = os.path.join(d, "job.lock")
        holder = spawn_holder(path)
        assert _key_in_table(path) == _stat_dev(path)
        _assert_named(path, holder.pid)
        holder.release()
        _assert_free(path)


@pytest.mark.parametrize("layers", ["one filesystem", "lower on a tmpfs"])
def test_overlayfs_lower_and_upper_files(tmp_path: Path, layers: str, spawn_holder) -> None:
    with contextlib_lower(tmp_path, layers) as lower:
        Path(lower, "lower.lock").touch()
        with mounts.overlay(lower) as merged:
            from_lower, upper = os.path.join(merged, "lower.lock"), os.path.join(merged, "up.lock")
            first = spawn_holder(from_lower)
            second = spawn_holder(upper)
            _assert_named(from_lower, first.pid)
            _assert_named(upper, second.pid)
            first.release()
            second.release()
            _assert_free(from_lower)


def test_overlayfs_a_file_sharing_its_inode_number_with_a_held_one_is_free(
    spawn_holder,
) -> None:
    """Lower layer on a tmpfs: its first file and the overlay's root directory
    both have inode number 2 in the lock tables' name for them."""
    with mounts.tmpfs(size="1m") as lower:
        Path(lower, "lower.lock").touch()
        with mounts.overlay(lower) as merged:
            path = os.path.join(merged, "lower.lock")
            if os.stat(path).st_ino != os.stat(merged).st_ino:
                pytest.skip("this kernel gives the two distinct inode numbers (xino)")
            holder = spawn_holder(path)
            _assert_named(path, holder.pid)
            out = cli("who", merged)
            assert (out.returncode, out.stdout) == (1, f"{merged}: free\n"), out.stderr


def contextlib_lower(tmp_path: Path, layers: str):  # type: ignore[no-untyped-def]
    """The lower layer: a directory on tmp_path's filesystem, or a tmpfs."""
    import contextlib

    if layers == "lower on a tmpfs":
        return mounts.tmpfs(size="1m")
    lower = tmp_path / "lower"
    lower.mkdir()
    return contextlib.nullcontext(str(lower))
