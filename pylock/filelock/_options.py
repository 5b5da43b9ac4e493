"""filelock's option rules: what a timeout, a poll interval, a mode and the
blocking flag may be, checked as filelock checks them."""

from __future__ import annotations

import math
import stat
import warnings
from decimal import Decimal
from numbers import Real
from threading import TIMEOUT_MAX
from typing import Any, Literal, NamedTuple

# filelock's marker for "no mode given": the file is then created with
# 0o666 less the umask (and default ACLs), and `mode` reports 0o644.
UNSET_MODE = -1
DEFAULT_POLL_INTERVAL = 0.05

ContextErrorPolicy = Literal["chain", "group"]
CloseErrorPolicy = Literal["default", "raise", "suppress"]


class Wait(NamedTuple):
    """One acquisition's wait: timeout < 0 waits forever."""

    blocking: bool
    timeout: float
    poll_interval: float

    @property
    def forever(self) -> bool:
        return self.timeout < 0


def seconds(name: str, value: object) -> float:
    """value as float seconds; TypeError for what is not a number (bool included)."""
    if isinstance(value, bool) or not isinstance(value, (Real, Decimal)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if isinstance(value, Decimal) and value.is_snan():
        return math.nan
    try:
        result = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large to be a number of seconds: {value!r}") from None
    # A negative duration that rounds to zero still means "forever".
    return -math.ulp(0.0) if result == 0 and value < 0 else result


def resolve_timeout(timeout: object, blocking: bool) -> float:
    """filelock's rule: any negative number or inf waits forever (-1 here);
    NaN is refused for a blocking wait and means nothing without one."""
    value = seconds("timeout", timeout)
    if math.isnan(value) and blocking:
        raise ValueError("timeout must be a number of seconds, not nan")
    return -1.0 if value == math.inf or value < 0 else value


def resolve_poll_interval(value: object) -> float:
    interval = seconds("poll_interval", value)
    if interval < 0 or not math.isfinite(interval):
        raise ValueError(f"poll_interval must be finite and non-negative, not {interval!r}")
    if interval > TIMEOUT_MAX:
        raise ValueError(
            f"poll_interval must not exceed threading.TIMEOUT_MAX ({TIMEOUT_MAX}), got {interval!r}"
        )
    return interval


def check_blocking(blocking: object) -> bool:
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
    return blocking


def check_mode(mode: object, cls_name: str) -> int:
    if mode == UNSET_MODE:
        return UNSET_MODE
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"mode must be an int, not {type(mode).__name__}")
    if not 0 <= mode <= 0o777:
        raise ValueError(f"mode={mode:#o} must be within 0o000-0o777 for {cls_name}")
    if ~mode & (stat.S_IRUSR | stat.S_IWUSR):
        raise ValueError(f"mode={mode:#o} must grant the owner read and write for {cls_name}")
    return mode


def timeout_behavior(timeout: float) -> float | str:
    """What a timeout does, for comparing singletons' options: every
    negative waits forever alike, and NaN equals NaN."""
    if math.isnan(timeout):
        return "nan"
    return -1.0 if timeout == math.inf or timeout < 0 else timeout


def check_policies(context_error_policy: str, close_error_policy: str) -> None:
    if context_error_policy not in ("chain", "group"):
        raise ValueError(
            f"context_error_policy must be 'chain' or 'group', got {context_error_policy!r}"
        )
    if close_error_policy not in ("default", "raise", "suppress"):
        raise ValueError(
            "close_error_policy must be 'default', 'raise', or 'suppress', "
            f"got {close_error_policy!r}"
        )


def acquire_wait(
    default_timeout: float,
    default_blocking: bool,
    default_poll: float,
    timeout: object,
    poll_interval: object,
    poll_intervall: object,
    blocking: object,
) -> Wait:
    """An acquire() call's wait from its arguments and the lock's defaults
    (blocking=False wins over any timeout)."""
    if poll_intervall is not None:
        warnings.warn(
            "use poll_interval instead of poll_intervall", DeprecationWarning, stacklevel=3
        )
        if poll_interval is None:
            poll_interval = poll_intervall
    is_blocking = default_blocking if blocking is None else check_blocking(blocking)
    poll = default_poll if poll_interval is None else resolve_poll_interval(poll_interval)
    chosen = resolve_timeout(default_timeout if timeout is None else timeout, is_blocking)
    return Wait(True, chosen, poll) if is_blocking else Wait(False, 0.0, poll)


def wait_of(
    ctx: Any,
    timeout: object,
    poll_interval: object,
    poll_intervall: object,
    blocking: object,
) -> Wait:
    """acquire_wait with ctx's settings (timeout, blocking, poll_interval)
    as the defaults; without arguments, no check again (done when set)."""
    if timeout is None and poll_interval is None and poll_intervall is None and blocking is None:
        if not ctx.blocking:
            return Wait(False, 0.0, ctx.poll_interval)
        wanted = ctx.timeout
        if wanted == wanted and 0 <= wanted < math.inf:
            return Wait(True, wanted, ctx.poll_interval)
    return acquire_wait(
        ctx.timeout,
        ctx.blocking,
        ctx.poll_interval,
        timeout,
        poll_interval,
        poll_intervall,
        blocking,
    )
