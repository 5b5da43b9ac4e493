"""The live view's terminal: one screen redrawn in place, given back as it was.

The view draws on the terminal's alternate screen (as top(1) and less(1)
do), each frame over the last from the top-left corner, every line cut to
the terminal's width and the frame to its height.  When the view ends
(Ctrl-C, a closed terminal, an error) the normal screen comes back with the
last frame printed on it, so what was seen stays in the scrollback.  A
resize redraws at once (SIGWINCH wakes the pause).
"""

from __future__ import annotations

import os
import select
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

_ENTER = "\x1b[?1049h\x1b[?25l"  # the alternate screen, cursor hidden
_LEAVE = "\x1b[?25h\x1b[?1049l"
_HOME = "\x1b[H"
_END_OF_LINE = "\x1b[K"
_BELOW = "\x1b[J"


def fit(lines: list[str], columns: int, rows: int) -> list[str]:
    """lines cut to rows lines, the last saying how many were left out, and
    to columns - 1 characters (the last column would wrap on some terminals)."""
    if len(lines) > rows > 1:
        left = len(lines) - (rows - 1)
        lines = [
            *lines[: rows - 1],
            f"... {left} more lines (--path, --pid or --user narrow the view)",
        ]
    width = max(columns - 1, 10)
    return [line if len(line) <= width else line[: width - 3] + "..." for line in lines]


class Screen:
    """The terminal on stdout while the live view runs."""

    def __init__(self) -> None:
        self._last: list[str] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._old_winch: Any = signal.signal(signal.SIGWINCH, self._resized)
        self._write(_ENTER)

    def _resized(self, signum: int, frame: FrameType | None) -> None:
        try:  # noqa: SIM105 (a full pipe already holds a wake-up)
            os.write(self._wake_w, b"w")
        except OSError:
            pass

    def draw(self, lines: list[str]) -> None:
        size = os.get_terminal_size(sys.stdout.fileno())
        self._last = lines
        shown = fit(lines, size.columns or 80, size.lines or 24)
        self._write(_HOME + (_END_OF_LINE + "\n").join(shown) + _END_OF_LINE + _BELOW)

    def pause(self, seconds: float) -> None:
        """Wait seconds, or less when the terminal is resized."""
        ready, _, _ = select.select([self._wake_r], [], [], seconds)
        if ready:
            os.read(self._wake_r, 4096)

    def close(self) -> None:
        signal.signal(signal.SIGWINCH, self._old_winch)
        os.close(self._wake_r)
        os.close(self._wake_w)
        try:  # noqa: SIM105 (the terminal may have gone away)
            self._write(_LEAVE + "".join(line + "\n" for line in self._last))
        except OSError:
            pass

    def _write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
