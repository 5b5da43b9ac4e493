"""pylock._core.peek: a name looked at is pinned (O_PATH), so a FIFO swapped
in for a lock file while it is being looked at is never opened.  The race
is won every time: the lookup is paused exactly between its look and its
open, while the name is swapped."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import pylock
from pylock._core.peek import Peek
from tests.support.fifo import BlockedWriter


def test_a_peek_opens_only_the_regular_file_it_looked_at(tmp_path: Path) -> None:
    path = str(tmp_path / "job.lock")
    Path(path).write_bytes(b"first")
    with Peek(path) as look:
        assert look.regular
        os.rename(path, str(tmp_path / "moved"))
        os.mkfifo(path)
        writer = BlockedWriter(path)
        try:
            fd = look.open_to_read()
            try:
                assert os.read(fd, 10) == b"first"  # the file looked at, not the FIFO
            finally:
                os.close(fd)
            assert writer.blocked()
            assert writer.delivered() == b"message"
        finally:
            writer.close()
    with Peek(path) as fifo:
        assert not fifo.regular
        with pytest.raises(OSError):
            fifo.open_to_read()
    link = str(tmp_path / "link")
    os.symlink(str(tmp_path / "moved"), link)
    with Peek(link) as look:
        assert not look.regular  # the link itself, never its target


def test_holder_lookup_paused_between_look_and_open_never_opens_the_swapped_in_fifo(
    tmp_path: Path, spawn_holder: Any
) -> None:
    path = str(tmp_path / "job.lock")
    holder = spawn_holder(path, info={"first": True})
    swapped: list[BlockedWriter] = []

    def pause(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "open_to_read" and not swapped:
            # The attacker's move, while the victim is stopped at the open.
            os.rename(path, str(tmp_path / "away"))
            os.mkfifo(path)
            swapped.append(BlockedWriter(path))

    sys.setprofile(pause)
    try:
        found = pylock.Lock(path).holder()
    finally:
        sys.setprofile(None)
    assert swapped, "the lookup never reached its open: no swap happened"
    writer = swapped[0]
    try:
        assert os.path.exists(path) and not os.path.isfile(path)  # the swap happened
        assert writer.blocked(), "the lookup opened the FIFO"
        # It answered for the file it looked at: the holder and its record.
        assert found is not None and found.pid == holder.pid and found.info == {"first": True}
        assert writer.delivered() == b"message"
    finally:
        writer.close()
