"""A writer blocked opening a FIFO for writing: what a lookup that opened
the FIFO to look would release (and, closing it, kill with SIGPIPE)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

WRITER = "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(fd, b'message')"


class BlockedWriter:
    """A process blocked in open(FIFO, O_WRONLY), waiting for a reader."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, fifo])
        deadline = time.monotonic() + 30
        while not self.blocked():
            assert self.proc.poll() is None, "the writer ended before it blocked"
            assert time.monotonic() < deadline, "the writer never blocked in open"
            time.sleep(0.005)  # re-reading kernel state, not standing in for a signal

    def blocked(self) -> bool:
        try:
            with open(f"/proc/{self.proc.pid}/wchan") as f:
                return f.read() == "wait_for_partner"
        except OSError:
            return False

    def delivered(self) -> bytes:
        """The control: a reader of our own lets it through; what it wrote."""
        fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            ready, _, _ = select.select([fd], [], [], 30)
            data = os.read(fd, 100) if ready else b""
        finally:
            os.close(fd)
        self.proc.wait(timeout=30)
        return data

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
