"""How a pylock command ends: its exit statuses, each named once (sysexits.h,
as flock(1) uses them), Exit to leave with one, and say() for the one line
on stderr that tells why."""

from __future__ import annotations

import sys

EX_USAGE = 64  # a command line pylock cannot run
EX_DATAERR = 65  # the descriptor cannot be locked
EX_NOINPUT = 66  # the lock file cannot be opened, or a PATH cannot be inspected
EX_UNAVAILABLE = 69  # the command cannot be run; etcd unreachable or the etcd extra missing
EX_SOFTWARE = 70  # pylock's own failure: an exception nobody expected
EX_OSERR = 71  # the system refused: out of memory, of descriptors, locks
EX_CANTCREAT = 73  # the lock file cannot be created (read-only or full filesystem)


class Exit(Exception):
    """Leave the command with this status (after the message was said)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def say(text: str) -> None:
    """One line on stderr, the name the command was invoked by first
    ("pylock: "), every control character in it escaped (a path or a name
    from a shared directory cannot drive the terminal, or start a line of
    its own)."""
    from .._core.display import display
    from .invoked import name

    sys.stderr.write(f"{name}: {display(text)}\n")
    sys.stderr.flush()


def path_problem(path: str, exc: OSError) -> str:
    """Why path cannot be used, in the words of pylock.LockFileError (no
    "[Errno N]"): one wording in every command."""
    from .._core.errors import LockFileError, advice_for

    if isinstance(exc, LockFileError):
        return str(exc)
    code = exc.errno or 0
    return str(LockFileError(code, path, advice_for(code, path)))
