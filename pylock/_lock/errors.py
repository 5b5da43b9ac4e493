"""The errors of holding a lock: who holds it (LockHeld, LockTimeout name the
holder), and a lock object used against its rules (ReentrantAcquire, NotHeld)."""

from __future__ import annotations

from .._core.display import display
from .._core.errors import LockError

TYPE_CHECKING = False  # typing is not imported at run time (start-up: bench/README.md)
if TYPE_CHECKING:
    from .holder import Holder


class LockHeld(LockError):
    """The lock is held by another owner and the caller did not (or no longer) wait.

    .path is the exact path; the message shows it, as every string in it,
    with its control characters escaped."""

    def __init__(self, path: str, holder: Holder | None, message: str | None = None):
        self.path = path
        self.holder = holder
        super().__init__(message or f"{display(path)} is held by {describe_holder(holder)}")

    def __reduce__(self) -> tuple[object, ...]:  # keeps errors intact across processes
        return (LockHeld, (self.path, self.holder, str(self)))


class LockTimeout(LockHeld, TimeoutError):
    """The lock stayed held until the timeout passed."""

    def __init__(self, path: str, holder: Holder | None, timeout: float):
        self.timeout = timeout
        super().__init__(
            path,
            holder,
            f"timed out after {timeout:g} s waiting for {display(path)}: "
            f"held by {describe_holder(holder)}",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (LockTimeout, (self.path, self.holder, self.timeout))


class ReentrantAcquire(LockError, RuntimeError):
    """The calling thread (or task) already holds this lock: waiting would deadlock."""


class NotHeld(LockError, RuntimeError):
    """release() of a lock this object does not hold."""


def describe_holder(holder: Holder | None) -> str:
    """The holder in one line for messages, or what it means that there is none."""
    if holder is None:
        return "another process (it released the lock before it could be identified)"
    return holder.describe()
