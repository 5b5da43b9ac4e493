"""Small throwaway filesystems for full-disk, no-inode and read-only tests.

    with tmpfs() as d:                      # 64 KiB tmpfs
    with tmpfs(size="1m", nr_inodes=4) as d:
    with readonly_tmpfs(populate) as d:     # populate(d) runs before remount,ro
    with readonly_bind(src) as d:           # a read-only view of an existing dir
    with loop_filesystem("btrfs") as d:     # a loop-mounted btrfs, ext4 or xfs image
    with overlay(lower) as d:               # overlayfs over lower, upper in a temp dir

Each mounts on a fresh directory under the system temp dir, yields its path,
and unmounts (lazily if something still holds it) and removes the directory in
``finally``. They need root; under pytest they skip with a clear reason when
not root, elsewhere they raise PermissionError.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator


def _need_root() -> None:
    # Tests that mount are marked root and skipped for anyone else: reaching
    # here unprivileged means a test lacks the marker, which must fail loudly.
    if os.geteuid() != 0:
        raise PermissionError("mounting a filesystem needs root: mark the test @pytest.mark.root")
    if not shutil.which("mount"):
        raise FileNotFoundError("mount(8) is not installed (util-linux)")


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def _umount(path: str) -> None:
    proc = subprocess.run(["umount", path], capture_output=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        # A still-running child may hold a descriptor there; detach the mount
        # now and let the kernel drop it when the last user goes.
        subprocess.run(["umount", "-l", path], capture_output=True, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def _mounted(argv_tail: list[str], prefix: str) -> Iterator[str]:
    _need_root()
    where = tempfile.mkdtemp(prefix=prefix)
    mounted = False
    try:
        _run(["mount", *argv_tail, where])
        mounted = True
        yield where
    finally:
        if mounted:
            _umount(where)
        with contextlib.suppress(OSError):
            os.rmdir(where)


@contextlib.contextmanager
def tmpfs(size: str = "64k", nr_inodes: int | None = None, mode: str = "0755") -> Iterator[str]:
    """A tmpfs of the given size (and inode count, when given)."""
    opts = f"size={size},mode={mode}"
    if nr_inodes is not None:
        opts += f",nr_inodes={nr_inodes}"
    with _mounted(["-t", "tmpfs", "-o", opts, "tmpfs"], "pylock-tmpfs-") as d:
        yield d


@contextlib.contextmanager
def readonly_tmpfs(
    populate: Callable[[str], None] | None = None, size: str = "64k"
) -> Iterator[str]:
    """A tmpfs that ``populate(path)`` fills while writable, then remounted read-only."""
    with tmpfs(size=size) as d:
        if populate is not None:
            populate(d)
        _run(["mount", "-o", "remount,ro", d])
        yield d


@contextlib.contextmanager
def readonly_bind(source: str) -> Iterator[str]:
    """A read-only bind mount of an existing directory."""
    _need_root()
    where = tempfile.mkdtemp(prefix="pylock-robind-")
    mounted = False
    try:
        _run(["mount", "--bind", source, where])
        mounted = True
        _run(["mount", "-o", "remount,bind,ro", where])
        yield where
    finally:
        if mounted:
            _umount(where)
        with contextlib.suppress(OSError):
            os.rmdir(where)


MKFS = {"btrfs": ["mkfs.btrfs", "-q"], "ext4": ["mkfs.ext4", "-q"], "xfs": ["mkfs.xfs", "-q"]}


def mkfs_missing(kind: str) -> str | None:
    """Why a loop_filesystem(kind) cannot be made here, or None."""
    tool = MKFS[kind][0]
    return None if shutil.which(tool) else f"{tool} is not installed"


@contextlib.contextmanager
def loop_filesystem(kind: str, size: str = "300M") -> Iterator[str]:
    """A fresh kind ("btrfs", "ext4", "xfs") filesystem in an image file,
    loop-mounted (btrfs needs about 120 MiB, xfs 300 MiB)."""
    _need_root()
    image_dir = tempfile.mkdtemp(prefix=f"pylock-{kind}-img-")
    image = os.path.join(image_dir, "fs.img")
    try:
        with open(image, "wb") as f:
            f.truncate(_bytes(size))
        _run([*MKFS[kind], image])
        with _mounted(["-o", "loop", image], f"pylock-{kind}-") as d:
            os.chmod(d, 0o755)
            yield d
    finally:
        shutil.rmtree(image_dir, ignore_errors=True)


def _bytes(size: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    last = size[-1].lower()
    return int(size[:-1]) * units[last] if last in units else int(size)


@contextlib.contextmanager
def overlay(lower: str) -> Iterator[str]:
    """overlayfs with lower as its lower layer and a fresh upper layer in a
    temp directory (on /tmp's filesystem); xino as the kernel chooses."""
    _need_root()
    layers = tempfile.mkdtemp(prefix="pylock-overlay-layers-")
    upper, work = os.path.join(layers, "upper"), os.path.join(layers, "work")
    os.mkdir(upper)
    os.mkdir(work)
    try:
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
        with _mounted(["-t", "overlay", "-o", opts, "overlay"], "pylock-overlay-") as d:
            yield d
    finally:
        shutil.rmtree(layers, ignore_errors=True)


def fill_space(directory: str, name: str = "filler") -> int:
    """Write into directory until the filesystem says ENOSPC; returns bytes written."""
    written = 0
    chunk = b"\0" * 4096
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    break
                raise
            if n == 0:
                break
            written += n
        # A partial last page can still leave a few bytes free; take them too.
        while True:
            try:
                if os.write(fd, b"\0") != 1:
                    break
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    break
                raise
            written += 1
    finally:
        os.close(fd)
    return written


def exhaust_inodes(directory: str, prefix: str = "inode") -> int:
    """Create empty files until the filesystem has no inode left; returns the count."""
    n = 0
    while True:
        try:
            fd = os.open(
                os.path.join(directory, f"{prefix}{n}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
        except OSError as e:
            if e.errno == errno.ENOSPC:
                return n
            raise
        os.close(fd)
        n += 1
