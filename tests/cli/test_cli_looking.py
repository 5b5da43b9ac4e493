"""Looking never opens a FIFO or a device: `pylock who`, `pylock list` (and
--clean), holder() and holders() answer from the kernel's tables, so a
writer blocked opening a FIFO in the directory stays blocked, and gets its
message through to the reader it was waiting for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pylock
from tests.support.cli import cli
from tests.support.fifo import BlockedWriter


@pytest.fixture
def writer(tmp_path: Path):  # type: ignore[no-untyped-def]
    fifo = str(tmp_path / "queue.lock")
    os.mkfifo(fifo)
    blocked = BlockedWriter(fifo)
    yield blocked
    blocked.close()


def test_who_and_the_api_leave_a_fifo_alone(writer: BlockedWriter) -> None:
    out = cli("who", writer.fifo)
    assert (out.returncode, out.stdout) == (1, f"{writer.fifo}: free\n"), out.stderr
    assert cli("who", "--all", "--json", writer.fifo).returncode == 1
    for look in (pylock.holders, lambda p: pylock.Lock(p).holder()):
        with pytest.raises(pylock.LockFileError):
            look(writer.fifo)
    assert writer.blocked(), "looking released the writer"
    assert writer.delivered() == b"message"
    assert writer.proc.returncode == 0


def test_list_and_clean_leave_a_fifo_alone(writer: BlockedWriter) -> None:
    directory = os.path.dirname(writer.fifo)
    for args in ([], ["--json"], ["--clean"]):
        out = cli("list", *args, directory)
        assert out.returncode == 0, out.stderr
    assert writer.blocked(), "listing released the writer"
    assert writer.delivered() == b"message"
    assert writer.proc.returncode == 0


@pytest.mark.root
def test_a_device_is_looked_at_without_being_opened(tmp_path: Path) -> None:
    """A character device with no driver behind it (major 240 is reserved for
    local use): opening it fails with ENXIO, so a `who` that opened it to
    look would fail; one that looks says it is free."""
    device = str(tmp_path / "dev")
    os.mknod(device, 0o600 | 0o020000, os.makedev(240, 0))
    with pytest.raises(OSError):
        os.close(os.open(device, os.O_RDONLY | os.O_NONBLOCK))  # the control
    out = cli("who", device)
    assert (out.returncode, out.stdout) == (1, f"{device}: free\n"), out.stderr
    out = cli("list", "--json", str(tmp_path))
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr
