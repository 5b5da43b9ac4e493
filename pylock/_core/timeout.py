"""The one timeout rule of every pylock wait, as threading.Lock has it.

None, -1 and +inf wait forever; any other number of seconds >= 0 waits that
long, however large (a wait beyond FOREVER_S, about 146 years, is a wait
without a deadline, so no conversion can overflow); other negatives and NaN
raise ValueError; what is not a real number, and a bool (True is not "one
second" but a slip for blocking=True), raises TypeError.  Deadlines
are on time.monotonic().
"""

from __future__ import annotations

import math
import time

# Waits longer than this many seconds (about 146 years) have no deadline:
# their nanoseconds would not fit the C core's int64.
FOREVER_S = float(2**62) / 1e9


def check_timeout(timeout: object) -> float | None:
    """timeout in seconds, or None to wait forever; ValueError/TypeError if invalid."""
    if timeout is None:
        return None
    if isinstance(timeout, bool):
        # threading.Lock would wait 1 s for True; here it is taken for the
        # mistake it almost always is (blocking=True meant), as filelock does.
        raise TypeError(
            f"timeout must be None or a number of seconds, not bool ({timeout}): "
            "blocking= is the argument that takes True or False"
        )
    if isinstance(timeout, (str, bytes, bytearray)) or not hasattr(timeout, "__float__"):
        kind = type(timeout).__name__
        raise TypeError(f"timeout must be None or a number of seconds, not {kind}")
    seconds = float(timeout)
    if math.isnan(seconds):
        raise ValueError("timeout must be None, -1 or a number of seconds >= 0, not nan")
    if seconds == -1 or seconds >= FOREVER_S:
        return None
    if seconds < 0:
        raise ValueError(f"timeout must be None, -1 or a number of seconds >= 0, not {timeout!r}")
    return seconds


def deadline_of(timeout: object) -> float | None:
    """The monotonic deadline of a timeout checked by check_timeout (None: none)."""
    seconds = check_timeout(timeout)
    return None if seconds is None else time.monotonic() + seconds


def seconds_left(deadline: float | None) -> float | None:
    """Seconds until deadline (>= 0), None without one."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def ns_left(deadline: float | None) -> int:
    """Nanoseconds until deadline for the C core: -1 without one, never overflowing."""
    if deadline is None:
        return -1
    left = (deadline - time.monotonic()) * 1e9
    return -1 if left >= 2**62 else max(0, int(left))
