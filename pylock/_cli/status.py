"""One live status line on a terminal while the pylock command waits.

Shown only when stderr is a terminal, after a second of waiting: what it
waits for, who holds it, how long so far; redrawn once a second (a display
clock, not a poll: the wait itself sleeps in the kernel) and erased when the
wait ends, however it ends.
"""

from __future__ import annotations

import os
import threading
import time

from . import invoked

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

_ERASE = b"\r\x1b[K"
_SHOW_AFTER = 1.0
_REFRESH_HOLDER = 5.0


def wanted(quiet: bool) -> bool:
    return not quiet and os.isatty(2)


class StatusLine:
    """A context manager: the line appears after a second inside it and is gone after it."""

    def __init__(self, waiting_for: str, holder: Callable[[], str]) -> None:
        self._waiting_for = waiting_for
        self._holder = holder
        self._done = threading.Event()
        self._shown = False
        self._thread = threading.Thread(target=self._draw, name="pylock status", daemon=True)

    def __enter__(self) -> StatusLine:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()
        if self._shown:
            _write(_ERASE)

    def _draw(self) -> None:
        if self._done.wait(_SHOW_AFTER):
            return
        holder, looked = self._holder(), time.monotonic()
        while not self._done.is_set():
            now = time.monotonic()
            if now - looked >= _REFRESH_HOLDER:
                holder, looked = self._holder(), now
            elapsed = int(now - self._start)
            # Elapsed first: a narrow terminal cuts the end of the line.
            text = f"{invoked.name}: waiting {elapsed}s for {self._waiting_for}, held by {holder}"
            _write(_ERASE + _fit(text).encode("utf-8", "replace"))
            self._shown = True
            self._done.wait(1.0 - (time.monotonic() - self._start) % 1.0)


def _fit(text: str) -> str:
    try:
        width = os.get_terminal_size(2).columns or 80  # 0: the terminal does not say
    except OSError:
        width = 80
    return text if len(text) < width else text[: max(width - 4, 1)] + "..."


def _write(data: bytes) -> None:
    try:  # noqa: SIM105 (contextlib costs start-up time)
        os.write(2, data)
    except OSError:
        pass  # the terminal went away: the status line is only a courtesy
